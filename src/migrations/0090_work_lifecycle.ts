import { sql } from 'kysely';
import { tableIn } from '../query/schema.js';
import { backfillIndexStep, numberLegacyBatch, numberNewRows, unnumberedRows } from './numbering.js';
import type { ConcurrentStep, MigrationDefinition } from './types.js';

/** The two tables that get an insertion order. */
const SEQUENCED = ['tasks', 'dispatch_contexts'] as const;

/** A concurrent index step. */
const index = (name: string, table: string, columns: string[], unique = false): ConcurrentStep => ({
  kind: 'create-index',
  index: name,
  table,
  build: (db) => {
    const built = db.schema.createIndex(name).on(table).columns(columns);
    return unique ? built.unique() : built;
  },
});

/**
 * The work lifecycle (issue 22):
 * - `seq` on tasks and dispatches: a monotonic insertion number, the only order "oldest first"
 *   and "newest" are read in (never a timestamp plus a random id). PostgreSQL: a sequence
 *   default; SQLite: an `AFTER INSERT` trigger. Legacy rows are numbered by the backfill, in
 *   batches after the DDL commits, in their old order (created_at, id), below every new row (the
 *   argument is in numbering.ts).
 * - `dispatch_contexts_one_active_per_terminal`: a partial unique index, at most one active
 *   dispatch per terminal. Legacy terminals with several active dispatches keep the newest (by
 *   (created_at, id), the order their seq gets); the older ones are failed ("superseded") and
 *   their tasks, left with no active dispatch, go back to `ready`.
 * - `lease_expires_at` on dispatches: the dispatch lease (null for legacy dispatches; the reclaim counts
 *   them lapsed one default lease TTL after their last update).
 *   The fencing token is the dispatch's `seq`.
 * - `priority` (default 0), `spec` and `result` (JSON text) and `blocked_reason` on tasks.
 * - `task_dependencies` (task_id depends on depends_on_id) and the ready-queue index
 *   (run, status, priority, seq).
 * The indexes on tasks and dispatches are concurrent steps, built before the backfill.
 */
export const migration0090: MigrationDefinition = {
  version: 90,
  name: 'work_lifecycle',
  onlineExceptions: [
    {
      rule: 'index-on-existing-table',
      reason:
        'dispatch_contexts_one_active_per_terminal is built in the DDL transaction: the running release can ' +
        'still start a second active dispatch of a terminal, which would fail a concurrent build; writes to ' +
        'dispatch_contexts (a small table) wait for the build, tasks are not locked by it',
    },
    {
      rule: 'data-change-in-ddl-step',
      reason:
        'duplicate active dispatches of one terminal are ended in the DDL transaction, just before that ' +
        'unique index, for the same reason; it touches only active dispatches',
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

    for (const table of SEQUENCED) await numberNewRows(db, types, table);

    // Legacy terminals with several active dispatches: the newest stays, the others end.
    await sql`
      update ${dispatches} set status = 'failed', error = 'superseded: one active dispatch per terminal (migration 0090)',
        ended_at = updated_at
      where status = 'active' and exists (
        select 1 from ${dispatches} newer
        where newer.terminal_handle = ${dispatches}.terminal_handle and newer.status = 'active'
          and (newer.created_at, newer.id) > (${dispatches}.created_at, ${dispatches}.id))`.execute(db);
    // Driven from the few superseded dispatches (by primary key), never a scan of tasks under the lock.
    await sql`
      update ${tasks} set status = 'ready'
      where id in (select d.task_id from ${dispatches} d
          where d.error = 'superseded: one active dispatch per terminal (migration 0090)')
        and status in ('dispatched', 'in_progress')
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
  // Built after the DDL commits, without blocking writes; the seq indexes first (the SQLite
  // trigger reads max(seq)), then what the backfill walks, then the ready queue and lease lookups.
  concurrent: [
    index('tasks_seq_idx', 'tasks', ['seq'], true),
    index('dispatch_contexts_seq_idx', 'dispatch_contexts', ['seq'], true),
    ...SEQUENCED.map(backfillIndexStep),
    // Reclaiming: the active dispatches whose lease lapsed.
    index('dispatch_contexts_lease_idx', 'dispatch_contexts', ['status', 'lease_expires_at']),
    // The ready queue: a run's ready tasks, highest priority first, then oldest, in index order,
    // so dispatchNext reads the first rows instead of sorting a priority group.
    index('tasks_ready_queue_idx', 'tasks', ['coordinator_run_id', 'status', 'priority desc', 'seq']),
  ],
  backfill: {
    batch: ({ db, batchSize }, cursor) => numberLegacyBatch(db, SEQUENCED, batchSize, cursor),
    workRows: (db) => unnumberedRows(db, SEQUENCED),
    summary: (changed) => `0090: backfill complete, ${changed} legacy tasks and dispatches numbered`,
  },
  // Until the concurrent steps, 0090 numbered the legacy rows and built every index inside its DDL
  // transaction; a database that applied it then has the same schema (its legacy rows numbered
  // from 1, new rows right after them; the backfill index is added by no step there, see
  // test/suites/online.suite.ts, which applies the old definition and migrates on).
  acceptedChecksums: {
    sqlite: ['ef4b9ed614407068f3191e0848b58cb3b2ef7f329a9bac7c8312ff4a191aeb70'],
    postgres: ['3e4ff54a46147d689f2322d8beb3e71418be4e9716885bb394adc93dc5d648c7'],
  },
  async down({ db, types }) {
    await db.schema.dropTable('task_dependencies').execute();
    // The concurrent steps may not all have run (a crash, then a revert).
    await db.schema.dropIndex('tasks_ready_queue_idx').ifExists().execute();
    await db.schema.dropIndex('dispatch_contexts_lease_idx').ifExists().execute();
    await db.schema.dropIndex('dispatch_contexts_one_active_per_terminal').execute();
    for (const table of SEQUENCED) {
      const t = tableIn(db, table);
      await db.schema.dropIndex(`${table}_seq_backfill_idx`).ifExists().execute();
      await db.schema.dropIndex(`${table}_seq_idx`).ifExists().execute();
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
