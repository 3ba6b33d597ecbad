import { sql } from 'kysely';
import { tableIn } from '../query/schema.js';
import { createDispatchNextBatch } from './0101_dispatch_functions.js';
import type { MigrationDefinition } from './types.js';

/**
 * `dispatchNextBatch`'s function returning `json` (issue 24), PostgreSQL only:
 * `taskfence_dispatch_next_batch_v2` is `taskfence_dispatch_next_batch_v1` with the dispatches
 * made aggregated by `json_agg` instead of `jsonb_agg(to_jsonb(…))`. Building `jsonb` and
 * printing it back to text cost the server about 1.5 ms of a 100-dispatch batch's 7 ms; the
 * client parses either text the same way, so the result is the same rows. Everything else (the
 * guards, the free terminals, the `SKIP LOCKED` pick, the writes) is v1's body.
 *
 * Additive: a release that does not know it keeps calling v1, which stays installed.
 */
export const migration0103: MigrationDefinition = {
  version: 103,
  name: 'batch_claim_json',
  functions: ['taskfence_dispatch_next_batch_v2'],
  async up({ db, types }) {
    if (!types.storedFunctions) return;
    await sql`${createDispatchNextBatch(db, 2)}`.execute(db);
  },
  async down({ db, types }) {
    if (!types.storedFunctions) return;
    await sql`drop function if exists ${tableIn(db, 'taskfence_dispatch_next_batch_v2')}(text, text[], text[], text, text, text, numeric, integer, bigint, bigint, text)`.execute(
      db,
    );
  },
};
