import type { MigrationDefinition } from './types.js';

/**
 * Fencing tokens for path leases (issue 21). `path_lease_tokens` holds one row per workspace
 * with the latest token granted there (never reset, never reused); every acquisition locks and
 * bumps it, so `tx.assertLease` on a path lease (which reads it `FOR SHARE`) makes a takeover in
 * that workspace wait for the fenced write. `path_leases.token` is the grant a lease row belongs
 * to (null on rows written before this version). `path_lease_claims` records the latest claim of
 * each task (`claimTask`), so `submitTaskResult` can tell the current claim from a stale one of
 * the same holder name. New tables and one nullable column without default: online-safe.
 */
export const migration0095: MigrationDefinition = {
  version: 95,
  name: 'path_lease_tokens',
  async up({ db, types }) {
    const ms = types.epochMs;
    await db.schema
      .createTable('path_lease_tokens')
      .addColumn('workspace_id', 'text', (c) => c.primaryKey().references('workspaces.id').onDelete('cascade'))
      .addColumn('token', 'bigint', (c) => c.notNull())
      .addColumn('updated_at', ms, (c) => c.notNull())
      .execute();
    await db.schema
      .createTable('path_lease_claims')
      .addColumn('task_id', 'text', (c) => c.primaryKey().references('tasks.id').onDelete('cascade'))
      .addColumn('workspace_id', 'text', (c) => c.notNull())
      .addColumn('holder', 'text', (c) => c.notNull())
      .addColumn('token', 'bigint', (c) => c.notNull())
      .addColumn('claimed_at', ms, (c) => c.notNull())
      .execute();
    await db.schema.alterTable('path_leases').addColumn('token', 'bigint').execute();
  },
  async down({ db }) {
    await db.schema.alterTable('path_leases').dropColumn('token').execute();
    await db.schema.dropTable('path_lease_claims').execute();
    await db.schema.dropTable('path_lease_tokens').execute();
  },
};
