import { sql, type Kysely } from 'kysely';
import { FILESYSTEM_DEPARTMENT, roleImpliesFilesystem } from '../domain/filesystem-roles.js';
import type { BackfillBatch, MigrationDefinition } from './types.js';
import { tableIn } from '../query/schema.js';

const BATCH_SIZE = 50_000;
const ROLE_CHUNK = 500;

export interface BackfillOptions {
  /** Epoch ms a task lease must outlive to count as live. */
  readonly now: number;
  readonly progress: (message: string, counts?: { readonly done: number }) => void;
  /** Tasks per keyset batch (default 50 000). */
  readonly batchSize?: number;
  /** Matching roles per `IN (…)` list (default 500). */
  readonly roleChunkSize?: number;
}

/**
 * The v52 backfill of `tasks.requires_filesystem` (seed 000): sets 1 only for (a) `dispatched` /
 * `in_progress` tasks whose `task_leases` row has a holder and `expires_at > now`, and (b) `todo` /
 * `backlog` tasks whose assignee's role matches `FILESYSTEM_ROLE_PATTERN` or whose department is
 * exactly `engineering`; leaves every other row as it is (0 after the column is added).
 *
 * The regex is evaluated in JavaScript once per distinct role, on both dialects, so SQLite and
 * PostgreSQL agree row for row; tasks are updated set-based in keyset batches of ids, so memory stays
 * bounded however many tasks there are. Returns the number of tasks set to 1.
 */
export async function backfillRequiresFilesystem(db: Kysely<any>, options: BackfillOptions): Promise<number> {
  const { now, progress } = options;
  const batchSize = options.batchSize ?? BATCH_SIZE;
  let cursor: string | null = null;
  let done = 0;
  let flagged = 0;
  for (;;) {
    const batch = await requiresFilesystemBatch(db, { now, batchSize, roleChunkSize: options.roleChunkSize }, cursor);
    flagged += batch.changed;
    if (batch.cursor === null) break;
    done += batch.visited;
    cursor = batch.cursor;
    progress(`0052: backfilled ${done} tasks (${flagged} require the filesystem)`, { done });
  }
  progress(`0052: backfill complete, ${flagged} tasks require the filesystem`);
  return flagged;
}

/**
 * One keyset batch of the v52 backfill: the tasks with ids after `cursor` up to the
 * `batchSize`-th one, set-based. Returns that last id as the next cursor (null for the last batch).
 * Run again over the same range it changes nothing more (it only sets 0 to 1 where the rule holds).
 */
export async function requiresFilesystemBatch(
  db: Kysely<any>,
  options: { readonly now: number; readonly batchSize: number; readonly roleChunkSize?: number | undefined },
  cursor: string | null,
): Promise<BackfillBatch> {
  const { now, batchSize } = options;
  const roleChunkSize = options.roleChunkSize ?? ROLE_CHUNK;
  // Distinct roles are few (job titles, not tasks): read them once a batch, test each with the one regex.
  const roles = await sql<{
    role: string;
  }>`select distinct role from ${tableIn(db, 'agents')} where role is not null`.execute(db);
  const matching = roles.rows.map((r) => r.role).filter(roleImpliesFilesystem);
  const roleChunks: string[][] = [];
  for (let i = 0; i < matching.length; i += roleChunkSize) roleChunks.push(matching.slice(i, i + roleChunkSize));
  if (roleChunks.length === 0) roleChunks.push([]);

  const low = cursor;
  // The upper bound of this batch: the batchSize-th id after `low`, or none for the last batch.
  // ORDER BY and the range predicates use the same collation, so batches tile the id space.
  // (The SQL keeps the indentation it had inside 0052's former loop: it is part of the checksum.)
  const boundary: { rows: { id: string }[] } = await sql<{ id: string }>`
      select id from ${tableIn(db, 'tasks')} where ${low === null ? sql`1 = 1` : sql`id > ${low}`}
      order by id limit 1 offset ${batchSize - 1}`.execute(db);
  const high: string | null = boundary.rows[0]?.id ?? null;
  const range = sql`${low === null ? sql`1 = 1` : sql`id > ${low}`} and ${high === null ? sql`1 = 1` : sql`id <= ${high}`}`;
  let changed = 0;
  for (const chunk of roleChunks) {
    // Role equality and department equality are exact, byte-for-byte comparisons on both dialects.
    const roleMatch = chunk.length === 0 ? sql`0 = 1` : sql`a.role in (${sql.join(chunk)})`;
    // The status tests sit inside CASE so no planner drives the batch from the status index
    // (which would walk most of the table on every batch); the id range on the primary key does.
    const result = await sql`
        update ${tableIn(db, 'tasks')} set requires_filesystem = 1
        where ${range} and requires_filesystem = 0 and (case
          when status in ('dispatched', 'in_progress') and exists (
            select 1 from ${tableIn(db, 'task_leases')} l
            where l.task_id = tasks.id and l.holder is not null and l.expires_at > ${now}) then 1
          when status in ('todo', 'backlog') and exists (
            select 1 from ${tableIn(db, 'agents')} a
            where a.id = tasks.assignee_agent_id and (${roleMatch} or a.department = ${FILESYSTEM_DEPARTMENT})) then 1
          else 0 end) = 1`.execute(db);
    changed += Number(result.numAffectedRows ?? 0n);
  }
  return { cursor: high, visited: batchSize, changed };
}

