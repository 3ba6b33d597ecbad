import { sql } from 'kysely';
import { tableIn } from '../query/schema.js';
import { createDispatchNextBatch } from './0101_dispatch_functions.js';
import type { MigrationDefinition } from './types.js';

/**
 * `dispatchNextBatch`'s function with plans that hold as the tables grow (issue 24), PostgreSQL
 * only: `taskfence_dispatch_next_batch_v3` is v2 (0103) with the busy terminals found by a query
 * planned on every call (`EXECUTE`) and the picked tasks updated by primary key alone. PL/pgSQL
 * keeps a generic plan per connection, planned with the statistics of its first calls; on a
 * store whose active dispatches grew from none to 10,000 within one autovacuum interval, v2's
 * kept plan scanned every active dispatch per terminal and made a batch of 100 take 120 ms
 * (0.14–0.16 of the same batch on a store with none active; v3: 0.84–0.97). The reasons, and why
 * not custom plans for the whole statement, are at `createDispatchNextBatch`. The guards, the
 * `SKIP LOCKED` pick, the writes and the `json` rows are v2's.
 *
 * Additive: a release that does not know it keeps calling v2 (or v1), which stay installed.
 */
export const migration0104: MigrationDefinition = {
  version: 104,
  name: 'batch_claim_stable_plans',
  functions: ['taskfence_dispatch_next_batch_v3'],
  async up({ db, types }) {
    if (!types.storedFunctions) return;
    await sql`${createDispatchNextBatch(db, 3)}`.execute(db);
  },
  async down({ db, types }) {
    if (!types.storedFunctions) return;
    await sql`drop function if exists ${tableIn(db, 'taskfence_dispatch_next_batch_v3')}(text, text[], text[], text, text, text, numeric, integer, bigint, bigint, text)`.execute(
      db,
    );
  },
};
