import type { DataLoss } from '../errors.js';
import type { MigrationLockHolder } from '../dialects/types.js';

export interface AppliedMigration {
  readonly version: number;
  readonly name: string;
  readonly checksum: string;
  readonly appliedAt: number;
  readonly durationMs: number;
}

/** `store.migrationStatus()`: the applied, pending, modified and unknown migrations (the CLI's `status`). */
export interface MigrationStatus {
  /** The highest applied version, 0 for an empty database. */
  readonly currentVersion: number;
  readonly latestVersion: number;
  readonly applied: readonly AppliedMigration[];
  readonly pending: readonly { version: number; name: string }[];
  /** Applied migrations whose code changed since (checksum differs). */
  readonly modified: readonly { version: number; name: string; recordedChecksum: string; currentChecksum: string }[];
  /** In the database, not in this code. */
  readonly unknown: readonly { version: number; name: string }[];
  /** The database has taskfence tables but no history: adopt it with a baseline first. */
  readonly baselineRequired: boolean;
  /** Applied versions whose backfill has not finished (a crash, or a deploy still running it); `migrate` resumes them. */
  readonly backfills: readonly { version: number; name: string; done: number; changed: number }[];
  /**
   * Applied versions whose concurrent steps (`MigrationDefinition.concurrent`) are not all done
   * (a crash, or a deploy still running them); `migrate` resumes them.
   */
  readonly steps: readonly { version: number; name: string; done: number; total: number }[];
  /** The compatibility window: which releases may write at this schema (see `CompatibilityWindow`). */
  readonly window: CompatibilityWindow;
}

/**
 * Which taskfence releases may write to the database: the newest `minWriterRelease` of the
 * applied versions (null: any release that knows the schema), the version that set it, and
 * the release that applied the newest version.
 */
export interface CompatibilityWindow {
  readonly oldestWriterRelease: string | null;
  readonly setByVersion: number | null;
  readonly newestAppliedByRelease: string | null;
}

/** What happened during `migrate`, reported as it happens. */
export type MigrationEvent =
  | { readonly type: 'baseline'; readonly version: number }
  | { readonly type: 'applying' | 'reverting'; readonly version: number; readonly name: string }
  | {
      readonly type: 'applied' | 'reverted';
      readonly version: number;
      readonly name: string;
      readonly durationMs: number;
    }
  | { readonly type: 'skipped'; readonly version: number; readonly name: string; readonly reason: string }
  | {
      readonly type: 'progress';
      readonly version: number;
      readonly message: string;
      /** Rows done so far and, when the migration can tell, the total (see `MigrationDefinition.workRows`). */
      readonly done?: number;
      readonly total?: number;
    }
  | { readonly type: 'waiting'; readonly waitedMs: number; readonly holder: MigrationLockHolder | null }
  | {
      /** PostgreSQL: a migration's transaction gave up waiting for a table lock (`lock_timeout`) and will try again. */
      readonly type: 'lock-retry';
      readonly version: number;
      readonly name: string;
      /** The attempt that gave up (1 for the first). */
      readonly attempt: number;
      /** Since the first attempt, in ms. */
      readonly waitedMs: number;
      /** The jittered pause before the next attempt, in ms. */
      readonly delayMs: number;
    };

/** Options of `store.migrate` (and `Migrator.migrate`): the target, adoption, the lock wait and the guards. */
export interface MigrateOptions {
  /** Target version: up or down to it. Default: the latest. 0 reverts everything. */
  readonly to?: number;
  /** Adopt a database without history as being at this version (its tables are verified first). */
  readonly baseline?: number;
  /** How long to wait for another migrator to release the migration lock (default 60 000 ms). */
  readonly migrationLockWaitMs?: number;
  /**
   * PostgreSQL: how long a migration's DDL may keep trying for a table lock that another session
   * holds (a long application transaction), over all its attempts (default 10 000 ms; 0: one
   * attempt without `lock_timeout`, waiting as long as it takes).
   */
  readonly ddlLockTimeoutMs?: number;
  /**
   * PostgreSQL `lock_timeout` of one attempt (default 100 ms): while DDL waits in a table's lock
   * queue, application queries on that table queue behind it, so it gives up this soon and retries.
   */
  readonly ddlLockAttemptMs?: number;
  /**
   * Rows per backfill batch, each batch its own transaction. Given alone, every batch takes this
   * many rows; otherwise it is the most a batch takes (default 5 000) and `batchTimeMs` sizes them.
   */
  readonly batchSize?: number;
  /**
   * What each backfill batch should take, in ms: the size adapts to the time the last batch took
   * (500 rows first and at least, at most doubling, at most `batchSize`). A writer of the running release that
   * needs a row (PostgreSQL) or the write lock (SQLite) a batch holds waits about this long at most.
   * Default 100 when `batchSize` is not given, else 0 (fixed batches).
   */
  readonly batchTimeMs?: number;
  /**
   * Pause between backfill batches, in ms, to leave the database to the application. Default: 0
   * on PostgreSQL (a batch locks only its own rows); on SQLite as long as the batch itself took,
   * since each batch holds the one write lock and a waiting writer needs it free for a moment.
   */
  readonly pauseMs?: number;
  /** @deprecated The old name of `migrationLockWaitMs`. */
  readonly lockTimeoutMs?: number;
  /**
   * Migrate down even though open stores of a running release need a version above `to` (they
   * register at `openStore`; default false: refuse with `ReleaseStillRunningError`, changing nothing).
   */
  readonly force?: boolean;
  /** Allow down steps that drop tables or columns holding rows (default false: refuse, changing nothing). */
  readonly allowDataLoss?: boolean;
  readonly onEvent?: (event: MigrationEvent) => void;
  /** Epoch ms used by data backfills (default: now). */
  readonly now?: number;
}

/** What a `migrate` did: from which version to which, and the versions it applied or reverted. */
export interface MigrateResult {
  readonly fromVersion: number;
  readonly toVersion: number;
  readonly applied: readonly number[];
  readonly reverted: readonly number[];
}

export interface PlanStep {
  readonly version: number;
  readonly name: string;
  readonly direction: 'up' | 'down';
  /**
   * The statements, with their parameters inlined. With a configured PostgreSQL schema, every
   * table they name is qualified with it, exactly as `migrate` sends them.
   */
  readonly statements: readonly string[];
  /** The concurrent steps' statements, each outside any transaction after the DDL commits; empty without any. */
  readonly concurrent: readonly string[];
  /** The statements of the backfill's first batch (after the DDL commits, each batch its own transaction); empty without one. */
  readonly backfill: readonly string[];
  /** Tables and columns holding rows that this (down) step drops. */
  readonly destructive: readonly DataLoss[];
  /** Where a value comes from: read from the database now, or known only at run time. */
  readonly notes: readonly string[];
}
