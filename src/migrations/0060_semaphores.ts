import type { MigrationDefinition } from './types.js';

/**
 * Counting semaphores (issue 21). `semaphores` holds one row per name with the latest fencing
 * token granted (never reset, never reused); `semaphore_holders` one row per granted slot, keyed
 * by (name, token). A slot counts against the limit while `expires_at > now`; release deletes it,
 * and an expired slot no longer counts (acquisitions delete those long expired). New tables only:
 * online-safe.
 */
export const migration0060: MigrationDefinition = {
  version: 60,
  name: 'semaphores',
  async up({ db, types }) {
    const ms = types.epochMs;
    await db.schema
      .createTable('semaphores')
      .addColumn('name', 'text', (c) => c.primaryKey())
      .addColumn('token', 'bigint', (c) => c.notNull())
      .addColumn('updated_at', ms, (c) => c.notNull())
      .execute();
    await db.schema
      .createTable('semaphore_holders')
      .addColumn('name', 'text', (c) => c.notNull().references('semaphores.name').onDelete('cascade'))
      .addColumn('token', 'bigint', (c) => c.notNull())
      .addColumn('holder', 'text', (c) => c.notNull())
      .addColumn('acquired_at', ms, (c) => c.notNull())
      .addColumn('expires_at', ms, (c) => c.notNull())
      .addPrimaryKeyConstraint('semaphore_holders_pkey', ['name', 'token'])
      .execute();
    await db.schema
      .createIndex('semaphore_holders_expiry_idx')
      .on('semaphore_holders')
      .columns(['name', 'expires_at'])
      .execute();
  },
  async down({ db }) {
    await db.schema.dropTable('semaphore_holders').execute();
    await db.schema.dropTable('semaphores').execute();
  },
};
