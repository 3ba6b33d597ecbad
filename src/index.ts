/**
 * taskfence: the storage layer of a multi-agent orchestration backend. One schema, one
 * migration chain and repository functions whose concurrency guarantees hold on SQLite and
 * PostgreSQL alike.
 *
 * This file is the whole public API, named one by one: what the README documents, and the types
 * a caller needs to type its code. Nothing else is reachable from the package root;
 * `test/unit/exports.test.ts` fails when the runtime surface changes.
 *
 * @example
 * import { openStore } from 'taskfence';
 * const store = await openStore('sqlite:./taskfence.db');
 * await store.migrate();
 */

// The store, its transactions, events and configuration.
export { openStore, type Store, type StoreOptions } from './store.js';
export type { LeaseAuditMode } from './repositories/shared/audit.js';
export type { StoreTransaction, TransactionOptions } from './transaction.js';
export { TASKFENCE_CHANNELS, type TaskfenceEvent, type StoreStats } from './events.js';
export { defaultDatabaseUrl, parseDatabaseUrl, redactDatabaseUrl, type DatabaseLocation } from './config.js';
export type { StoreDialect, ErrorKind, DialectOptions, ColumnTypes, JoinedTransaction } from './dialects/types.js';

// Errors (README, Errors): every class a caller may catch.
export {
  TaskfenceError,
  DatabaseFaultError,
  InvalidDatabaseUrlError,
  DatabaseUnavailableError,
  StorageFullError,
  ReadOnlyError,
  PermissionDeniedError,
  CommitOutcomeUnknownError,
  LockTimeoutError,
  StatementTimeoutError,
  AlreadyExistsError,
  IdempotencyKeyConflictError,
  UnknownRecipientError,
  GateNotResolvedError,
  ResolutionAlreadyConsumedError,
  WriteTimeoutError,
  MigrationLockTimeoutError,
  MigrationChecksumMismatchError,
  UnknownMigrationsError,
  BaselineRequiredError,
  BaselineMismatchError,
  UnknownVersionError,
  MigrationFailedError,
  ReleaseOutsideWindowError,
  ReleaseStillRunningError,
  SchemaOutOfDateError,
  InvalidArgumentError,
  NotFoundError,
  MigrationHistoryDamagedError,
  DataLossError,
  TransactionReentryError,
  ForeignTransactionError,
  TransactionAbortedError,
  TransactionEndedError,
  DriverNotInstalledError,
  type DataLoss,
} from './errors.js';

// Migrations, schema description and the doctor.
export {
  Migrator,
  type AppliedMigration,
  type CompatibilityWindow,
  type MigrateOptions,
  type MigrateResult,
  type MigrationEvent,
  type MigrationStatus,
  type PlanStep,
} from './migrator/migrator.js';
export {
  MIGRATIONS,
  LATEST_VERSION,
  type MigrationDefinition,
  type MigrationContext,
  type BackfillDefinition,
  type ConcurrentStep,
  type BackfillContext,
  type BackfillBatch,
} from './migrations/index.js';
export { TASKFENCE_RELEASE } from './release.js';
export { describeSchema } from './schema/describe-schema.js';
export type {
  SchemaDescription,
  TableDescription,
  ColumnDescription,
  IndexDescription,
  ForeignKeyDescription,
} from './schema/describe.js';
export {
  runDoctor,
  formatDoctorReport,
  formatDoctorReportJson,
  type DoctorOptions,
  type DoctorTarget,
  type DoctorArea,
  type DoctorCheck,
  type DoctorReport,
  type DoctorStatus,
} from './doctor/index.js';

// The schema's types (`store.db` is a `Kysely<Database>`) and its status vocabularies.
export {
  TASK_STATUSES,
  IN_FLIGHT_STATUSES,
  type Database,
  type EpochMs,
  type Flag,
  type TaskStatus,
  type CoordinatorRunStatus,
  type DispatchStatus,
  type GateStatus,
  type MessageStatus,
  type WorkspaceMode,
  type GroupMemberRole,
  type CleanupKind,
  type CleanupResourceKind,
  type CleanupSnapshotState,
  type CompaniesTable,
  type WorkspacesTable,
  type AgentsTable,
  type ProjectsTable,
  type TasksTable,
  type TaskLeasesTable,
  type WorkspaceLocksTable,
  type CoordinatorRunsTable,
  type DispatchContextsTable,
  type DecisionGatesTable,
  type MessagesTable,
  type WorkspaceGroupsTable,
  type WorkspaceGroupMembersTable,
  type TaskEnvironmentsTable,
  type TaskCleanupAdmissionsTable,
  type CleanupSnapshotsTable,
  type PathLeasesTable,
  type MigrationHistoryTable,
  type TaskRow,
  type NewTaskRow,
  type TaskUpdate,
  type WorkspaceRow,
  type AgentRow,
  type ProjectRow,
  type CoordinatorRunRow,
  type DispatchContextRow,
  type DecisionGateRow,
  type MessageRow,
  type TaskEnvironmentRow,
  type WorkspaceGroupRow,
  type CleanupSnapshotRow,
  type PathLeaseRow,
} from './schema/database.js';

