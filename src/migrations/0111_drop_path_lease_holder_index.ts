import type { MigrationDefinition } from './types.js';

/**
 * Drops `path_leases_holder_idx` (workspace, holder): 0110's `path_leases_holder_token_idx`
 * (workspace, holder, token) leads with the same columns and serves every query the old one did,
 * so keeping both only costs each lease insert and delete one more index entry. Its own version,
 * after 0110, so the old index is gone only once the new one is built: a release still running
 * has one of them at every moment and its queries by holder never change plan for the worse.
 * `DROP INDEX` takes the table's lock for a moment in the DDL transaction, under the migrator's
 * short `lock_timeout` like any DDL; it changes no row.
 */
export const migration0111: MigrationDefinition = {
  version: 111,
  name: 'drop_path_lease_holder_index',
  async up({ db }) {
    await db.schema.dropIndex('path_leases_holder_idx').ifExists().execute();
  },
  async down({ db }) {
    // The table as 0110 left it: the reverted version's index, built in the down transaction.
    await db.schema
      .createIndex('path_leases_holder_idx')
      .ifNotExists()
      .on('path_leases')
      .columns(['workspace_id', 'holder'])
      .execute();
  },
};
