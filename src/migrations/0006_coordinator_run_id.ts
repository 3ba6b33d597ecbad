import type { MigrationDefinition } from './types.js';

const RUN_SCOPED = [
  ['tasks', 'tasks_run_status_idx'],
  ['dispatch_contexts', 'dispatch_contexts_run_status_idx'],
  ['decision_gates', 'decision_gates_run_status_idx'],
] as const;

/**
 * Run scoping (seed 001): a nullable `coordinator_run_id` on the run-scoped tables.
 * No foreign-key constraint: SQLite cannot drop a column that carries one without rebuilding the
 * table, and `down` must work; the repositories only ever write ids of existing runs.
 */
export const migration0006: MigrationDefinition = {
  version: 6,
  name: 'coordinator_run_id',
  async up({ db }) {
    for (const [table, index] of RUN_SCOPED) {
      await db.schema.alterTable(table).addColumn('coordinator_run_id', 'text').execute();
      await db.schema.createIndex(index).on(table).columns(['coordinator_run_id', 'status']).execute();
    }
  },
  async down({ db }) {
    for (const [table, index] of RUN_SCOPED) {
      await db.schema.dropIndex(index).execute();
      await db.schema.alterTable(table).dropColumn('coordinator_run_id').execute();
    }
  },
};
