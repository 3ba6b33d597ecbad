import { sql } from 'kysely';
import { tableIn } from '../query/schema.js';
import { createDispatchNextBatch } from './0101_dispatch_functions.js';
import type { MigrationDefinition } from './types.js';

/**
 * `dispatchNextBatch`'s busy terminals by one probe each (issue 24), PostgreSQL only:
 * `taskfence_dispatch_next_batch_v4`, 0104's v3 with the terminals that hold an active dispatch
 * found per terminal, from `unnest(…)` by a `LATERAL` subquery with a `LIMIT` (one probe of
 * `dispatch_contexts_one_active_per_terminal` each), instead of by `terminal_handle = any(…)`.
 *
 * Why: v3's query is planned per call, but with the statistics of the moment. Before the table's
 * first ANALYZE (a new store, or one whose active dispatches grew within an autovacuum interval)
 * the planner takes `status = 'active'` for 0.5% of the rows, and below about 200 active
 * dispatches per terminal asked it read all of them through `dispatch_contexts_lease_idx`
 * instead: ten batches of 100 at 10,000 active read 111,270 rows (`kept-plans.test.ts`). A
 * subquery with a limit is not flattened, so the probes stay probes whatever the statistics say.
 *
 * Additive: a release that does not know it keeps calling v3, which stays.
 */
export const migration0107: MigrationDefinition = {
  version: 107,
  name: 'batch_busy_probe',
  functions: ['taskfence_dispatch_next_batch_v4'],
  async up({ db, types }) {
    if (!types.storedFunctions) return;
    await sql`${createDispatchNextBatch(db, 4)}`.execute(db);
  },
  async down({ db, types }) {
    if (!types.storedFunctions) return;
    await sql`drop function if exists ${tableIn(db, 'taskfence_dispatch_next_batch_v4')}(text, text[], text[], text, text, text, numeric, integer, bigint, bigint, text)`.execute(
      db,
    );
  },
};
