import { sql, type Kysely } from 'kysely';
import { tableIn } from '../query/schema.js';
import type { MigrationDefinition } from './types.js';

/**
 * `completeDispatch` with `next` as one PL/pgSQL function (issue 24), PostgreSQL only: a
 * worker's completion and its terminal's next claim in one transaction and one round trip, the
 * way Temporal hands a worker its next task with the completion's reply.
 *
 * `taskfence_complete_dispatch_next_v1` composes the two functions of 0101 and adds no SQL of its
 * own beyond the order:
 * 1. the next claim's agent, when one is given, is read first: a missing one returns a row
 *    with `o_agent_found` null and nothing else, so the call refuses having written nothing;
 * 2. `taskfence_complete_dispatch_v1` (the caller holds the task's key, taken with BEGIN): no
 *    row when no dispatch has the id; a refused completion (`o_ended` false) claims nothing;
 * 3. only once the dispatch ended: `taskfence_dispatch_next_v1` for the completed dispatch's
 *    run and terminal, each statement with its own snapshot, so it sees the completion and the
 *    dependents it made ready. A run that no longer runs claims nothing (`o_run_status` says
 *    why); the completion stands.
 *
 * Additive: releases that do not know it never call it, so the compatibility window is kept.
 */
export const migration0102: MigrationDefinition = {
  version: 102,
  name: 'complete_and_next',
  functions: ['taskfence_complete_dispatch_next_v1'],
  async up({ db, types }) {
    if (!types.storedFunctions) return;
    await sql`${createCompleteAndNext(db)}`.execute(db);
  },
  async down({ db, types }) {
    if (!types.storedFunctions) return;
    await sql`drop function if exists ${tableIn(db, 'taskfence_complete_dispatch_next_v1')}(text, bigint, bigint, boolean, text, text, text, text, numeric, text, bigint, text)`.execute(
      db,
    );
  },
};

function createCompleteAndNext(db: Kysely<any>) {
  return sql`create or replace function ${tableIn(db, 'taskfence_complete_dispatch_next_v1')}(
    p_id text, p_token bigint, p_now bigint, p_set_result boolean, p_result text,
    p_agent text, p_assignee_mode text, p_assignee text, p_min_priority numeric,
    p_next_id text, p_expires_at bigint, p_trace text)
  returns table (o_dispatch jsonb, o_open_gate_id text, o_ended boolean, o_moved_task jsonb, o_task_before jsonb,
    o_agent_found text, o_run_status text, o_next jsonb)
  language plpgsql volatile as $fn$
  begin
    if p_agent is not null then
      select a.id into o_agent_found from ${tableIn(db, 'agents')} a where a.id = p_agent;
      if o_agent_found is null then
        return next;
        return;
      end if;
    end if;
    select c.o_dispatch, c.o_open_gate_id, c.o_ended, c.o_moved_task, c.o_task_before
    into o_dispatch, o_open_gate_id, o_ended, o_moved_task, o_task_before
    from ${tableIn(db, 'taskfence_complete_dispatch_v1')}(p_id, p_token, p_now, p_set_result, p_result) c;
    if not found then
      return;
    end if;
    if o_ended and o_dispatch->>'coordinator_run_id' is not null then
      select n.o_run_status, n.o_made
      into o_run_status, o_next
      from ${tableIn(db, 'taskfence_dispatch_next_v1')}(o_dispatch->>'coordinator_run_id', o_dispatch->>'terminal_handle',
        p_agent, p_assignee_mode, p_assignee, p_min_priority, p_next_id, p_now, p_expires_at, p_trace) n;
    end if;
    return next;
  end
  $fn$`;
}
