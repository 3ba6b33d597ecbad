import type { MigrationLockHolder } from '../dialects/types.js';
import type { MigrateOptions, MigrationEvent } from './types.js';

const DEFAULT_LOCK_WAIT_MS = 60_000;
const DEFAULT_DDL_LOCK_TIMEOUT_MS = 10_000;

/**
 * How one `migrate` takes the migration lock: every transaction it runs (the locked status read,
 * the baseline, each migration) takes it anew through `StoreDialect.withMigrationLock`
 * (PostgreSQL: a transaction-scoped advisory lock on the schema's key; SQLite: `BEGIN IMMEDIATE`).
 */
export interface LockSettings {
  /** How long to wait for another migrator, in ms. */
  readonly waitMs: number;
  /** PostgreSQL `lock_timeout` of the DDL run under the lock, in ms (0: none). */
  readonly ddlLockTimeoutMs: number;
  /** Reports who holds the lock while waiting (a `waiting` event). */
  readonly onWaiting: (holder: MigrationLockHolder | null, waitedMs: number) => void;
}

/** The lock settings of one `migrate` call, with the defaults filled in; waiting is reported through `emit`. */
export function lockSettings(options: MigrateOptions, emit: (event: MigrationEvent) => void): LockSettings {
  return {
    waitMs: options.migrationLockWaitMs ?? options.lockTimeoutMs ?? DEFAULT_LOCK_WAIT_MS,
    ddlLockTimeoutMs: options.ddlLockTimeoutMs ?? DEFAULT_DDL_LOCK_TIMEOUT_MS,
    onWaiting: (holder, waitedMs) => emit({ type: 'waiting', holder, waitedMs }),
  };
}
