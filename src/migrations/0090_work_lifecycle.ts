import { sql, type Kysely } from 'kysely';
import { schemaOf, tableIn } from '../query/schema.js';
import type { MigrationDefinition } from './types.js';

/** Legacy rows numbered per backfill statement. */
const BACKFILL_BATCH = 1_000;

/** The two tables that get an insertion order. */
const SEQUENCED = ['tasks', 'dispatch_contexts'] as const;
type Sequenced = (typeof SEQUENCED)[number];

/** The sequence behind `<table>.seq` on PostgreSQL, as `nextval` names it (schema-qualified when the store has one). */
function sequenceName(db: Kysely<any>, table: Sequenced): string {
  const schema = schemaOf(db);
  return schema === undefined ? `${table}_seq_seq` : `"${schema}".${table}_seq_seq`;
}

/**
 * The work lifecycle (issue 22):
 * - `seq` on tasks and dispatches: a monotonic insertion number, the only order "oldest first"
 *   and "newest" are read in (never a timestamp plus a random id). PostgreSQL: a sequence
 *   default; SQLite: an `AFTER INSERT` trigger takes max + 1 (writers are serialized by
 *   `BEGIN IMMEDIATE`). Legacy rows are numbered in batches in their old order (created_at, id),
 *   below every new row.
 * - `dispatch_contexts_one_active_per_terminal`: a partial unique index, at most one active
 *   dispatch per terminal. Legacy terminals with several active dispatches keep the newest; the
 *   older ones are failed ("superseded") and their tasks, left with no active dispatch, go back
 *   to `ready`.
 * - `lease_expires_at` on dispatches: the dispatch lease (null for legacy dispatches: no expiry).
 *   The fencing token is the dispatch's `seq`.
 * - `priority` (default 0), `spec` and `result` (JSON text) and `blocked_reason` on tasks.
 * - `task_dependencies` (task_id depends on depends_on_id) and the ready-queue index
 *   (run, status, priority, seq).
 */
