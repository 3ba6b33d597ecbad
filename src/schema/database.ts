import type { ColumnType, Generated, Insertable, Selectable, Updateable } from 'kysely';

/**
 * Kysely table interfaces for the latest schema version. Type mapping, the same on both
 * dialects: ids are text, times are integer epoch milliseconds (`bigint` on PostgreSQL, read
 * back as numbers), flags are 0/1 integers, JSON is stored as text.
 */
export interface Database {
  companies: CompaniesTable;
  workspaces: WorkspacesTable;
  agents: AgentsTable;
  projects: ProjectsTable;
  tasks: TasksTable;
  task_dependencies: TaskDependenciesTable;
  task_leases: TaskLeasesTable;
  workspace_locks: WorkspaceLocksTable;
  coordinator_runs: CoordinatorRunsTable;
  dispatch_contexts: DispatchContextsTable;
  decision_gates: DecisionGatesTable;
  messages: MessagesTable;
  workspace_groups: WorkspaceGroupsTable;
  workspace_group_members: WorkspaceGroupMembersTable;
  task_environments: TaskEnvironmentsTable;
  task_cleanup_admissions: TaskCleanupAdmissionsTable;
  cleanup_snapshots: CleanupSnapshotsTable;
  path_leases: PathLeasesTable;
  path_lease_tokens: PathLeaseTokensTable;
  path_lease_claims: PathLeaseClaimsTable;
  audit_events: AuditEventsTable;
  semaphores: SemaphoresTable;
  semaphore_holders: SemaphoreHoldersTable;
  idempotency_keys: IdempotencyKeysTable;
  taskfence_migrations: MigrationHistoryTable;
}

/** Epoch milliseconds. */
export type EpochMs = number;
/** A 0/1 flag. */
export type Flag = 0 | 1;

/** Every status a task can have (`TASK_TRANSITIONS` says which moves between them are allowed). */
export const TASK_STATUSES = [
  'backlog',
  'todo',
  'ready',
  'dispatched',
  'in_progress',
  'blocked',
  'done',
  'failed',
  'cancelled',
] as const;
export type TaskStatus = (typeof TASK_STATUSES)[number];
/** "In flight" in the seeds' sense. */
export const IN_FLIGHT_STATUSES = ['dispatched', 'in_progress'] as const satisfies readonly TaskStatus[];

export type CoordinatorRunStatus = 'running' | 'completed' | 'failed' | 'cancelled';
export type DispatchStatus = 'active' | 'completed' | 'failed' | 'cancelled';
/** A gate's status as the API reports it; `timeout` is stored as `resolved` with `timed_out_at` (0096). */
export type GateStatus = 'open' | 'resolved' | 'timeout';
export type MessageStatus = 'pending' | 'delivered';
export type WorkspaceMode = 'isolated' | 'shared';
export type GroupMemberRole = 'steward' | 'member';
export type CleanupKind = 'archive' | 'delete';
export type CleanupResourceKind = 'environment' | 'group';
export type CleanupSnapshotState = 'pending' | 'claimed' | 'completed' | 'failed' | 'stale';

export interface CompaniesTable {
  id: string;
  name: string;
  created_at: EpochMs;
}

export interface WorkspacesTable {
  id: string;
  company_id: string;
  name: string;
  root_path: string | null;
  created_at: EpochMs;
}

export interface AgentsTable {
  id: string;
  company_id: string;
  name: string;
  role: string | null;
  department: string | null;
  workspace_id: string | null;
  created_at: EpochMs;
}

export interface ProjectsTable {
  id: string;
  company_id: string;
  name: string;
  primary_workspace_id: string | null;
  created_at: EpochMs;
}

export interface TasksTable {
  id: string;
  company_id: string;
  project_id: string | null;
  assignee_agent_id: string | null;
  workspace_id: string | null;
  title: string;
  description: string | null;
  status: ColumnType<TaskStatus, TaskStatus | undefined, TaskStatus>;
  created_at: EpochMs;
  updated_at: EpochMs;
  /** 0006 */
  coordinator_run_id: string | null;
  /** 0008 */
  target_key: string | null;
  /** 0052 */
  requires_filesystem: ColumnType<Flag, Flag | undefined, Flag>;
  /** 0053 */
  parent_id: string | null;
  workspace_mode: WorkspaceMode | null;
  /** 0055: JSON array of paths; null = omitted (the whole workspace). */
  writes: string | null;
  /** 0090: the insertion order (a sequence default on PostgreSQL, a trigger on SQLite). */
  seq: Generated<number>;
  /** 0090: higher is taken first by `dispatchNext`. */
  priority: ColumnType<number, number | undefined, number>;
  /** 0090: JSON text. */
  spec: ColumnType<string | null, string | null | undefined, string | null>;
  /** 0090: JSON text, set when the task finishes. */
  result: ColumnType<string | null, string | null | undefined, string | null>;
  /** 0090: why the task is `blocked` (null otherwise). */
  blocked_reason: ColumnType<string | null, string | null | undefined, string | null>;
}

