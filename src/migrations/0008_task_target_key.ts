import type { MigrationDefinition } from './types.js';

/** Per-target task ownership (seed 001): `tasks.target_key` so a run adopts only its target's tasks. */
export const migration0008: MigrationDefinition = {
  version: 8,
  name: 'task_target_key',
  async up({ db }) {
    await db.schema.alterTable('tasks').addColumn('target_key', 'text').execute();
    await db.schema
      .createIndex('tasks_target_run_idx')
      .on('tasks')
      .columns(['target_key', 'coordinator_run_id'])
      .execute();
  },
  async down({ db }) {
    await db.schema.dropIndex('tasks_target_run_idx').execute();
    await db.schema.alterTable('tasks').dropColumn('target_key').execute();
  },
};
