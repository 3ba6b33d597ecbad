import { sql } from 'kysely';
import { roleImpliesFilesystem } from '../domain/filesystem-roles.js';
import type { MigrationDefinition } from './types.js';

const BATCH_SIZE = 50_000;
const ROLE_CHUNK = 500;

/**
 * `tasks.requires_filesystem` with the conservative backfill of seed 000: 1 only for
 * (a) in-flight tasks holding a live lease and (b) todo/backlog tasks whose assignee's role
 * matches the engineering regex or whose department is exactly `engineering`.
 *
 * The regex is evaluated in JavaScript once per distinct role on both dialects, so SQLite and
 * PostgreSQL agree row for row; the update is set-based, in keyset batches of task ids, so memory
 * stays bounded however many tasks there are.
 */
export const migration0052: MigrationDefinition = {
  version: 52,
  name: 'requires_filesystem',
  async up({ db, now, progress }) {
    await db.schema
      .alterTable('tasks')
      .addColumn('requires_filesystem', 'integer', (c) => c.notNull().defaultTo(0).check(sql`requires_filesystem in (0, 1)`))
      .execute();

    const roles = await sql<{ role: string }>`select distinct role from agents where role is not null`.execute(db);
    const matching = roles.rows.map((r) => r.role).filter(roleImpliesFilesystem);
    const roleChunks: string[][] = [];
    for (let i = 0; i < matching.length; i += ROLE_CHUNK) roleChunks.push(matching.slice(i, i + ROLE_CHUNK));
    if (roleChunks.length === 0) roleChunks.push([]);

    let low: string | null = null;
    let done = 0;
    let flagged = 0;
    for (;;) {
      // The upper bound of this batch: the BATCH_SIZE-th id after `low`, or none for the last batch.
      const boundary: { rows: { id: string }[] } = await sql<{ id: string }>`
        select id from tasks where ${low === null ? sql`1 = 1` : sql`id > ${low}`}
        order by id limit 1 offset ${BATCH_SIZE - 1}`.execute(db);
      const high: string | null = boundary.rows[0]?.id ?? null;
      const range = sql`${low === null ? sql`1 = 1` : sql`id > ${low}`} and ${high === null ? sql`1 = 1` : sql`id <= ${high}`}`;
      for (const chunk of roleChunks) {
        const roleMatch = chunk.length === 0 ? sql`0 = 1` : sql`a.role in (${sql.join(chunk)})`;
        const result = await sql`
          update tasks set requires_filesystem = 1
          where ${range} and requires_filesystem = 0 and (
            (status in ('dispatched', 'in_progress') and exists (
              select 1 from task_leases l
              where l.task_id = tasks.id and l.holder is not null and l.expires_at > ${now}))
            or (status in ('todo', 'backlog') and exists (
              select 1 from agents a
              where a.id = tasks.assignee_agent_id and (${roleMatch} or a.department = 'engineering'))))`.execute(db);
        flagged += Number(result.numAffectedRows ?? 0n);
      }
      if (high === null) break;
      done += BATCH_SIZE;
      low = high;
      progress(`0052: backfilled ${done} tasks (${flagged} require the filesystem)`);
    }
    progress(`0052: backfill complete, ${flagged} tasks require the filesystem`);
  },
  async down({ db }) {
    await db.schema.alterTable('tasks').dropColumn('requires_filesystem').execute();
  },
};