/** 0090: `task_id` waits for `depends_on_id` to be `done`. */
export interface TaskDependenciesTable {
  task_id: string;
  depends_on_id: string;
  created_at: EpochMs;
}

export interface TaskLeasesTable {
  task_id: string;
  holder: string | null;
  token: Generated<number>;
  acquired_at: EpochMs | null;
  expires_at: EpochMs | null;
}

export interface WorkspaceLocksTable {
  workspace_id: string;
  holder: string | null;
  run_id: string | null;
  token: Generated<number>;
  acquired_at: EpochMs | null;
  expires_at: EpochMs | null;
}

export interface CoordinatorRunsTable {
  id: string;
  coordinator_handle: string;
  status: CoordinatorRunStatus;
  spec: string | null;
  started_at: EpochMs;
  ended_at: EpochMs | null;
  /** 0007 */
  target_key: string | null;
  heartbeat_at: EpochMs | null;
}

export interface DispatchContextsTable {
  id: string;
  task_id: string;
  agent_id: string | null;
  terminal_handle: string;
  status: DispatchStatus;
  error: string | null;
  created_at: EpochMs;
  updated_at: EpochMs;
  ended_at: EpochMs | null;
  /** 0006 */
  coordinator_run_id: string | null;
  /** 0090: the insertion order, and the dispatch lease's fencing token. */
  seq: Generated<number>;
  /** 0090: when the dispatch lease lapses unless renewed; null: no lease (legacy). */
  lease_expires_at: ColumnType<EpochMs | null, EpochMs | null | undefined, EpochMs | null>;
  /** 0097: the dispatcher's W3C trace context, a JSON object of strings; null: none. */
  trace_context: ColumnType<string | null, string | null | undefined, string | null>;
}

export interface DecisionGatesTable {
  id: string;
  task_id: string | null;
  question: string;
  /** The stored status: a timed-out gate is `resolved` with no resolution and `timed_out_at` set. */
  status: Exclude<GateStatus, 'timeout'>;
  resolution: string | null;
  created_at: EpochMs;
  resolved_at: EpochMs | null;
  /** 0006 */
  coordinator_run_id: string | null;
  /** 0072 */
  consumed_by: string | null;
  /** 0072 */
  consumed_at: EpochMs | null;
  /** 0096: when an open gate times out (`gates.expireGates`); null: never. */
  expires_at: ColumnType<EpochMs | null, EpochMs | null | undefined, EpochMs | null>;
  /** 0096: when `expireGates` timed the gate out; null: it did not. */
  timed_out_at: ColumnType<EpochMs | null, EpochMs | null | undefined, EpochMs | null>;
}

export interface MessagesTable {
  id: string;
  from_handle: string;
  to_handle: string;
  kind: string;
  payload: string | null;
  status: MessageStatus;
  created_at: EpochMs;
  delivered_at: EpochMs | null;
  /** 0070: the send order (a sequence default on PostgreSQL, a trigger on SQLite). */
  seq: Generated<number>;
  /** 0070: hand-outs so far. */
  attempts: Generated<number>;
  /** 0070: the current hand-out's receipt. */
  receipt: string | null;
  /** 0070: when the current hand-out's lease lapses (null: never handed out or released). */
  visible_at: EpochMs | null;
  /** 0070: dead-lettered at (the row stays `pending`). */
  dead_at: EpochMs | null;
  /** 0070 */
  last_error: string | null;
  /** 0097: the sender's W3C trace context, a JSON object of strings; null: none. */
  trace_context: ColumnType<string | null, string | null | undefined, string | null>;
}

/** 0071 */
export interface IdempotencyKeysTable {
  operation: string;
  key: string;
  fingerprint: string;
  outcome: string;
  created_at: EpochMs;
}

/** 0053 / 0054 */
export interface WorkspaceGroupsTable {
  id: string;
  steward_task_id: string;
  status: ColumnType<'active' | 'removed', 'active' | 'removed' | undefined, 'active' | 'removed'>;
  created_at: EpochMs;
  updated_at: EpochMs;
  ownership_generation: Generated<number>;
  cleanup_claimed_by: string | null;
  cleanup_claim_generation: number | null;
  cleanup_claim_expires_at: EpochMs | null;
}

export interface WorkspaceGroupMembersTable {
  group_id: string;
  task_id: string;
  role: GroupMemberRole;
  joined_at: EpochMs;
}

