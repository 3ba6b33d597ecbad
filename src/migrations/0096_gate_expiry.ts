import type { MigrationDefinition } from './types.js';

/**
 * Gates that gate (issue 22): a gate may carry an expiry (`expires_at`), after which
 * `gates.expireGates` times it out (`timed_out_at`). The baseline's CHECK on `status` allows
 * `open` and `resolved` only, and SQLite cannot change a CHECK without rebuilding the table, so a
 * timed-out gate is stored `resolved` with no resolution and `timed_out_at` set, and reads as
 * `timeout`. Two nullable columns without defaults: online-safe on both dialects.
 */
export const migration0096: MigrationDefinition = {
  version: 96,
  name: 'gate_expiry',
  async up({ db, types }) {
    await db.schema.alterTable('decision_gates').addColumn('expires_at', types.epochMs).execute();
    await db.schema.alterTable('decision_gates').addColumn('timed_out_at', types.epochMs).execute();
  },
  async down({ db }) {
    await db.schema.alterTable('decision_gates').dropColumn('timed_out_at').execute();
    await db.schema.alterTable('decision_gates').dropColumn('expires_at').execute();
  },
};
