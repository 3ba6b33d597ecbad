import { sql, type Kysely, type RawBuilder } from 'kysely';
import type { ColumnTypes } from '../dialects/types.js';
import { schemaOf, tableIn } from '../query/schema.js';
import type { BackfillBatch, ConcurrentStep } from './types.js';

/**
 * Online numbering of a `seq` column added to a table the running release writes (0070's
 * messages, 0090's tasks and dispatches): new rows are numbered from the DDL step on, old rows by
 * a batched backfill afterwards, and every old row ends up below every new one, in the old order
 * (created_at, id). The argument:
 *
 * 1. The DDL transaction adds `seq` (nullable) and, in the same transaction, the way new rows get
 *    one: PostgreSQL a sequence default, SQLite an `AFTER INSERT` trigger. The release still
 *    running never names `seq`, so from its commit on every inserted row has a `seq`; the rows
 *    with `seq` null are exactly those that existed at that commit (the legacy rows), L of them.
 * 2. New rows start above any number a legacy row can get, with no count under the lock:
 *    - PostgreSQL: the sequence starts at B + 1, B = heap pages × the most tuples a page can
 *      hold ((block_size − 24) / 28, MaxHeapTuplesPerPage), read from `pg_relation_size` in O(1).
 *      The DDL holds ACCESS EXCLUSIVE, so the heap holds every legacy row then: L ≤ B.
 *    - SQLite: the trigger gives a new row max(max(seq) + 1, its rowid). Rowids are distinct
 *      positive integers and a new row's is the largest, so it is at least the number of rows in
 *      the table, at least L + 1 (the legacy rows that remain, and itself).
 * 3. The backfill numbers the legacy rows 1, 2, … in (created_at, id) order: each batch takes the
 *    next `batchSize` rows with `seq` null after the cursor (the last (created_at, id) numbered
 *    and the count so far), through a partial index on (created_at, id) where `seq` is null (a
 *    concurrent step), so no batch scans the table. It numbers at most L rows: ≤ L < every new
 *    row's number. `created_at` is never updated, so no legacy row moves behind the cursor; rows
 *    deleted meanwhile only leave the numbers dense among the rest.
 * 4. The cursor is recorded in each batch's transaction, so a resumed backfill numbers exactly as
 *    an uninterrupted one. New numbers are still monotonic in insertion order (a gap between the
 *    legacy rows and the first new one is the only difference from numbering under the lock).
 * Until the backfill ends, a legacy row has no `seq`: the new release is rolled out after
 * `migrate` returns (README, Deploying).
 */

/** The backfill cursor: which table, the last (created_at, id) numbered, and how many rows were numbered. */
interface NumberingCursor {
  readonly table: string;
  readonly after: readonly [createdAt: number, id: string] | null;
  readonly numbered: number;
}

/** The partial index the backfill walks: the rows still without a number, in the old order. */
export function backfillIndexStep(table: string): ConcurrentStep {
  return {
    kind: 'create-index',
    index: `${table}_seq_backfill_idx`,
    table,
    build: (db) =>
      db.schema
        .createIndex(`${table}_seq_backfill_idx`)
        .on(table)
        .columns(['created_at', 'id'])
        .where(sql.ref('seq'), 'is', null),
  };
}

/** The name of `table`'s sequence or of `table`, as a PostgreSQL regclass literal names it (schema-qualified when the store has one). */
export function qualifiedName(db: Kysely<any>, name: string): string {
  const schema = schemaOf(db);
  return schema === undefined ? name : `"${schema}".${name}`;
}

/**
 * The DDL that numbers `table`'s new rows from its commit on (point 2 above), after `seq` was
 * added: a sequence starting above every legacy row's number (PostgreSQL), or the trigger.
 */
export async function numberNewRows(db: Kysely<any>, types: ColumnTypes, table: string): Promise<void> {
  const t = tableIn(db, table);
  if (types.nativeSequences) {
    const sequence = qualifiedName(db, `${table}_seq_seq`);
    await sql`create sequence ${tableIn(db, `${table}_seq_seq`)} owned by ${t}.seq`.execute(db);
    // B + 1: heap pages × tuples a page can hold, so no legacy row's number reaches it.
    await sql`select setval(${sql.lit(sequence)},
      (pg_relation_size(${sql.lit(qualifiedName(db, table))}::regclass) / current_setting('block_size')::bigint)
        * ((current_setting('block_size')::bigint - 24) / 28) + 1, false)`.execute(db);
    await sql`alter table ${t} alter column seq set default nextval(${sql.lit(sequence)}::regclass)`.execute(db);
  } else {
    // A new row's rowid is at least the number of rows, so it is above every legacy row's number.
    await sql`
      create trigger ${sql.raw(`${table}_seq_assign`)} after insert on ${sql.raw(table)}
      for each row when new.seq is null
      begin
        update ${sql.raw(table)} set seq = max((select coalesce(max(seq), 0) + 1 from ${sql.raw(table)}), new.rowid)
        where rowid = new.rowid;
      end`.execute(db);
  }
}

/**
 * One batch of the legacy numbering over `tables` in turn (point 3 above): the next `batchSize`
 * rows of the current table with `seq` null after the cursor, numbered from the count so far, in
 * (created_at, id) order. Returns the cursor after them, or null when the last table is done.
 */
export async function numberLegacyBatch(
  db: Kysely<any>,
  tables: readonly string[],
  batchSize: number,
  encoded: string | null,
): Promise<BackfillBatch> {
  const cursor: NumberingCursor =
    encoded === null ? { table: tables[0]!, after: null, numbered: 0 } : (JSON.parse(encoded) as NumberingCursor);
  const t = tableIn(db, cursor.table);
  const low: RawBuilder<unknown> =
    cursor.after === null ? sql`1 = 1` : sql`(created_at, id) > (${cursor.after[0]}, ${cursor.after[1]})`;
  // The batchSize-th unnumbered row after the cursor bounds this batch; none: the rest of the table.
  const boundary = await sql<{ created_at: number | string; id: string }>`
    select created_at, id from ${t} where seq is null and ${low}
    order by created_at, id limit 1 offset ${batchSize - 1}`.execute(db);
  const high = boundary.rows[0];
  const range = sql`seq is null and ${low} and ${high === undefined ? sql`1 = 1` : sql`(created_at, id) <= (${Number(high.created_at)}, ${high.id})`}`;
  const result = await sql`
    update ${t} set seq = numbered.n
    from (
      select id, ${cursor.numbered} + row_number() over (order by created_at, id) as n
      from ${t} where ${range}
    ) as numbered
    where ${t}.id = numbered.id`.execute(db);
  const changed = Number(result.numAffectedRows ?? 0n);
  const numbered = cursor.numbered + changed;
  let next: NumberingCursor | null;
  if (high !== undefined) next = { table: cursor.table, after: [Number(high.created_at), high.id], numbered };
  else {
    const following = tables[tables.indexOf(cursor.table) + 1];
    next = following === undefined ? null : { table: following, after: null, numbered: 0 };
  }
  return { cursor: next === null ? null : JSON.stringify(next), visited: changed, changed };
}

/** Rows still without a number in `tables` (for progress), by the partial index. */
export async function unnumberedRows(db: Kysely<any>, tables: readonly string[]): Promise<number> {
  let total = 0;
  for (const table of tables) {
    const { rows } = await sql<{
      n: number | string;
    }>`select count(*) as n from ${tableIn(db, table)} where seq is null`.execute(db);
    total += Number(rows[0]?.n ?? 0);
  }
  return total;
}
