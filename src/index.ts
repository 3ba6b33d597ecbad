/**
 * taskfence: the storage layer of a multi-agent orchestration backend. One schema, one
 * migration chain and repository functions whose concurrency guarantees hold on SQLite and
 * PostgreSQL alike.
 *
 * @example
 * import { openStore } from 'taskfence';
 * const store = await openStore('sqlite:./taskfence.db');
 * await store.migrate();
 */
export { openStore, type Store, type StoreOptions } from './store.js';
export type { StoreTransaction, TransactionOptions } from './transaction.js';
export { TASKFENCE_CHANNELS, type TaskfenceEvent, type StoreStats } from './events.js';
export { defaultDatabaseUrl, parseDatabaseUrl, redactDatabaseUrl, type DatabaseLocation } from './config.js';
export * from './errors.js';
export type { StoreDialect, ErrorKind, DialectOptions, ColumnTypes } from './dialects/types.js';
export {
  Migrator,
  type AppliedMigration,
  type MigrateOptions,
  type MigrateResult,
  type MigrationEvent,
  type MigrationStatus,
  type PlanStep,
} from './migrator/migrator.js';
export { MIGRATIONS, LATEST_VERSION, type MigrationDefinition, type MigrationContext } from './migrations/index.js';
export { describeSchema } from './schema/describe-schema.js';
export {
  runDoctor,
  formatDoctorReport,
  formatDoctorReportJson,
  type DoctorOptions,
  type DoctorTarget,
} from './doctor/index.js';
export type { DoctorArea, DoctorCheck, DoctorReport, DoctorStatus } from './doctor/index.js';
export type {
  SchemaDescription,
  TableDescription,
  ColumnDescription,
  IndexDescription,
  ForeignKeyDescription,
} from './schema/describe.js';
export * from './schema/database.js';
export type { Clock } from './repositories/context.js';
export type { Repositories } from './repositories/index.js';
export type { Task, CreateTaskInput, ListTasksFilter, TaskRepository } from './repositories/tasks.js';
export type { Agent, Company, Project, WorkspaceRecord, OrgRepository } from './repositories/org.js';
export { FILESYSTEM_ROLE_PATTERN, roleImpliesFilesystem } from './domain/filesystem-roles.js';
export type { StoreContext } from './repositories/context.js';
export {
  MAX_DURATION_MS,
  MAX_ID_LENGTH,
  MAX_PAYLOAD_LENGTH,
  MAX_TEXT_LENGTH,
  MAX_WRITE_PATHS,
} from './repositories/validate.js';
// Each area's public functions, types and errors (SPEC §3–§6).
export * from './repositories/runs.js';
export * from './repositories/dispatches.js';
export * from './repositories/gates.js';
export * from './repositories/messages.js';
export * from './domain/run-targets.js';
export * from './repositories/locks.js';
export * from './repositories/scheduler.js';
export * from './domain/lock-mode.js';
export * from './repositories/paths.js';
export * from './domain/write-paths.js';
export * from './repositories/ownership.js';
export type { MaintenanceRepository, PruneOptions, PruneResult, PrunableTable } from './repositories/maintenance.js';
