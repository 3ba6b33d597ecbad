import type { CompiledQuery, Kysely } from 'kysely';
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

/** What one batch of a backfill receives. `db` is the batch's own transaction. */
export interface BackfillContext {
  readonly db: Kysely<any>;
  readonly types: ColumnTypes;
  /**
   * Epoch ms recorded when the backfill started: the same in every batch, and after a crash and a
   * resume, so a resumed backfill changes exactly the rows a run without the crash would have.
   */
  readonly now: number;
  /** Rows per batch (`--batch-size`). */
  readonly batchSize: number;
}

/** What one backfill batch did. */
export interface BackfillBatch {
  /** Where the next batch starts (exclusive), or null when this was the last batch. */
  readonly cursor: string | null;
  /** Rows this batch visited (for progress). */
  readonly visited: number;
  /** Rows this batch changed. */
  readonly changed: number;
}

/**
 * A data backfill that runs after the migration's DDL has committed, one batch per transaction,
 * so the running release keeps reading and writing the table in between. The migrator records
 * the cursor after every batch (in the batch's transaction), so a crash resumes where it stopped.
 * Each batch must be correct when run again over rows an earlier batch already changed.
 */
export interface BackfillDefinition {
  /** One batch after `cursor` (null: from the start). Deterministic in the SQL it issues for given query results. */
  batch(ctx: BackfillContext, cursor: string | null): Promise<BackfillBatch>;
  /** How many rows the backfill will visit, for progress (percent, ETA). Not part of the checksum. */
  readonly workRows?: (db: Kysely<any>) => Promise<number>;
  /** The progress line once it is complete, from the rows changed over all batches. */
  readonly summary?: (changed: number) => string;
}

/**
 * A step that runs after the migration's DDL transaction commits (and before its backfill),
 * outside that transaction, taking no lock that blocks the running release's reads or writes.
 * The migrator records each step once it is done, so a crash between steps resumes at the next;
 * each is idempotent besides (run again, it finds its work done and does nothing).
 * - `create-index`: PostgreSQL `CREATE INDEX CONCURRENTLY` (an INVALID index that a killed build
 *   left behind is dropped, concurrently, and built again); SQLite: the plain `CREATE INDEX` in a
 *   short transaction of its own (WAL readers go on; writers wait for the build).
 * - `validate-constraint`: PostgreSQL `ALTER TABLE … VALIDATE CONSTRAINT` of a constraint the DDL
 *   step added `NOT VALID` (SHARE UPDATE EXCLUSIVE: writes go on); nothing on SQLite, whose CHECK
 *   sits on the column and is checked when the column is added.
 */
export type ConcurrentStep =
  | {
      readonly kind: 'create-index';
      readonly index: string;
      readonly table: string;
      /** The index as a plain `db.schema.createIndex(…)` builder; the migrator adds `CONCURRENTLY` on PostgreSQL. */
      readonly build: (db: Kysely<any>) => { compile(): CompiledQuery };
    }
  | { readonly kind: 'validate-constraint'; readonly table: string; readonly constraint: string };

/**
 * One schema version. `up` and `down` run inside one transaction together with the history
 * row, on both dialects; both are required. They must be deterministic in the SQL they issue for
 * given query results, since the checksum is computed from that SQL (and from `backfill`'s first
 * batch). See docs/development.md for the online rules every migration from 0057 on follows.
 */
export interface MigrationDefinition {
  readonly version: number;
  readonly name: string;
  /**
   * Online rules (docs/development.md) this migration breaks on purpose, each with the reason and
   * what it costs a running release. The lint passes them and lists them; not part of the checksum.
   */
  readonly onlineExceptions?: readonly { readonly rule: string; readonly reason: string }[];
  up(ctx: MigrationContext): Promise<void>;
  down(ctx: MigrationContext): Promise<void>;
  /**
   * How many rows a long `up` backfill will visit, for progress (percent, ETA). Run in the
   * migration's transaction before `up`; not part of the checksum.
   */
  readonly workRows?: (db: Kysely<any>) => Promise<number>;
  /**
   * Steps run after `up` commits and before the backfill, each outside any transaction
   * (`ConcurrentStep`): indexes on tables the running release writes, and the validation of
   * constraints `up` added `NOT VALID`. Part of the checksum.
   */
  readonly concurrent?: readonly ConcurrentStep[];
  /** A data backfill run after `up` commits, in batches of their own transactions (see `BackfillDefinition`). */
  readonly backfill?: BackfillDefinition;
  /**
   * Checksums an earlier taskfence recorded for this same migration when it ran the same change
   * another way (0052's backfill inside its DDL transaction), by dialect: a database that applied
   * it then is accepted, not refused as edited. Each entry is documented where it is declared.
   */
  readonly acceptedChecksums?: { readonly sqlite?: readonly string[]; readonly postgres?: readonly string[] };
  /**
   * The oldest taskfence release that may still write to the database once this version is
   * applied (the compatibility window; default: any release that knows the previous version).
   * `openStore` of an older release refuses with `ReleaseOutsideWindowError`.
   */
  readonly minWriterRelease?: string;
  /**
   * PostgreSQL: the functions `up` creates in the store's schema (by name). `doctor` reports one
   * missing at a later version as drift; `down` drops them.
   */
  readonly functions?: readonly string[];
}