// The repository groups (`store.org`, `store.tasks`, …) and their context.
export type { Repositories } from './repositories/index.js';
export type { Clock, StoreContext } from './repositories/context.js';

// Input limits (README, Input limits).
export {
  MAX_DURATION_MS,
  MAX_ID_LENGTH,
  MAX_PAYLOAD_LENGTH,
  MAX_TEXT_LENGTH,
  MAX_WRITE_PATHS,
} from './repositories/validate.js';

// Org and tasks.
export type { Task, Project, WorkspaceRecord } from './repositories/shared/records.js';
export type { Agent, Company, OrgRepository } from './repositories/org.js';
export {
  MAX_DEPENDENCIES,
  MAX_TASK_BATCH,
  TaskDependencyRefusedError,
  type CreateTaskInput,
  type DependencyRefusal,
  type ListTasksFilter,
  type TaskDependency,
  type TaskRepository,
  type TransitionTaskInput,
} from './repositories/tasks.js';
// The work lifecycle (issue 22): the state machine as data.
export {
  DISPATCH_TRANSITIONS,
  GateOpenError,
  INITIAL_TASK_STATUSES,
  TASK_TRANSITIONS,
  TaskTransitionRefusedError,
  type InitialTaskStatus,
  type TaskTransitionRefusal,
  type Transition,
} from './repositories/shared/lifecycle.js';
export { FILESYSTEM_ROLE_PATTERN, roleImpliesFilesystem } from './domain/filesystem-roles.js';

// Run scoping (SPEC §3): runs, dispatches, gates, messages, orchestration targets.
export {
  CoordinatorRunConflictError,
  CoordinatorHandleTakenError,
  type CoordinatorRun,
  type StartCoordinatorRunInput,
  type StartedCoordinatorRun,
  type CoordinatorRunClaim,
  type CoordinatorRunHolder,
  type StoppedRunStatus,
  type ListCoordinatorRunsFilter,
  type RunRepository,
} from './repositories/runs/types.js';
export {
  CoordinatorRunNotRunningError,
  coordinatorRunLease,
  type CoordinatorRunLease,
} from './repositories/shared/running-run.js';
export {
  DISPATCH_FAILURE_LIMIT,
  TaskNotDispatchableError,
  DispatchAlreadyActiveError,
  DispatchRunMismatchError,
  DispatchNotActiveError,
  DEFAULT_DISPATCH_LEASE_TTL_MS,
  DispatchLeaseLostError,
  LEASE_EXPIRED,
  TerminalBusyError,
  type CompletedDispatch,
  type CompleteDispatchOptions,
  type NextDispatchOptions,
  type DispatchNextBatchInput,
  type DispatchNextFilter,
  type DispatchNextInput,
  type DispatchReportOptions,
  type ReclaimedDispatch,
  type Dispatch,
  type CreateDispatchInput,
  type ListDispatchesFilter,
  type EscalationTarget,
  type DispatchExitResult,
  type DispatchRepository,
} from './repositories/dispatches/types.js';
export {
  GateAlreadyResolvedError,
  type DecisionGate,
  type OpenGateInput,
  type GateRepository,
} from './repositories/gates.js';
export type { ConsumedResolution, ConsumeResolutionInput } from './repositories/gate-resume.js';
export type { TraceContext } from './repositories/shared/trace-context.js';
export {
  DEFAULT_DELIVERY_LIMIT,
  MAX_DELIVERY_LIMIT,
  MAX_MESSAGE_BATCH,
  DEFAULT_VISIBILITY_MS,
  type Message,
  type MessageDeliveryStatus,
  type ReceivedMessage,
  type SendMessageInput,
  type ReceiveOptions,
  type AckResult,
  type ReleaseOptions,
  type ReleaseResult,
  type ReceiptRefusal,
  type ReceiptRefusalReason,
  type WaitOptions,
  type MessageRepository,
} from './repositories/messages/index.js';
export { IDEMPOTENCY_WINDOW_MS, type IdempotencyOptions } from './repositories/idempotent.js';
export {
  WORKTREE_TARGET_PREFIX,
  UnresolvedTargetError,
  resolveOrchestrationTargetKey,
  resolveOrchestrationTargetKeyAsync,
  type WorktreeLookup,
  type AsyncWorktreeLookup,
} from './domain/run-targets.js';

