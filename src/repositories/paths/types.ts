/**
 * The public types of `store.paths` (SPEC §5): path-scoped write leases, their errors and the
 * guarantee each method gives.
 */
import { TaskfenceError } from '../../errors.js';
import { WHOLE_WORKSPACE_KEY } from '../../domain/write-paths.js';
import type { TaskStatus } from '../../schema/database.js';

/** A lease key as messages show it. */
export function showKey(key: string): string {
  return key === WHOLE_WORKSPACE_KEY ? 'the whole workspace' : JSON.stringify(key);
}

/** TTL of the leases `claimTask` takes when the caller gives none. */
export const DEFAULT_PATH_LEASE_TTL_MS = 60_000;

/** At most this many conflicts are reported by a failed acquisition (the check stops there). */
export const PATH_CONFLICT_REPORT_LIMIT = 16;

/** One live lease on a key of a workspace. */
export interface PathLease {
  readonly workspaceId: string;
  /** The lease key: a normalized path, or `""` for the whole workspace. */
  readonly key: string;
  readonly holder: string;
  /** The task the lease was taken for (`claimTask`, or `acquirePaths` with `taskId`). */
  readonly taskId: string | null;
  readonly acquiredAt: number;
  readonly expiresAt: number;
}

/** A live lease of another holder that overlaps what was asked for. */
export interface PathLeaseConflict {
  readonly key: string;
  readonly holder: string;
  readonly expiresAt: number;
}

export interface AcquirePathsInput {
  readonly workspaceId: string;
  readonly holder: string;
  /** Paths to lease, reduced by `leaseKeys` (globs to their prefix; `"."`, `""` or `"*"` = the whole workspace). */
  readonly paths: readonly string[];
  readonly ttlMs: number;
  /** Tags the leases with a task, so that `submitTaskResult` releases them too. */
  readonly taskId?: string | null;
}

export type TryAcquirePathsResult =
  | { readonly acquired: true; readonly leases: readonly PathLease[] }
  | { readonly acquired: false; readonly conflicts: readonly PathLeaseConflict[] };

export interface AcquirePathsOptions {
  /** Give up after waiting this long (real time, not the store clock). */
  readonly timeoutMs: number;
  /**
   * Longest wait between two checks when no wake-up comes (default: the store's
   * `wakeFallbackMs`). A release wakes the waiter at once; a lease that merely expires announces
   * nothing, so this bounds how late its waiter notices.
   */
  readonly maxPollMs?: number;
}

export interface ReleasePathsInput {
  readonly workspaceId: string;
  readonly holder: string;
  /** Release only the holder's leases on these paths and below them; omitted = all its leases in the workspace. */
  readonly paths?: readonly string[];
}

export interface RenewPathsInput {
  readonly workspaceId: string;
  readonly holder: string;
  /**
   * Required: the paths the holder believes it holds. Renewal extends its live leases on or below
   * them and reports in `lost` every one of them it no longer holds, so a heartbeat always learns
   * that it lost a lease (expired, taken over by another holder, released or pruned).
   */
  readonly paths: readonly string[];
  readonly ttlMs: number;
}

export interface RenewPathsResult {
  /** The leases now extended to `now + ttlMs`. */
  readonly renewed: readonly PathLease[];
  /**
   * The lease keys of `paths` the holder no longer holds live (no live lease of the holder on or
   * below them): they expired, were taken over by another holder, or were released. The holder
   * must stop writing there.
   */
  readonly lost: readonly string[];
}

/** How a claimed task's write set was leased. */
export type TaskWriteMode = 'whole-workspace' | 'paths' | 'dynamic';

export type PathClaimResult =
  | { readonly claimed: true; readonly mode: TaskWriteMode; readonly leases: readonly PathLease[] }
  | { readonly claimed: false; readonly mode: TaskWriteMode; readonly conflicts: readonly PathLeaseConflict[] };

export interface PathClaimOptions {
  /** Lease TTL (default `DEFAULT_PATH_LEASE_TTL_MS`); renew with `renewPaths`. */
  readonly ttlMs?: number;
}

export interface PathTaskResult {
  readonly status: Extract<TaskStatus, 'done' | 'failed'>;
}

export interface PathTaskSubmission {
  readonly status: PathTaskResult['status'];
  /** Keys of the task's leases that were released. */
  readonly released: readonly string[];
}

/** `acquirePaths` waited `timeoutMs` and the set was still blocked; `blockers` are the last conflicts seen. */
export class PathLeaseTimeoutError extends TaskfenceError {
  readonly code = 'PATH_LEASE_TIMEOUT';
  constructor(
    readonly workspaceId: string,
    readonly holder: string,
    readonly keys: readonly string[],
    readonly timeoutMs: number,
    readonly blockers: readonly PathLeaseConflict[],
  ) {
    super(
      `Holder ${JSON.stringify(holder)} could not lease ${keys.map(showKey).join(', ')} in workspace ${workspaceId} ` +
        `within ${timeoutMs} ms; blocked by ${blockers.map((b) => `${showKey(b.key)} held by ${JSON.stringify(b.holder)}`).join(', ')}. ` +
        'Wait for those holders to release (or their leases to expire), or raise timeoutMs.',
    );
  }
}

