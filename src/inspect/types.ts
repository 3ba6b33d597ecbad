/**
 * What `taskfence inspect` (and the dashboard) shows: one consistent picture of who holds what,
 * read in one read transaction. Times are epoch ms on the store's clock; `…LeftMs` and `…AgeMs`
 * are relative to `at`, the clock reading the snapshot was taken at.
 */
import type {
  CleanupKind,
  CleanupResourceKind,
  CleanupSnapshotState,
  CoordinatorRunStatus,
  DispatchStatus,
  GateStatus,
  TaskStatus,
} from '../schema/database.js';

/** Options of `inspectStore` and `taskfence inspect`. */
export interface InspectOptions {
  /** A running run whose last heartbeat (or start) is older than this is flagged stale (default 60 000 ms). */
  readonly staleAfterMs?: number;
  /** At most this many rows per list (default 200); the section's `total` says how many there are. */
  readonly limit?: number;
}

/**
 * The sections of a snapshot; `inspect --json` prints one object with exactly these keys. Each
 * section carries `at`, the store clock's reading the whole snapshot was taken at.
 */
export interface InspectSnapshot {
  readonly runs: RunsSection;
  readonly dispatches: DispatchesSection;
  readonly locks: LocksSection;
  readonly paths: PathsSection;
  readonly semaphores: SemaphoresSection;
  readonly inbox: InboxSection;
  readonly ownership: OwnershipSection;
  readonly readyQueue: ReadyQueueSection;
}

/** A list capped at `limit` rows; `total` counts them all. */
export interface Capped<T> {
  readonly total: number;
  readonly items: readonly T[];
}

export interface RunView {
  readonly id: string;
  readonly targetKey: string | null;
  readonly coordinatorHandle: string;
  readonly status: CoordinatorRunStatus;
  readonly startedAt: number;
  readonly endedAt: number | null;
  readonly heartbeatAt: number | null;
  /** `at` minus the last heartbeat (or the start, before the first heartbeat). */
  readonly heartbeatAgeMs: number;
  /** Running, and its heartbeat is older than `staleAfterMs`: `reconcileStaleRuns` would fail it. */
  readonly stale: boolean;
  /** Tasks the run owns, by status. */
  readonly tasks: Readonly<Partial<Record<TaskStatus, number>>>;
}

/** What every section carries: when it was read (the same reading for the whole snapshot). */
export interface SectionStamp {
  readonly at: number;
}

/** Running runs, one per target, then the most recently ended ones. */
export interface RunsSection extends SectionStamp {
  /** The threshold `stale` was judged on. */
  readonly staleAfterMs: number;
  readonly running: Capped<RunView>;
  readonly recentlyEnded: Capped<RunView>;
}

export interface DispatchView {
  readonly id: string;
  readonly terminalHandle: string;
  readonly taskId: string;
  readonly taskTitle: string;
  readonly taskStatus: TaskStatus;
  readonly coordinatorRunId: string | null;
  readonly agentId: string | null;
  readonly createdAt: number;
  readonly ageMs: number;
  /** The task lease the dispatch was sent under, if one is held. */
  readonly lease: {
    readonly holder: string;
    readonly token: number;
    readonly expiresAt: number;
    readonly leftMs: number;
  } | null;
}

/** Active dispatches, by terminal (a terminal has at most one). */
export interface DispatchesSection extends SectionStamp {
  readonly active: Capped<DispatchView>;
}

export interface LeaseView {
  readonly holder: string;
  readonly token: number;
  readonly acquiredAt: number | null;
  readonly expiresAt: number;
  /** Negative once expired: the holder lost it, and the next claim takes it (bumping the token). */
  readonly leftMs: number;
  readonly expired: boolean;
}

export interface WorkspaceLockView extends LeaseView {
  readonly workspaceId: string;
  readonly runId: string | null;
}

export interface TaskLeaseView extends LeaseView {
  readonly taskId: string;
}

/** Held workspace locks and task leases (released ones are not shown), soonest to expire first. */
export interface LocksSection extends SectionStamp {
  readonly workspaces: Capped<WorkspaceLockView>;
  readonly tasks: Capped<TaskLeaseView>;
}

/** One live path lease at a node of the tree. */
export interface PathHolderView {
  readonly holder: string;
  readonly taskId: string | null;
  readonly expiresAt: number;
  readonly leftMs: number;
}

/** A node of a workspace's path-lease tree: a path segment, the leases on exactly it, and the paths below. */
export interface PathNode {
  /** The segment (`''` at the root, the whole workspace). */
  readonly name: string;
  /** The workspace-relative path (`''` at the root). */
  readonly path: string;
  readonly leases: readonly PathHolderView[];
  readonly children: readonly PathNode[];
}

