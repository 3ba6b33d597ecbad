import type { MigrationDefinition } from './types.js';

/**
 * A grant's lease rows by its token: `path_leases_holder_token_idx` on
 * `path_leases (workspace_id, holder, token)`, built concurrently. Every call that names a grant
 * (`releasePaths(lease)`, `renewPaths(lease)`, `tx.assertLease` on a path lease, and the reason a
 * lost grant gives) finds its rows by workspace, holder and token. The only index that served
 * them was `path_leases_holder_idx` (workspace, holder), which reads every lease the holder has
 * in the workspace: a coordinator that leases paths for all its tasks under one holder paid for
 * all of them on each release, holding SQLite's write lock throughout (a release took 43 µs at 10
 * of the holder's leases, 0.67 ms at 10,000 and 6.5 ms at 100,000 on SQLite, tmpfs; 0.58 ms and
 * 8.0 ms at 10 and 100,000 on PostgreSQL). A token is granted once per workspace, so the new
 * index reads the grant's rows only; it leads with the old index's columns, so every query by
 * holder is served as before, and 0111 drops the old index (one index more on each lease write
 * cost the path cycle 7% on tmpfs). A concurrent step: `path_leases` is written by the running
 * release, which gains the index without a change.
 */
export const migration0110: MigrationDefinition = {
  version: 110,
  name: 'path_lease_grant_index',
  async up() {
    // Nothing in the DDL transaction: the index is built by the concurrent step.
  },
  concurrent: [
    {
      kind: 'create-index',
      index: 'path_leases_holder_token_idx',
      table: 'path_leases',
      build: (db) =>
        db.schema
          .createIndex('path_leases_holder_token_idx')
          .on('path_leases')
          .columns(['workspace_id', 'holder', 'token']),
    },
  ],
  async down({ db }) {
    await db.schema.dropIndex('path_leases_holder_token_idx').ifExists().execute();
  },
};
