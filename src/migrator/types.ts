import type { DataLoss } from '../errors.js';
import type { MigrationLockHolder } from '../dialects/types.js';

export interface AppliedMigration {
  readonly version: number;
  readonly name: string;
  readonly checksum: string;
  readonly appliedAt: number;
  readonly durationMs: number;
}

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
  | { readonly type: 'waiting'; readonly waitedMs: number; readonly holder: MigrationLockHolder | null };

export interface MigrateOptions {
  /** Target version: up or down to it. Default: the latest. 0 reverts everything. */
  readonly to?: number;
  /** Adopt a database without history as being at this version (its tables are verified first). */
  readonly baseline?: number;
  /** How long to wait for another migrator to release the migration lock (default 60 000 ms). */
  readonly migrationLockWaitMs?: number;
  /** PostgreSQL `lock_timeout` for migration DDL, e.g. waiting for a table a long transaction uses (default 10 000 ms; 0 disables). */
  readonly ddlLockTimeoutMs?: number;
  /** @deprecated The old name of `migrationLockWaitMs`. */
  readonly lockTimeoutMs?: number;
  /** Allow down steps that drop tables or columns holding rows (default false: refuse, changing nothing). */
  readonly allowDataLoss?: boolean;
  readonly onEvent?: (event: MigrationEvent) => void;
  /** Epoch ms used by data backfills (default: now). */
  readonly now?: number;
}

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
  /** Tables and columns holding rows that this (down) step drops. */
  readonly destructive: readonly DataLoss[];
  /** Where a value comes from: read from the database now, or known only at run time. */
  readonly notes: readonly string[];
}
