import { sql } from 'kysely';
import { tableIn } from '../query/schema.js';
import { createDeliver, createReceive } from './0105_message_functions.js';
import type { MigrationDefinition } from './types.js';

/**
 * The inbox hand-outs' dead-lettering bounded by the inbox (issue 24), PostgreSQL only:
 * `taskfence_receive_messages_v2` and `taskfence_deliver_messages_v2`, 0105's v1 with the inboxes
 * of `dead` (the caller's and those of the runs it took over) named as one array,
 * `to_handle = any(array(…))`, instead of `to_handle = p_handle or to_handle in (…)`.
 *
 * Why: PostgreSQL planned v1's `or` as one scan of the leased index on `status` and
 * `visible_at` alone, so every receive and every delivery read the lapsed leases of every inbox
 * of the store: ten cycles beside 60,000 lapsed leases elsewhere read 1,200,949 rows of
 * `messages` (`kept-plans.test.ts`). An array is an index condition on `to_handle`, so the read
 * stays within the inboxes the call serves. The statistics do not matter: v1 read as many rows
 * with the table analyzed as without.
 *
 * Additive: a release that does not know them keeps calling v1, which stays.
 */
export const migration0108: MigrationDefinition = {
  version: 108,
  name: 'inbox_dead_by_array',
  functions: ['taskfence_receive_messages_v2', 'taskfence_deliver_messages_v2'],
  async up({ db, types }) {
    if (!types.storedFunctions) return;
    await sql`${createReceive(db, 2)}`.execute(db);
    await sql`${createDeliver(db, 2)}`.execute(db);
  },
  async down({ db, types }) {
    if (!types.storedFunctions) return;
    await sql`drop function if exists ${tableIn(db, 'taskfence_deliver_messages_v2')}(text, bigint, integer, integer)`.execute(
      db,
    );
    await sql`drop function if exists ${tableIn(db, 'taskfence_receive_messages_v2')}(text, bigint, integer, bigint, text, integer)`.execute(
      db,
    );
  },
};
