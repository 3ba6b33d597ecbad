import type { MigrationDefinition } from './types.js';

/**
 * Idempotency keys (issue 23 item 3): one row per (operation, key) holding a fingerprint of the
 * first call's input and its outcome (a result or a typed refusal, as JSON), written in the same
 * transaction as the call's effect. `idempotency_keys_created_idx` serves pruning.
 */
export const migration0071: MigrationDefinition = {
  version: 71,
  name: 'idempotency_keys',
  async up({ db, types }) {
    await db.schema
      .createTable('idempotency_keys')
      .addColumn('operation', 'text', (c) => c.notNull())
      .addColumn('key', 'text', (c) => c.notNull())
      .addColumn('fingerprint', 'text', (c) => c.notNull())
      .addColumn('outcome', 'text', (c) => c.notNull())
      .addColumn('created_at', types.epochMs, (c) => c.notNull())
      .addPrimaryKeyConstraint('idempotency_keys_pkey', ['operation', 'key'])
      .execute();
    await db.schema.createIndex('idempotency_keys_created_idx').on('idempotency_keys').column('created_at').execute();
  },
  async down({ db }) {
    await db.schema.dropTable('idempotency_keys').execute();
  },
};
