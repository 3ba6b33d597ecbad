import { sql } from 'kysely';
import { tableIn } from '../query/schema.js';
import type { MigrationDefinition } from './types.js';

/**
 * The store's PL/pgSQL functions run with `jit = off` (PostgreSQL only; nothing on SQLite).
 *
 * Why: a function keeps a generic plan per connection, costed from the statistics. Once one run
 * target had many stopped runs, the inbox functions' estimate of the runs to take over (from the
 * target's frequency among `coordinator_runs`) passed `jit_above_cost`, and every call, for any
 * inbox, even one that is no run's, compiled its plan with LLVM first: a receive took 540–570 ms
 * beside 100,000 stopped runs of one target, against 1.3 ms with JIT off (PostgreSQL 15, JIT
 * available as Debian builds it; found by a read-only plan audit, measured 2026-12-05). These
 * functions run short statements over a few rows, which JIT never speeds up; the setting applies
 * to each call, so a host's transaction that calls them through the store has it too.
 *
 * Every function the chain created so far gets it, the ones a release still running calls
 * included: `ALTER FUNCTION … SET` changes no result, only how the plans are executed, so it is
 * not a new version (unlike a change of a function's statements). It takes no lock a call waits
 * on; a connection's next call runs with it.
 */
const FUNCTIONS = [
  'taskfence_dispatch_next_v1(text, text, text, text, text, numeric, text, bigint, bigint, text)',
  'taskfence_dispatch_next_batch_v1(text, text[], text[], text, text, text, numeric, integer, bigint, bigint, text)',
  'taskfence_complete_dispatch_v1(text, bigint, bigint, boolean, text)',
  'taskfence_complete_dispatch_v2(text, text, bigint, bigint, boolean, text, boolean, text, text, text, numeric, text, bigint, text)',
  'taskfence_dispatch_next_batch_v2(text, text[], text[], text, text, text, numeric, integer, bigint, bigint, text)',
  'taskfence_dispatch_next_v2(text, text, text, text, text, numeric, text, bigint, bigint, text)',
  'taskfence_dispatch_next_batch_v3(text, text[], text[], text, text, text, numeric, integer, bigint, bigint, text)',
  'taskfence_complete_dispatch_v3(text, bigint, bigint, boolean, text)',
  'taskfence_complete_dispatch_v4(text, text, bigint, bigint, boolean, text, boolean, text, text, text, numeric, text, bigint, text)',
  'taskfence_receive_messages_v1(text, bigint, integer, bigint, text, integer)',
  'taskfence_deliver_messages_v1(text, bigint, integer, integer)',
  'taskfence_grant_paths_v1(text, text, text, bigint, bigint, text[], text[], text[], text[])',
  'taskfence_dispatch_next_batch_v4(text, text[], text[], text, text, text, numeric, integer, bigint, bigint, text)',
  'taskfence_receive_messages_v2(text, bigint, integer, bigint, text, integer)',
  'taskfence_deliver_messages_v2(text, bigint, integer, integer)',
  'taskfence_claim_workspace_lock_v1(text, text, text, bigint, bigint)',
] as const;

export const migration0112: MigrationDefinition = {
  version: 112,
  name: 'functions_without_jit',
  async up({ db, types }) {
    if (!types.storedFunctions) return;
    for (const fn of FUNCTIONS) {
      const [name, args] = fn.split('(') as [string, string];
      await sql`alter function ${tableIn(db, name)}(${sql.raw(args)} set jit = off`.execute(db);
    }
  },
  async down({ db, types }) {
    if (!types.storedFunctions) return;
    for (const fn of FUNCTIONS) {
      const [name, args] = fn.split('(') as [string, string];
      await sql`alter function ${tableIn(db, name)}(${sql.raw(args)} reset jit`.execute(db);
    }
  },
};
