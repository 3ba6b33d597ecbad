import { sql, type Kysely } from 'kysely';
import { tableIn } from '../query/schema.js';
import type { MigrationDefinition } from './types.js';

/**
 * `completeDispatch` in one statement that takes its own key, and with `next` the worker loop's
 * step (issue 24), PostgreSQL only: a worker's completion and its terminal's next claim in one
 * transaction and one round trip, the way Temporal hands a worker its next task with the
 * completion's reply.
 *
 * `taskfence_complete_dispatch_v2` composes the two functions of 0101 and adds only the order:
 * 1. the next claim's agent, when one is given, is read first: a missing one returns a row
 *    with `o_agent_found` null and nothing else, so the call refuses having written nothing;
 * 2. the dispatch's task id is read, and the task's key taken (`p_key_prefix` || task id: the
 *    same key `lockKey(dispatchTaskLockKey(taskId))` takes, schema prefix included), so the
 *    caller need not send the key's read with BEGIN; no row when no dispatch has the id;
 * 3. `taskfence_complete_dispatch_v1`, its statements each with a snapshot taken after the key
 *    was held; a refused completion (`o_ended` false) claims nothing;
 * 4. only with `p_next` and once the dispatch ended: `taskfence_dispatch_next_v1` for the
 *    completed dispatch's run and terminal, with a fresh snapshot, so it sees the completion and
 *    the dependents it made ready. A run that no longer runs claims nothing (`o_run_status`
 *    says why); the completion stands.
 *
 * Additive: releases that do not know it keep calling v1, so the compatibility window is kept.
 */
export const migration0102: MigrationDefinition = {
  version: 102,
  name: 'complete_and_next',
  functions: ['taskfence_complete_dispatch_v2'],
  async up({ db, types }) {
    if (!types.storedFunctions) return;
    await sql`${createCompleteV2(db)}`.execute(db);
  },
  async down({ db, types }) {
    if (!types.storedFunctions) return;
    await sql`drop function if exists ${tableIn(db, 'taskfence_complete_dispatch_v2')}(text, text, bigint, bigint, boolean, text, boolean, text, text, text, numeric, text, bigint, text)`.execute(
      db,
    );
  },
};

/**
 * The composition's function: `version` 2 (this migration) composes 0101's v1 functions; version
 * 4 (0104) composes their 0104 versions (`taskfence_complete_dispatch_v3`,
 * `taskfence_dispatch_next_v2`). Otherwise the same body.
 */
export function createCompleteV2(db: Kysely<any>, version: 2 | 4 = 2) {
  const complete = version === 2 ? 'taskfence_complete_dispatch_v1' : 'taskfence_complete_dispatch_v3';
  const next = version === 2 ? 'taskfence_dispatch_next_v1' : 'taskfence_dispatch_next_v2';
  return sql`create or replace function ${tableIn(db, `taskfence_complete_dispatch_v${version}`)}(
    p_key_prefix text, p_id text, p_token bigint, p_now bigint, p_set_result boolean, p_result text,
    p_next boolean, p_agent text, p_assignee_mode text, p_assignee text, p_min_priority numeric,
    p_next_id text, p_expires_at bigint, p_trace text)
  returns table (o_dispatch jsonb, o_open_gate_id text, o_ended boolean, o_moved_task jsonb, o_task_before jsonb,
    o_agent_found text, o_run_status text, o_next jsonb)
  language plpgsql volatile as $fn$
  declare
    v_task text;
  begin
    if p_next and p_agent is not null then
      select a.id into o_agent_found from ${tableIn(db, 'agents')} a where a.id = p_agent;
      if o_agent_found is null then
        return next;
        return;
      end if;
    end if;
    select dc.task_id into v_task from ${tableIn(db, 'dispatch_contexts')} dc where dc.id = p_id;
    if not found then
      return;
    end if;
    perform pg_advisory_xact_lock(hashtextextended(p_key_prefix || v_task, 0));
    select c.o_dispatch, c.o_open_gate_id, c.o_ended, c.o_moved_task, c.o_task_before
    into o_dispatch, o_open_gate_id, o_ended, o_moved_task, o_task_before
    from ${tableIn(db, complete)}(p_id, p_token, p_now, p_set_result, p_result) c;
    if not found then
      return;
    end if;
    if p_next and o_ended and o_dispatch->>'coordinator_run_id' is not null then
      select n.o_run_status, n.o_made
      into o_run_status, o_next
      from ${tableIn(db, next)}(o_dispatch->>'coordinator_run_id', o_dispatch->>'terminal_handle',
        p_agent, p_assignee_mode, p_assignee, p_min_priority, p_next_id, p_now, p_expires_at, p_trace) n;
    end if;
    return next;
  end
  $fn$`;
}