/**
 * `tasks.requires_filesystem` with the conservative backfill of seed 000 (see
 * `backfillRequiresFilesystem`): 1 only with positive evidence, 0 for everything else. The column
 * (constant default: no table rewrite) commits first; the backfill then runs in batches of their
 * own transactions (`requiresFilesystemBatch`), resumable from the recorded cursor.
 */
export const migration0052: MigrationDefinition = {
  version: 52,
  name: 'requires_filesystem',
  async up({ db, types }) {
    if (!types.concurrentDdl) {
      // SQLite: the CHECK sits on the column (there is no ADD CONSTRAINT), checked as it is added.
      await db.schema
        .alterTable('tasks')
        .addColumn('requires_filesystem', 'integer', (c) =>
          c
            .notNull()
            .defaultTo(0)
            .check(sql`requires_filesystem in (0, 1)`),
        )
        .execute();
      return;
    }
    // PostgreSQL: a CHECK on the added column would be validated over every task under the
    // ACCESS EXCLUSIVE lock; NOT VALID here, validated by the concurrent step. The name is the
    // one PostgreSQL gave the column constraint before, so both ways end in the same schema.
    await db.schema
      .alterTable('tasks')
      .addColumn('requires_filesystem', 'integer', (c) => c.notNull().defaultTo(0))
      .execute();
    await sql`alter table ${tableIn(db, 'tasks')} add constraint tasks_requires_filesystem_check
      check (requires_filesystem in (0, 1)) not valid`.execute(db);
  },
  concurrent: [{ kind: 'validate-constraint', table: 'tasks', constraint: 'tasks_requires_filesystem_check' }],
  async down({ db }) {
    await db.schema.alterTable('tasks').dropColumn('requires_filesystem').execute();
  },
  backfill: {
    batch: ({ db, now, batchSize }, cursor) => requiresFilesystemBatch(db, { now, batchSize }, cursor),
    async workRows(db) {
      const { rows } = await sql<{ n: number | string }>`select count(*) as n from ${tableIn(db, 'tasks')}`.execute(db);
      return Number(rows[0]?.n ?? 0);
    },
    summary: (changed) => `0052: backfill complete, ${changed} tasks require the filesystem`,
  },
  // Until the online migrator, 0052 ran this same backfill inside its DDL transaction, and its
  // checksum covered those statements; a database that applied it then has the same schema and
  // the same rows (test/suites/online.suite.ts applies the old definition and migrates on).
  // Then (the second of each) it added its CHECK validated under the table lock, on the column,
  // on PostgreSQL: the same constraint, name and rows as NOT VALID + VALIDATE.
  acceptedChecksums: {
    sqlite: [
      '0115cebc4fb53cf1d0c8a451e9c4ac38a03aefb888faae4db4b3fe79a0ecc5e4',
      '2ed41b44d7ea9a6936899e3507b79b728cd1da2787795c26e483bb2729563716',
    ],
    postgres: [
      '5d8329d05b37a1d92c799756ee48810f786040fb1cf0e0e65fd78f0b6836d70a',
      'bf49313e9769fdb313322e63e9cede680db81f19e79a7b70a76e722fb4731946',
    ],
  },
};
