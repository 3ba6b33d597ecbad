import type { MigrationDefinition } from './types.js';

/**
 * Exactly-once resume (issue 23 item 5): who took a resolved gate's decision, and when.
 * `gates.consumeResolution` sets both once, with a compare-and-set on `consumed_by is null`.
 */
export const migration0072: MigrationDefinition = {
  version: 72,
  name: 'gate_consumption',
  async up({ db, types }) {
    await db.schema.alterTable('decision_gates').addColumn('consumed_by', 'text').execute();
    await db.schema.alterTable('decision_gates').addColumn('consumed_at', types.epochMs).execute();
  },
  async down({ db }) {
    await db.schema.alterTable('decision_gates').dropColumn('consumed_at').execute();
    await db.schema.alterTable('decision_gates').dropColumn('consumed_by').execute();
  },
};