export const migration0090: MigrationDefinition = {
  version: 90,
  name: 'work_lifecycle',
  onlineExceptions: [
    {
      rule: 'index-on-existing-table',
      reason:
        'the seq, ready-queue, lease-expiry and one-active-per-terminal indexes are built in the DDL ' +
        'transaction: writes to tasks and dispatch_contexts wait for the build (the migrator has no ' +
        'concurrent step yet); reads go on',
    },
    {
      rule: 'data-change-in-ddl-step',
      reason:
        'legacy tasks and dispatches are numbered inside the DDL transaction, in batches of 1 000, before ' +
        'the sequences start above them, and duplicate active dispatches of one terminal are ended there ' +
        'so the unique index can be built; writes to both tables wait for it',
    },
  ],
  async up({ db, types }) {
    const ms = types.epochMs;
    const tasks = tableIn(db, 'tasks');
    const dispatches = tableIn(db, 'dispatch_contexts');
    await db.schema.alterTable('tasks').addColumn('seq', 'bigint').execute();
    await db.schema
      .alterTable('tasks')
      .addColumn('priority', 'integer', (c) => c.notNull().defaultTo(0))
      .execute();
    await db.schema.alterTable('tasks').addColumn('spec', 'text').execute();
    await db.schema.alterTable('tasks').addColumn('result', 'text').execute();
    await db.schema.alterTable('tasks').addColumn('blocked_reason', 'text').execute();
    await db.schema.alterTable('dispatch_contexts').addColumn('seq', 'bigint').execute();
    await db.schema.alterTable('dispatch_contexts').addColumn('lease_expires_at', ms).execute();

    for (const table of SEQUENCED) {
      const t = tableIn(db, table);
      // Number the legacy rows in their old order, in batches.
      for (;;) {
        const result = await sql`
          update ${t} set seq = numbered.n
          from (
            select id, row_number() over (order by created_at, id)
                       + (select coalesce(max(seq), 0) from ${t}) as n
            from ${t} where seq is null
            order by created_at, id
            limit ${sql.lit(BACKFILL_BATCH)}
          ) as numbered
          where ${t}.id = numbered.id`.execute(db);
        if (Number(result.numAffectedRows ?? 0) < BACKFILL_BATCH) break;
      }
      if (types.nativeSequences) {
        const name = sequenceName(db, table);
        await sql`create sequence ${tableIn(db, `${table}_seq_seq`)} owned by ${t}.seq`.execute(db);
        await sql`select setval(${sql.lit(name)}, coalesce((select max(seq) from ${t}), 0) + 1, false)`.execute(db);
        await sql`alter table ${t} alter column seq set default nextval(${sql.lit(name)}::regclass)`.execute(db);
      } else {
        await sql`
          create trigger ${sql.raw(`${table}_seq_assign`)} after insert on ${sql.raw(table)}
          for each row when new.seq is null
          begin
            update ${sql.raw(table)} set seq = (select coalesce(max(seq), 0) + 1 from ${sql.raw(table)}) where rowid = new.rowid;
          end`.execute(db);
      }
      await db.schema.createIndex(`${table}_seq_idx`).on(table).column('seq').unique().execute();
    }

    // Legacy terminals with several active dispatches: the newest stays, the others end.
    await sql`
      update ${dispatches} set status = 'failed', error = 'superseded: one active dispatch per terminal (migration 0090)',
        ended_at = updated_at
      where status = 'active' and exists (
        select 1 from ${dispatches} newer
        where newer.terminal_handle = ${dispatches}.terminal_handle and newer.status = 'active'
          and newer.seq > ${dispatches}.seq)`.execute(db);
    await sql`
      update ${tasks} set status = 'ready'
      where status in ('dispatched', 'in_progress')
        and exists (select 1 from ${dispatches} d where d.task_id = ${tasks}.id
          and d.error = 'superseded: one active dispatch per terminal (migration 0090)')
        and not exists (select 1 from ${dispatches} d where d.task_id = ${tasks}.id and d.status = 'active')`.execute(
      db,
    );
    await db.schema
      .createIndex('dispatch_contexts_one_active_per_terminal')
      .on('dispatch_contexts')
      .column('terminal_handle')
      .unique()
      .where(sql.ref('status'), '=', sql.lit('active'))
      .execute();
    // Reclaiming: the active dispatches whose lease lapsed.
    await db.schema
      .createIndex('dispatch_contexts_lease_idx')
      .on('dispatch_contexts')
      .columns(['status', 'lease_expires_at'])
      .execute();
    // The ready queue: a run's ready tasks, highest priority first, then oldest, in index order,
    // so dispatchNext reads the first rows instead of sorting a priority group.
    await db.schema
      .createIndex('tasks_ready_queue_idx')
      .on('tasks')
      .columns(['coordinator_run_id', 'status', 'priority desc', 'seq'])
      .execute();

    await db.schema
      .createTable('task_dependencies')
      .addColumn('task_id', 'text', (c) => c.notNull().references('tasks.id').onDelete('cascade'))
      .addColumn('depends_on_id', 'text', (c) => c.notNull().references('tasks.id').onDelete('cascade'))
      .addColumn('created_at', ms, (c) => c.notNull())
      .addPrimaryKeyConstraint('task_dependencies_pkey', ['task_id', 'depends_on_id'])
      .addCheckConstraint('task_dependencies_not_self', sql`task_id <> depends_on_id`)
      .execute();
    await db.schema
      .createIndex('task_dependencies_depends_on_idx')
      .on('task_dependencies')
      .columns(['depends_on_id', 'task_id'])
      .execute();
  },
  async down({ db, types }) {
    await db.schema.dropTable('task_dependencies').execute();
    await db.schema.dropIndex('tasks_ready_queue_idx').execute();
    await db.schema.dropIndex('dispatch_contexts_lease_idx').execute();
    await db.schema.dropIndex('dispatch_contexts_one_active_per_terminal').execute();
    for (const table of SEQUENCED) {
      const t = tableIn(db, table);
      await db.schema.dropIndex(`${table}_seq_idx`).execute();
      if (types.nativeSequences) {
        await sql`alter table ${t} alter column seq drop default`.execute(db);
        await sql`drop sequence ${tableIn(db, `${table}_seq_seq`)}`.execute(db);
      } else {
        await sql`drop trigger ${sql.raw(`${table}_seq_assign`)}`.execute(db);
      }
    }
    await db.schema.alterTable('dispatch_contexts').dropColumn('lease_expires_at').execute();
    await db.schema.alterTable('dispatch_contexts').dropColumn('seq').execute();
    for (const column of ['blocked_reason', 'result', 'spec', 'priority', 'seq']) {
      await db.schema.alterTable('tasks').dropColumn(column).execute();
    }
  },
};