export interface TaskEnvironmentsTable {
  id: string;
  task_id: string;
  group_id: string | null;
  root_path: string;
  status: ColumnType<'active' | 'removed', 'active' | 'removed' | undefined, 'active' | 'removed'>;
  created_at: EpochMs;
  updated_at: EpochMs;
  ownership_generation: Generated<number>;
  cleanup_claimed_by: string | null;
  cleanup_claim_generation: number | null;
  cleanup_claim_expires_at: EpochMs | null;
}

export interface TaskCleanupAdmissionsTable {
  task_id: string;
  kind: CleanupKind;
  admitted_at: EpochMs;
}

export interface CleanupSnapshotsTable {
  id: string;
  task_id: string;
  resource_kind: CleanupResourceKind;
  resource_id: string;
  owner_task_id: string;
  ownership_generation: number;
  state: ColumnType<CleanupSnapshotState, CleanupSnapshotState | undefined, CleanupSnapshotState>;
  attempts: Generated<number>;
  claimed_by: string | null;
  claim_expires_at: EpochMs | null;
  last_error: string | null;
  created_at: EpochMs;
  updated_at: EpochMs;
}

/** 0055: one row per (workspace, key, holder); rows with `expires_at <= now` are dead and never block. */
export interface PathLeasesTable {
  workspace_id: string;
  /** `/` + normalized path + `/`; `/` = the whole workspace (see `encodePathLeaseKey`). Bytewise collation. */
  lease_key: string;
  holder: string;
  task_id: string | null;
  acquired_at: EpochMs;
  expires_at: EpochMs;
  /** 0095: the grant (fencing token) this row belongs to; null on rows written before 0095. */
  token: number | null;
}

/** 0095: the latest path-lease token granted in a workspace (never reset, never reused). */
export interface PathLeaseTokensTable {
  workspace_id: string;
  token: number;
  updated_at: EpochMs;
}

/** 0095: the latest `claimTask` grant of a task. */
export interface PathLeaseClaimsTable {
  task_id: string;
  workspace_id: string;
  holder: string;
  token: number;
  claimed_at: EpochMs;
}

/** 0080: the audit trail, one row per recorded act, written in the act's own transaction. */
export interface AuditEventsTable {
  id: string;
  at: EpochMs;
  /** Who acted: a lease holder, or `operator` (the dashboard's actions, with `detail.via`). */
  actor: string;
  /** What happened, e.g. `operator.release-workspace-lock`, `operator.fail-run`. */
  action: string;
  /** What it happened to: `workspace_lock`, `task_lease`, `coordinator_run`, … */
  subject_kind: string;
  subject_id: string;
  /** The fencing token involved, if any. */
  token: number | null;
  /** The ownership generation involved, if any. */
  generation: number | null;
  /** JSON: anything else worth keeping (the previous holder, the reason). */
  detail: string | null;
}

/** A counting semaphore: the latest fencing token granted for `name` (0060). */
export interface SemaphoresTable {
  name: string;
  token: number;
  updated_at: EpochMs;
  /** 0098: the `limit` of the latest grant of the name; null: none granted since 0098. */
  slot_limit: number | null;
}

/** One granted slot of a semaphore; it counts against the limit while `expires_at > now` (0060). */
export interface SemaphoreHoldersTable {
  name: string;
  token: number;
  holder: string;
  acquired_at: EpochMs;
  expires_at: EpochMs;
}

/** The migration history, kept by the migrator outside the versioned chain. */
export interface MigrationHistoryTable {
  version: number;
  name: string;
  checksum: string;
  applied_at: EpochMs;
  duration_ms: number;
}

export type TaskRow = Selectable<TasksTable>;
export type NewTaskRow = Insertable<TasksTable>;
export type TaskUpdate = Updateable<TasksTable>;
export type WorkspaceRow = Selectable<WorkspacesTable>;
export type AgentRow = Selectable<AgentsTable>;
export type ProjectRow = Selectable<ProjectsTable>;
export type CoordinatorRunRow = Selectable<CoordinatorRunsTable>;
export type DispatchContextRow = Selectable<DispatchContextsTable>;
export type DecisionGateRow = Selectable<DecisionGatesTable>;
export type MessageRow = Selectable<MessagesTable>;
export type TaskEnvironmentRow = Selectable<TaskEnvironmentsTable>;
export type WorkspaceGroupRow = Selectable<WorkspaceGroupsTable>;
export type CleanupSnapshotRow = Selectable<CleanupSnapshotsTable>;
export type PathLeaseRow = Selectable<PathLeasesTable>;
export type AuditEventRow = Selectable<AuditEventsTable>;