/** Why `claimTask` or `submitTaskResult` refused. */
export type PathClaimRefusal = 'task_has_no_workspace' | 'task_finished' | 'held_by_other_holder';

/** `claimTask` / `submitTaskResult` refused: the task has no workspace, is finished, or another holder holds its leases. */
export class PathClaimRefusedError extends TaskfenceError {
  readonly code = 'PATH_CLAIM_REFUSED';
  constructor(
    readonly taskId: string,
    readonly holder: string,
    readonly reason: PathClaimRefusal,
    readonly detail: string,
  ) {
    super(`Task ${taskId} refused for holder ${JSON.stringify(holder)}: ${detail}.`);
  }
}

/** Path-scoped write leases (SPEC §5, seed 002): durable, per workspace, across processes. */
export interface PathLeaseRepository {
  /**
   * Leases every key of `paths` for `holder`, or nothing: in one write transaction (serialized
   * per workspace) it looks for live leases of other holders that overlap any key — ancestors by
   * equality, descendants by one bytewise key range, never a scan of the workspace — and only if
   * there are none writes all the leases. Keys the holder already holds are re-leased (new TTL).
   * Expired leases never block.
   *
   * @example
   * const r = await store.paths.tryAcquirePaths({ workspaceId, holder, paths: ['src/a.ts'], ttlMs: 30_000 });
   * if (!r.acquired) console.log(r.conflicts); // [{ key: 'src', holder: 'agent-2', expiresAt }]
   */
  tryAcquirePaths(input: AcquirePathsInput): Promise<TryAcquirePathsResult>;

  /**
   * Like `tryAcquirePaths`, but waits (jittered polling) until the whole set is free, then takes
   * it at once. It holds nothing while it waits, so waiters can never deadlock each other.
   * Throws `PathLeaseTimeoutError` naming the blockers after `timeoutMs`.
   *
   * @example
   * const leases = await store.paths.acquirePaths({ workspaceId, holder, paths: ['docs'], ttlMs: 30_000 }, { timeoutMs: 5_000 });
   */
  acquirePaths(input: AcquirePathsInput, options: AcquirePathsOptions): Promise<readonly PathLease[]>;

  /**
   * Deletes the holder's leases in the workspace (only those on or below `paths`, if given) and
   * returns their keys. Releasing what is not held is not an error.
   *
   * @example
   * await store.paths.releasePaths({ workspaceId, holder, paths: ['src'] });
   */
  releasePaths(input: ReleasePathsInput): Promise<{ readonly released: readonly string[] }>;

  /**
   * Extends the holder's live leases on or below `paths` (required) to now + `ttlMs`, atomically
   * with respect to acquisitions in the workspace. An expired lease is not revived: every key of
   * `paths` the holder no longer holds live is reported in `lost`, whether it expired, was taken
   * over by another holder or was released, since another holder may have the path now.
   *
   * @example
   * const { lost } = await store.paths.renewPaths({ workspaceId, holder, ttlMs: 30_000, paths: ['src'] });
   */
  renewPaths(input: RenewPathsInput): Promise<RenewPathsResult>;

  /** Live leases of a workspace (all holders, or one), ordered by key; for diagnostics and tests. An unknown workspace is a `NotFoundError`. */
  listPathLeases(filter: { readonly workspaceId: string; readonly holder?: string }): Promise<PathLease[]>;

  /** Deletes expired leases of a workspace (maintenance; they never block anyone anyway). Returns how many. */
  pruneExpiredPaths(workspaceId: string): Promise<number>;

  /**
   * Claims a task for `holder` by leasing its write set in the task's workspace, in one
   * transaction with marking it `in_progress`: `writes` omitted (null) leases the whole workspace,
   * which conflicts with every other lease there; a path list leases those paths (disjoint tasks
   * run in parallel); `[]` is dynamic mode: nothing is leased now and the holder calls
   * `acquirePaths({ …, taskId })` as it goes. Paths are normalized here (a bad stored path throws
   * `InvalidWritePathError`). On conflict nothing changes and the blockers are returned.
   *
   * @example
   * const r = await store.paths.claimTask(task.id, 'agent-1', { ttlMs: 30_000 });
   */
  claimTask(taskId: string, holder: string, options?: PathClaimOptions): Promise<PathClaimResult>;

  /**
   * Records a task's result (`done` or `failed`) and releases every lease of that task — claim
   * leases and dynamic ones taken with its `taskId` — in the same transaction. Refused with
   * `PathClaimRefusedError` if another holder holds a live lease of the task or it is already finished.
   *
   * @example
   * await store.paths.submitTaskResult(task.id, 'agent-1', { status: 'done' });
   */
  submitTaskResult(taskId: string, holder: string, result: PathTaskResult): Promise<PathTaskSubmission>;
}
