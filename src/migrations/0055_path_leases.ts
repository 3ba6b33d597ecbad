import { sql } from 'kysely';
import type { MigrationDefinition } from './types.js';

/**
 * Path-scoped write leases (seed 002): `tasks.writes` (a JSON array of paths; null = omitted,
 * meaning the whole workspace) and durable leases. `lease_key` is `/` + normalized path + `/`
 * (`/` alone = the whole workspace; see `encodePathLeaseKey`) and compares byte by byte on both
 * dialects, so the conflict check finds ancestors by equality and descendants by one range on
 * the primary key (workspace_id, lease_key, holder). `path_leases_holder_idx` serves release and
 * renewal by holder; `path_leases_task_idx` serves releasing a task's leases on submit.
 */
export const migration0055: MigrationDefinition = {
  version: 55,
  name: 'path_leases',
  async up({ db, types }) {
    const ms = types.epochMs;
    await db.schema.alterTable('tasks').addColumn('writes', 'text').execute();
    await db.schema
      .createTable('path_leases')
      .addColumn('workspace_id', 'text', (c) => c.notNull().references('workspaces.id').onDelete('cascade'))
      .addColumn('lease_key', sql.raw(types.bytewiseText), (c) => c.notNull())
      .addColumn('holder', 'text', (c) => c.notNull())
      .addColumn('task_id', 'text')
      .addColumn('acquired_at', ms, (c) => c.notNull())
      .addColumn('expires_at', ms, (c) => c.notNull())
      .addPrimaryKeyConstraint('path_leases_pkey', ['workspace_id', 'lease_key', 'holder'])
      .execute();
    await db.schema
      .createIndex('path_leases_holder_idx')
      .on('path_leases')
      .columns(['workspace_id', 'holder'])
      .execute();
    await db.schema.createIndex('path_leases_task_idx').on('path_leases').column('task_id').execute();
  },
  async down({ db }) {
    await db.schema.dropTable('path_leases').execute();
    await db.schema.alterTable('tasks').dropColumn('writes').execute();
  },
};
