import type { MigrationLockHolder } from '../dialects/types.js';
import type { MigrateOptions, MigrationEvent } from './types.js';

const DEFAULT_LOCK_WAIT_MS = 60_000;
const DEFAULT_DDL_LOCK_TIMEOUT_MS = 10_000;
const DEFAULT_DDL_LOCK_ATTEMPT_MS = 100;

/**
 * How one `migrate` takes the migration lock: every transaction it runs (the locked status read,
 * the baseline, each migration, each backfill batch) takes it anew through
 * `StoreDialect.withMigrationLock` (PostgreSQL: a transaction-scoped advisory lock on the schema's
 * key; SQLite: `BEGIN IMMEDIATE`).
 */
export interface LockSettings {
  /** How long to wait for another migrator, in ms. */
  readonly waitMs: number;
  /**
   * PostgreSQL: how long a migration's DDL may keep trying for its table locks, over all its
   * attempts, in ms (0: one attempt with no `lock_timeout`).
   */
  readonly ddlLockTimeoutMs: number;
  /**
   * PostgreSQL `lock_timeout` of one attempt, in ms: while DDL waits in a table's lock queue every
   * application query on that table waits behind it, so an attempt gives up this soon, rolls back
   * and retries after a jittered pause that lets the queue drain.
   */
  readonly ddlLockAttemptMs: number;
  /** Reports who holds the lock while waiting (a `waiting` event). */
  readonly onWaiting: (holder: MigrationLockHolder | null, waitedMs: number) => void;
}

/** The lock settings of one `migrate` call, with the defaults filled in; waiting is reported through `emit`. */
export function lockSettings(options: MigrateOptions, emit: (event: MigrationEvent) => void): LockSettings {
  const ddlLockTimeoutMs = options.ddlLockTimeoutMs ?? DEFAULT_DDL_LOCK_TIMEOUT_MS;
  return {
    waitMs: options.migrationLockWaitMs ?? options.lockTimeoutMs ?? DEFAULT_LOCK_WAIT_MS,
    ddlLockTimeoutMs,
    ddlLockAttemptMs:
      ddlLockTimeoutMs === 0 ? 0 : Math.min(options.ddlLockAttemptMs ?? DEFAULT_DDL_LOCK_ATTEMPT_MS, ddlLockTimeoutMs),
    onWaiting: (holder, waitedMs) => emit({ type: 'waiting', holder, waitedMs }),
  };
}