export interface WorkspacePaths {
  readonly workspaceId: string;
  /** Live leases in the workspace. */
  readonly live: number;
  /** Expired rows not yet pruned (they block nothing). */
  readonly expired: number;
  readonly tree: PathNode;
}

/** Live path leases per workspace, as a tree. */
export interface PathsSection extends SectionStamp {
  readonly workspaces: Capped<WorkspacePaths>;
}

/** Whether a resource's cleanup claim is live, expired (reclaimable), or absent. */
export type CleanupClaimState = 'none' | 'claimed' | 'claim-expired';

export interface OwnedResourceView {
  readonly kind: CleanupResourceKind;
  readonly id: string;
  /** The owning task (an environment's task, a group's steward). */
  readonly ownerTaskId: string;
  readonly status: 'active' | 'removed';
  readonly generation: number;
  readonly cleanup: CleanupClaimState;
  readonly cleanupClaimedBy: string | null;
  readonly cleanupClaimLeftMs: number | null;
}

export interface CleanupSnapshotView {
  readonly id: string;
  readonly taskId: string;
  readonly resourceKind: CleanupResourceKind;
  readonly resourceId: string;
  readonly generation: number;
  readonly state: CleanupSnapshotState;
  readonly attempts: number;
  readonly claimedBy: string | null;
  readonly lastError: string | null;
}

/** Ownership resources with generation and cleanup state; cleanup admissions and unfinished snapshots. */
export interface OwnershipSection extends SectionStamp {
  readonly resources: Capped<OwnedResourceView>;
  readonly admissions: Capped<{ readonly taskId: string; readonly kind: CleanupKind; readonly admittedAt: number }>;
  /** Snapshots not completed (pending, claimed, failed, stale). */
  readonly snapshots: Capped<CleanupSnapshotView>;
}

export interface InboxView {
  readonly handle: string;
  /** Pending messages not dead: what `countPendingMessages` counts. */
  readonly depth: number;
  /** Of `depth`: handed out now, their lease still live (`visible_at > at`). */
  readonly inFlight: number;
  /** Of `depth`, not dead: handed out more than once (a receiver took it and did not ack in time). */
  readonly redelivered: number;
  /** Dead-lettered (handed out `maxAttempts` times without an ack), not in `depth`; `requeueDeadMessages` revives them. */
  readonly dead: number;
  /** When the oldest message of `depth` was sent; null when only dead messages are left. */
  readonly oldestAt: number | null;
  readonly oldestAgeMs: number | null;
}

/** A dead-lettered message, for the operator to requeue. */
export interface DeadMessageView {
  readonly id: string;
  readonly handle: string;
  readonly from: string;
  readonly kind: string;
  readonly attempts: number;
  readonly deadAt: number;
  readonly deadAgeMs: number;
  readonly lastError: string | null;
}

/** Inboxes with pending or dead messages, deepest first, and the dead messages, most recently dead first. */
export interface InboxSection extends SectionStamp {
  readonly inboxes: Capped<InboxView>;
  /** Pending messages (not dead) in all inboxes. */
  readonly pendingTotal: number;
  readonly redeliveredTotal: number;
  readonly deadTotal: number;
  readonly dead: Capped<DeadMessageView>;
}

/** One live slot of a semaphore. */
export interface SemaphoreSlotView {
  readonly holder: string;
  readonly token: number;
  readonly acquiredAt: number;
  readonly expiresAt: number;
  readonly leftMs: number;
}

export interface SemaphoreView {
  readonly name: string;
  /** Live slots (`expires_at > at`): what counts against the limit. */
  readonly held: number;
  /**
   * The `limit` of the name's latest grant (schema 0098): each `acquire` is judged by the limit
   * it passes, so callers of one name should agree. Null: nothing granted since 0098.
   */
  readonly limit: number | null;
  /** Slots expired but not yet reclaimed (they count for nothing; the next acquire deletes them). */
  readonly expired: number;
  /** The latest fencing token granted for the name. */
  readonly token: number;
  /** The live slots, soonest to free first (at most `limit` of the inspect options). */
  readonly slots: readonly SemaphoreSlotView[];
}

/** Semaphores with live or unreclaimed slots, fullest first. */
export interface SemaphoresSection extends SectionStamp {
  readonly semaphores: Capped<SemaphoreView>;
}

/** A task of the ready queue. */
export interface QueuedTaskView {
  readonly id: string;
  readonly title: string;
  readonly status: TaskStatus;
  readonly coordinatorRunId: string | null;
  readonly targetKey: string | null;
  readonly createdAt: number;
  /** `at` minus the task's last status change (`updated_at`). */
  readonly waitingMs: number;
}

