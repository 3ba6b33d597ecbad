import type { MigrationDefinition } from './types.js';

/**
 * The limit of each semaphore (issue 26): `semaphores.slot_limit` holds the `limit` of the latest
 * grant of the name, so `inspect` and the dashboard show holders / limit. Null: nothing granted
 * since this version (the limit is only ever known from a call). A nullable column without a
 * default: online-safe on both dialects.
 */
export const migration0098: MigrationDefinition = {
  version: 98,
  name: 'semaphore_limits',
  async up({ db }) {
    await db.schema.alterTable('semaphores').addColumn('slot_limit', 'integer').execute();
  },
  async down({ db }) {
    await db.schema.alterTable('semaphores').dropColumn('slot_limit').execute();
  },
};
