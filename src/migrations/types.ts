import type { Kysely } from 'kysely';
import type { ColumnTypes } from '../dialects/types.js';

/** What a migration receives. `db` is the migration's own transaction. */
export interface MigrationContext {
  readonly db: Kysely<any>;
  readonly types: ColumnTypes;
  /** Epoch milliseconds at the start of the run, for data backfills that compare with expiry times. */
  readonly now: number;
  /** Reports progress of long data backfills (printed by the CLI); `done` rows of `workRows`' total. */
  readonly progress: (message: string, counts?: { readonly done: number }) => void;
}

/**
 * One schema version. `up` and `down` run inside one transaction together with the history
 * row, on both dialects; both are required. They must be deterministic in the SQL they issue for
 * given query results, since the checksum is computed from that SQL.
 */
export interface MigrationDefinition {
  readonly version: number;
  readonly name: string;
  up(ctx: MigrationContext): Promise<void>;
  down(ctx: MigrationContext): Promise<void>;
  /**
   * How many rows a long `up` backfill will visit, for progress (percent, ETA). Run in the
   * migration's transaction before `up`; not part of the checksum.
   */
  readonly workRows?: (db: Kysely<any>) => Promise<number>;
}