// The one lease protocol every kind follows (README, "Leases").
export {
  LeaseLostError,
  LeaseWaitTimeoutError,
  type Lease,
  type LeaseKind,
  type LeaseClaim,
  type LeaseHolderInfo,
  type LeaseLostReason,
} from './repositories/shared/lease.js';
export { MAX_RENEW_BATCH, type LostLease, type RenewedLeases } from './repositories/shared/renew-leases.js';

// Counting semaphores (issue 21).
export {
  DEFAULT_SEMAPHORE_TTL_MS,
  MAX_SEMAPHORE_LIMIT,
  SEMAPHORE_HOLDER_REPORT_LIMIT,
  SemaphoreLeaseLostError,
  SemaphoreTimeoutError,
  type SemaphoreLease,
  type SemaphoreHolder,
  type SemaphoreBusy,
  type SemaphoreClaim,
  type AcquireSemaphoreInput,
  type AcquireSemaphoreWaitOptions,
  type SemaphoreRepository,
} from './repositories/semaphores/types.js';

// Workspace lock mode (SPEC §4): locks, leases, the lock-mode decision and dispatch.
export {
  DEFAULT_WORKSPACE_LOCK_TTL_MS,
  DEFAULT_TASK_LEASE_TTL_MS,
  StaleWorkspaceLockError,
  StaleTaskLeaseError,
  type LeaseGrant,
  type WorkspaceLock,
  type TaskLease,
  type RenewLeaseOptions,
  type WorkspaceLockHolder,
  type TaskLeaseHolder,
  type WorkspaceLockClaim,
  type TaskLeaseClaim,
  type ClaimWorkspaceLockInput,
  type ClaimTaskLeaseInput,
  type StaleTokenReason,
  type CurrentLeaseState,
  type LockRepository,
} from './repositories/shared/leases.js';
export {
  DEFAULT_DISPATCH_TTL_MS,
  WorkspaceUnresolvedError,
  type DispatchMode,
  type DispatchRunInput,
  type DispatchResult,
  type SchedulerRepository,
} from './repositories/scheduler.js';
export {
  WorkspaceConfigurationError,
  decideLockMode,
  type WorkspaceSource,
  type LockModeTask,
  type LockModeAgent,
  type LockModeProject,
  type LockModeDecision,
  type WorkspaceResolution,
  type WorkspaceConfigurationReason,
} from './domain/lock-mode.js';

// Path-scoped write leases (SPEC §5) and the write-path helpers.
export {
  DEFAULT_PATH_LEASE_TTL_MS,
  PATH_CONFLICT_REPORT_LIMIT,
  PathLeaseTimeoutError,
  PathClaimRefusedError,
  PathLeaseLostError,
  type PathLease,
  type PathLeaseGrant,
  type PathLeaseHolderInfo,
  type AcquiredPaths,
  type RenewPathLeaseOptions,
  type PathLeaseConflict,
  type AcquirePathsInput,
  type TryAcquirePathsResult,
  type AcquirePathsOptions,
  type ReleasePathsInput,
  type RenewPathsInput,
  type RenewPathsResult,
  type TaskWriteMode,
  type PathClaimResult,
  type PathClaimOptions,
  type PathTaskResult,
  type PathTaskSubmission,
  type PathClaimRefusal,
  type PathLeaseRepository,
} from './repositories/paths/types.js';
export {
  InvalidWritePathError,
  WHOLE_WORKSPACE_KEY,
  MAX_WRITE_PATH_BYTES,
  normalizeWritePath,
  keysOverlap,
  leaseKeys,
  writeSetsConflict,
} from './domain/write-paths.js';

// Ownership generations, cleanup and the cleanup barrier (SPEC §6).
export {
  OwnershipChangedError,
  CleanupInProgressError,
  StaleOwnershipError,
  CleanupClaimLostError,
  CleanupAlreadyCompletedError,
  ParentChangedError,
  type OwnedResourceKind,
} from './repositories/ownership/errors.js';
export { CleanupBarrierError } from './repositories/shared/barrier.js';
export { MAX_PENDING_CLEANUPS_LIMIT } from './repositories/ownership/index.js';
export { DEFAULT_CLEANUP_CLAIM_TTL_MS } from './repositories/ownership/types.js';
export type {
  ResourceCleanupClaim,
  TaskEnvironment,
  WorkspaceGroupMember,
  WorkspaceGroup,
  OwnershipTransfer,
  TransferEnvironmentInput,
  TransferStewardshipInput,
  CleanupSnapshot,
  CleanupAdmission,
  CleanupTarget,
  CleanupClaim,
  CleanupClaimResult,
  CleanupClaimHolder,
  DetachResult,
  OwnershipRepository,
} from './repositories/ownership/types.js';

// Retention.
export type { MaintenanceRepository, PruneOptions, PruneResult, PrunableTable } from './repositories/maintenance.js';
