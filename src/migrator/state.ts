import { sql, type Kysely } from 'kysely';
import type { ColumnTypes } from '../dialects/types.js';
import { tableIn } from '../query/schema.js';

/**
 * Beside the history, one row per applied version: the compatibility window (the oldest release
 * that may still write, and the release that applied it) and, for a migration with a backfill,
 * the backfill's state (the cursor to resume after, the `now` it runs with, rows done and changed).
 * Written in the migration's transaction together with its history row, then by each batch.
 */
export const STATE_TABLE = 'taskfence_migration_state';

/** One version's row in `taskfence_migration_state`. */
export interface VersionState {
  readonly version: number;
  /** The oldest taskfence release that may still write at this version (null: any). */
  readonly minWriterRelease: string | null;
  /** The taskfence release that applied it. */
  readonly appliedByRelease: string;
  /** `running` until the last batch committed, then `complete`; null without a backfill. */
  readonly backfill: 'running' | 'complete' | null;
  readonly cursor: string | null;
  readonly backfillNow: number | null;
  readonly done: number;
  readonly changed: number;
}

/** Creates the state table if it is missing (inside a migration's transaction, under the migration lock). */
export async function createStateTable(trx: Kysely<any>, types: ColumnTypes): Promise<void> {
  await trx.schema
    .createTable(STATE_TABLE)
    .ifNotExists()
    .addColumn('version', 'integer', (c) => c.primaryKey())
    .addColumn('min_writer_release', 'text')
    .addColumn('applied_by_release', 'text', (c) => c.notNull())
    .addColumn('backfill', 'text')
    .addColumn('backfill_cursor', 'text')
    .addColumn('backfill_now', types.epochMs)
    .addColumn('backfill_done', types.epochMs, (c) => c.notNull().defaultTo(0))
    .addColumn('backfill_changed', types.epochMs, (c) => c.notNull().defaultTo(0))
    .addColumn('updated_at', types.epochMs, (c) => c.notNull())
    .execute();
}

interface StateRow {
  version: number | string;
  min_writer_release: string | null;
  applied_by_release: string;
  backfill: string | null;
  backfill_cursor: string | null;
  backfill_now: number | string | null;
  backfill_done: number | string;
  backfill_changed: number | string;
}

/** Every version's state (none when the table does not exist yet: a database migrated before it). */
export async function readStates(db: Kysely<any>): Promise<VersionState[]> {
  const tables = await db.introspection.getTables();
  if (!tables.some((t) => t.name === STATE_TABLE)) return [];
  const { rows } = await sql<StateRow>`select * from ${tableIn(db, STATE_TABLE)} order by version`.execute(db);
  return rows.map(toState);
}

/** One version's state, or undefined; the table must exist. */
export async function readState(db: Kysely<any>, version: number): Promise<VersionState | undefined> {
  const { rows } = await sql<StateRow>`select * from ${tableIn(db, STATE_TABLE)} where version = ${version}`.execute(
    db,
  );
  return rows[0] ? toState(rows[0]) : undefined;
}

function toState(r: StateRow): VersionState {
  return {
    version: Number(r.version),
    minWriterRelease: r.min_writer_release,
    appliedByRelease: r.applied_by_release,
    backfill: r.backfill === 'running' || r.backfill === 'complete' ? r.backfill : null,
    cursor: r.backfill_cursor,
    backfillNow: r.backfill_now === null ? null : Number(r.backfill_now),
    done: Number(r.backfill_done),
    changed: Number(r.backfill_changed),
  };
}

/** Records a version applied now (in its migration's transaction). */
export async function insertState(
  trx: Kysely<any>,
  row: {
    version: number;
    minWriterRelease: string | null;
    appliedByRelease: string;
    backfillNow: number | null;
    at: number;
  },
): Promise<void> {
  await trx
    .insertInto(STATE_TABLE)
    .values({
      version: row.version,
      min_writer_release: row.minWriterRelease,
      applied_by_release: row.appliedByRelease,
      backfill: row.backfillNow === null ? null : 'running',
      backfill_cursor: null,
      backfill_now: row.backfillNow,
      backfill_done: 0,
      backfill_changed: 0,
      updated_at: row.at,
    })
    .execute();
}

/** Records a batch (in the batch's transaction): the cursor to resume after, and the running counts. */
export async function recordBatch(
  trx: Kysely<any>,
  version: number,
  batch: { cursor: string | null; done: number; changed: number; at: number },
): Promise<void> {
  await trx
    .updateTable(STATE_TABLE)
    .set({
      backfill: batch.cursor === null ? 'complete' : 'running',
      backfill_cursor: batch.cursor,
      backfill_done: batch.done,
      backfill_changed: batch.changed,
      updated_at: batch.at,
    })
    .where('version', '=', version)
    .execute();
}

/** Forgets a version's state when it is reverted (in its down transaction); nothing if the table is missing. */
export async function deleteState(trx: Kysely<any>, version: number): Promise<void> {
  const tables = await trx.introspection.getTables();
  if (!tables.some((t) => t.name === STATE_TABLE)) return;
  await trx.deleteFrom(STATE_TABLE).where('version', '=', version).execute();
}