/** A task held back by dependencies that are not `done`. */
export interface DependencyBlockedTaskView extends QueuedTaskView {
  /** How many of its dependencies are not done. */
  readonly openDependencies: number;
  /** The first few of them (id and status), oldest first. */
  readonly waitingOn: readonly { readonly id: string; readonly status: TaskStatus }[];
}

/** A task held back by an open gate. */
export interface GateBlockedTaskView extends QueuedTaskView {
  readonly gates: readonly { readonly id: string; readonly question: string; readonly openForMs: number }[];
}

/**
 * The ready queue: tasks that the next dispatch can take, and unfinished tasks held back by a
 * dependency that is not done or by an open gate. A task behind both is listed under both.
 */
export interface ReadyQueueSection extends SectionStamp {
  /**
   * Whether this database records dependencies (the `task_dependencies` table). When it does
   * not, `blockedByDependency` is empty because nothing can block a task that way.
   */
  readonly dependenciesTracked: boolean;
  /** Status `ready`, no open gate, every dependency done: in `dispatchNext` order (highest priority, then oldest). */
  readonly ready: Capped<QueuedTaskView>;
  /** Not finished and not in flight, with a dependency that is not done: longest waiting first. */
  readonly blockedByDependency: Capped<DependencyBlockedTaskView>;
  /** Not finished, with an open gate: longest waiting first. */
  readonly blockedByGate: Capped<GateBlockedTaskView>;
}

/** `inspect task <id>`: why a task is where it is. */
export interface TaskExplanation {
  readonly at: number;
  readonly task: {
    readonly id: string;
    readonly title: string;
    readonly status: TaskStatus;
    readonly workspaceId: string | null;
    readonly targetKey: string | null;
    readonly coordinatorRunId: string | null;
    readonly parentId: string | null;
    readonly requiresFilesystem: boolean;
    /** Declared write paths; null = the whole workspace. */
    readonly writes: readonly string[] | null;
    readonly createdAt: number;
    readonly updatedAt: number;
  };
  /**
   * What the task depends on (id and status), oldest first; null where this database records no
   * dependencies (no `task_dependencies` table).
   */
  readonly dependencies: readonly { readonly id: string; readonly status: TaskStatus }[] | null;
  /** The owning run, if any. */
  readonly run: { readonly id: string; readonly status: CoordinatorRunStatus; readonly heartbeatAgeMs: number } | null;
  readonly gates: readonly {
    readonly id: string;
    readonly question: string;
    readonly status: GateStatus;
    readonly resolution: string | null;
    readonly createdAt: number;
  }[];
  /** Every dispatch of the task, oldest first. */
  readonly dispatches: readonly {
    readonly id: string;
    readonly terminalHandle: string;
    readonly status: DispatchStatus;
    readonly error: string | null;
    readonly coordinatorRunId: string | null;
    readonly createdAt: number;
    readonly endedAt: number | null;
  }[];
  readonly leases: {
    readonly task: TaskLeaseView | null;
    /** Held workspace locks on the task's own workspace (whoever holds it) or held for its run. */
    readonly workspaces: readonly WorkspaceLockView[];
    /** Path leases held for this task. */
    readonly paths: readonly (PathHolderView & { readonly workspaceId: string; readonly path: string })[];
  };
  readonly ownership: {
    readonly resources: readonly OwnedResourceView[];
    readonly cleanupAdmission: CleanupKind | null;
  };
  /** Sentences, most decisive first, that say why the task is where it is. */
  readonly reasons: readonly string[];
}

/** A run's tasks and dispatches over time, for the dashboard's timeline and task graph. */
export interface RunTimeline {
  readonly at: number;
  readonly run: RunView;
  /** The run's tasks, oldest first; `parentId` links a subtask to its parent. */
  readonly tasks: readonly {
    readonly id: string;
    readonly title: string;
    readonly status: TaskStatus;
    readonly parentId: string | null;
    readonly createdAt: number;
    readonly updatedAt: number;
  }[];
  /** The run's dispatches, oldest first; `endedAt` null while active. */
  readonly dispatches: readonly {
    readonly id: string;
    readonly taskId: string;
    readonly terminalHandle: string;
    readonly status: DispatchStatus;
    readonly createdAt: number;
    readonly endedAt: number | null;
  }[];
  /**
   * The dependency edges (`task_dependencies`) of the run's tasks: `taskId` waits for
   * `dependsOnId` to be done. The dashboard's task graph draws these; `dependsOnId` may be a task
   * of another run (not in `tasks`).
   */
  readonly dependencies: readonly { readonly taskId: string; readonly dependsOnId: string }[];
}
