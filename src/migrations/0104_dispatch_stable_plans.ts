import { sql } from 'kysely';
import { tableIn } from '../query/schema.js';
import { createCompleteDispatch, createDispatchNext, createDispatchNextBatch } from './0101_dispatch_functions.js';
import { createCompleteV2 } from './0102_complete_and_next.js';
import type { MigrationDefinition } from './types.js';

/**
 * The dispatch functions with plans that hold as the tables grow (issue 24), PostgreSQL only.
 * PL/pgSQL keeps a generic plan per connection, planned with the statistics of its first calls,
 * until the table is analyzed again. A connection that started on small tables kept plans that
 * served a status re-check from a status index: once thousands of dispatches were active or
 * tasks ready (within one autovacuum interval, or with autovacuum off), `completeDispatch` read
 * every active dispatch to end one (17.5 ms instead of 1.4), its dependents' lock scanned the
 * whole `tasks` table, `dispatchNext` read every ready task of the store (3 ms instead of 1.5),
 * and a `dispatchNextBatch` of 100 scanned every active dispatch per terminal (120 ms instead of
 * 8). The new versions (what changed is at `STILL_READY` in 0101):
 * - `taskfence_dispatch_next_v2`: v1, its re-check of the picked task's `ready` as `is true`;
 * - `taskfence_dispatch_next_batch_v3`: v2 (0103), the busy terminals found with `EXECUTE`, the
 *   re-check as in `dispatch_next_v2`;
 * - `taskfence_complete_dispatch_v3`: v1, its status tests of rows found by key as `is true`, the
 *   dependents' lock and move with `EXECUTE`;
 * - `taskfence_complete_dispatch_v4`: 0102's v2 composing `complete_dispatch_v3` and
 *   `dispatch_next_v2`.
 * Same results, same guarantees; `bench/batches.bench.ts` measures a batch beside 10,000 active
 * dispatches against none.
 *
 * Additive: a release that does not know them keeps calling the versions it knows, which stay.
 */
export const migration0104: MigrationDefinition = {
  version: 104,
  name: 'dispatch_stable_plans',
  functions: [
    'taskfence_dispatch_next_v2',
    'taskfence_dispatch_next_batch_v3',
    'taskfence_complete_dispatch_v3',
    'taskfence_complete_dispatch_v4',
  ],
  async up({ db, types }) {
    if (!types.storedFunctions) return;
    await sql`${createDispatchNext(db, 2)}`.execute(db);
    await sql`${createDispatchNextBatch(db, 3)}`.execute(db);
    await sql`${createCompleteDispatch(db, 3)}`.execute(db);
    await sql`${createCompleteV2(db, 4)}`.execute(db);
  },
  async down({ db, types }) {
    if (!types.storedFunctions) return;
    await sql`drop function if exists ${tableIn(db, 'taskfence_complete_dispatch_v4')}(text, text, bigint, bigint, boolean, text, boolean, text, text, text, numeric, text, bigint, text)`.execute(
      db,
    );
    await sql`drop function if exists ${tableIn(db, 'taskfence_complete_dispatch_v3')}(text, bigint, bigint, boolean, text)`.execute(
      db,
    );
    await sql`drop function if exists ${tableIn(db, 'taskfence_dispatch_next_batch_v3')}(text, text[], text[], text, text, text, numeric, integer, bigint, bigint, text)`.execute(
      db,
    );
    await sql`drop function if exists ${tableIn(db, 'taskfence_dispatch_next_v2')}(text, text, text, text, text, numeric, text, bigint, bigint, text)`.execute(
      db,
    );
  },
};
