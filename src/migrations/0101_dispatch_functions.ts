import { sql, type Kysely } from 'kysely';
import { tableIn } from '../query/schema.js';
import type { MigrationDefinition } from './types.js';

/**
 * The dispatch cycle's statements as PL/pgSQL functions (issue 24), PostgreSQL only: a function
 * keeps its statements' plans for the connection, where a statement sent by the client is parsed
 * and planned on every call (about half the server time of a claim). No session state: the plans
 * are the server's own cache, so a transaction-mode pooler is unaffected.
 *
 * - `taskfence_dispatch_next_v1`: `dispatchNext`'s guards and claim, the statement `CLAIM_NEXT`
 *   was (guards read in `g`; the claim only when they passed; the earlier path claim dropped; the
 *   dispatch inserted with its lease). The filters are parameters: assignee mode `any`,
 *   `unassigned` or `assignee`, and a minimum priority or null.
 * - `taskfence_dispatch_next_batch_v1`: `dispatchNextBatch` as one set-based statement: the free
 *   terminals in the caller's order, the best ready tasks up to their number and the limit
 *   (`FOR UPDATE SKIP LOCKED`), the n-th best task to the n-th free terminal; the same guards.
 * - `taskfence_complete_dispatch_v1`: `completeDispatch`'s read, end and task move (the statement
 *   `COMPLETE` was), then, when the task moved to done, its dependents' lock and move
 *   (`propagateFinish` for `done`), each a statement of its own, so each takes a fresh READ
 *   COMMITTED snapshot after the one before waited. The caller holds the task's key.
 *
 * Each returns its rows as `jsonb` (a row's columns as they are when it runs), so a column added
 * to a table later needs no new function. The `_v1` suffix is the contract: a change to what a
 * function does is a new function in a new migration, so a release still running calls the one
 * it knows. The literals are the lifecycle's own (`WAITING_REASON`, `FAILED_DEPENDENCY_REASON`).
 */
export const migration0101: MigrationDefinition = {
  version: 101,
  name: 'dispatch_functions',
  functions: ['taskfence_dispatch_next_v1', 'taskfence_dispatch_next_batch_v1', 'taskfence_complete_dispatch_v1'],
  async up({ db, types }) {
    if (!types.storedFunctions) return;
    await sql`${createDispatchNext(db)}`.execute(db);
    await sql`${createDispatchNextBatch(db)}`.execute(db);
    await sql`${createCompleteDispatch(db)}`.execute(db);
  },
  async down({ db, types }) {
    if (!types.storedFunctions) return;
    await sql`drop function if exists ${tableIn(db, 'taskfence_complete_dispatch_v1')}(text, bigint, bigint, boolean, text)`.execute(
      db,
    );
    await sql`drop function if exists ${tableIn(db, 'taskfence_dispatch_next_batch_v1')}(text, text[], text[], text, text, text, numeric, integer, bigint, bigint, text)`.execute(
      db,
    );
    await sql`drop function if exists ${tableIn(db, 'taskfence_dispatch_next_v1')}(text, text, text, text, text, numeric, text, bigint, bigint, text)`.execute(
      db,
    );
  },
};

/**
 * Kept plans (0104). PL/pgSQL switches a statement to a generic plan after a few calls, planned
 * once with the statistics of that moment, and keeps it for the connection until the table is
 * analyzed again. Planned while the tables were small, such a plan served a row's status test
 * from a status index and then read every row of that status to find one row: once thousands of
 * dispatches were active or tasks ready, a claim or a completion read them all (a completion 12
 * times slower, a batch of 100 15 times). The 0104 versions therefore state a status re-check of
 * a row found by its key as `(… = …) is true`, which no index can serve; lock a completed
 * task's dependents one by one by key; and run the statements that join rows to judge them (a
 * batch's busy terminals, the dependents' move) with `EXECUTE`, planned per call with the real
 * values, only where they run: once per batch, once per completion that has waiting dependents.
 */
const STILL_READY = sql`(status = 'ready') is true`;

/**
 * The run's tasks a claim may take (`t`): ready, every dependency done, and the filters (assignee
 * mode, minimum priority). Shared by the single and the batch claim.
 */
function claimable(db: Kysely<any>) {
  const tasks = tableIn(db, 'tasks');
  return sql`t.coordinator_run_id = p_run and t.status = 'ready'
    and not exists (select 1 from ${tableIn(db, 'task_dependencies')} dd join ${tasks} dep on dep.id = dd.depends_on_id
      where dd.task_id = t.id and dep.status <> 'done')
    and (p_assignee_mode = 'any'
      or (p_assignee_mode = 'unassigned' and t.assignee_agent_id is null)
      or (p_assignee_mode = 'assignee' and t.assignee_agent_id = p_assignee))
    and (p_min_priority is null or t.priority >= p_min_priority)`;
}

/**
 * The single claim's function: `version` 1 (this migration); version 2 (0104) re-checks the picked
 * task's `ready` in a form no index can serve (see `STILL_READY`), so a kept plan reaches it by
 * primary key. Otherwise the same body.
 */
export function createDispatchNext(db: Kysely<any>, version: 1 | 2 = 1) {
  const tasks = tableIn(db, 'tasks');
  const dispatches = tableIn(db, 'dispatch_contexts');
  const stillReady = version === 1 ? sql`status = 'ready'` : STILL_READY;
  return sql`create or replace function ${tableIn(db, `taskfence_dispatch_next_v${version}`)}(
    p_run text, p_terminal text, p_agent text, p_assignee_mode text, p_assignee text, p_min_priority numeric,
    p_id text, p_now bigint, p_expires_at bigint, p_trace text)
  returns table (o_run_status text, o_agent_found text, o_busy_id text, o_made jsonb)
  language plpgsql volatile as $fn$
  begin
    return query
    with g as (
      select r.status as run_status,
        case when p_agent is null then null::text
          else (select a.id from ${tableIn(db, 'agents')} a where a.id = p_agent) end as agent_found,
        (select d.id from ${dispatches} d where d.terminal_handle = p_terminal and d.status = 'active'
          order by d.seq desc limit 1) as busy_id
      from ${tableIn(db, 'coordinator_runs')} r where r.id = p_run
    ), pick as (
      update ${tasks} set status = 'dispatched', updated_at = p_now
      where id = (
        select t.id from ${tasks} t
        where ${claimable(db)}
          and exists (select 1 from g where g.run_status = 'running' and g.busy_id is null
            and (p_agent is null or g.agent_found is not null))
        order by t.priority desc, t.seq
        limit 1
        for update skip locked)
      and ${stillReady}
      returning id, coordinator_run_id
    ), dropped as (
      delete from ${tableIn(db, 'path_lease_claims')} where task_id in (select id from pick)
    ), made as (
      insert into ${dispatches} (id, task_id, agent_id, terminal_handle, status, error, created_at, updated_at,
        ended_at, coordinator_run_id, lease_expires_at, trace_context)
      select p_id, pick.id, p_agent, p_terminal, 'active', null, p_now, p_now, null, pick.coordinator_run_id,
        p_expires_at, p_trace
      from pick
      returning *
    )
    select g.run_status, g.agent_found, g.busy_id, (select to_jsonb(made) from made) from g;
  end
  $fn$`;
}

/**
 * The batch claim's function. `version` 1 (this migration) returns the dispatches made as `jsonb`;
 * version 2 (0103) the same rows as `json`; version 3 (0104) is v2 with plans that stay right as
 * the tables grow (below). The body is otherwise shared: a change to it is a new version in a new
 * migration, never an edit here (a fresh database would get another v1).
 *
 * Why v3: PL/pgSQL keeps a statement's plan per connection, and after a few calls a generic one,
 * planned once with the statistics of that moment. A connection that first called v2 when the
 * tables were small kept a plan that, once thousands of dispatches were active, scanned every
 * active dispatch per terminal (through `dispatch_contexts_lease_idx`) and reached each picked
 * task through `tasks_status_idx` (a batch of 100: 120 ms instead of 8). v3 finds the busy
 * terminals with `EXECUTE`, planned on every call with the real values (one small query), and
 * re-checks the picked tasks' `ready` in a form no index can serve (`STILL_READY`), so they are
 * reached by primary key. Forcing custom plans for the whole statement would do too, but
 * planning it costs about 2 ms a call.
 *
 * Why v4 (0107): planned per call, v3's `terminal_handle = any(…) and status = 'active'` still
 * read every active dispatch of the store when the statistics said few were active. Before a
 * table's first ANALYZE the planner takes `status = 'active'` for 0.5% of its rows, so below
 * about 200 active dispatches per terminal asked it preferred one pass over all of them (through
 * `dispatch_contexts_lease_idx`) to a probe per terminal: 111,270 rows for ten batches of 100
 * at 10,000 active. v4 asks per terminal, from `unnest(…)` by a `LATERAL` subquery with a
 * `LIMIT`, which is not flattened: one probe of `dispatch_contexts_one_active_per_terminal` each.
 */
export function createDispatchNextBatch(db: Kysely<any>, version: 1 | 2 | 3 | 4 = 1) {
  const tasks = tableIn(db, 'tasks');
  const dispatches = tableIn(db, 'dispatch_contexts');
  const json = version === 1 ? sql`jsonb` : sql`json`;
  const made =
    version === 1
      ? sql`coalesce(jsonb_agg(to_jsonb(made) order by free.n), '[]'::jsonb)`
      : sql`coalesce(json_agg(made order by free.n), '[]'::json)`;
  const v3 = version >= 3;
  const busyQuery =
    version >= 4
      ? sql`'select coalesce(array_agg(b.handle), ''{}'') from unnest($1) as u(handle)
      cross join lateral (select d.terminal_handle as handle from ${dispatches} d
        where d.terminal_handle = u.handle and d.status = ''active'' limit 1) b'`
      : sql`'select coalesce(array_agg(d.terminal_handle), ''{}'') from ${dispatches} d
      where d.terminal_handle = any($1) and d.status = ''active'''`;
  const busy = v3
    ? sql`
  declare
    v_busy text[];
  begin
    execute ${busyQuery} into v_busy using p_terminals;
    return query`
    : sql`
  begin
    return query`;
  const free = v3
    ? sql`f.handle <> all(v_busy)`
    : sql`not exists (select 1 from ${dispatches} d where d.terminal_handle = f.handle and d.status = 'active')`;
  const stillReady = v3 ? sql` and (${tasks}.status = 'ready') is true` : sql` and ${tasks}.status = 'ready'`;
  return sql`create or replace function ${tableIn(db, `taskfence_dispatch_next_batch_v${version}`)}(
    p_run text, p_terminals text[], p_ids text[], p_agent text, p_assignee_mode text, p_assignee text,
    p_min_priority numeric, p_limit integer, p_now bigint, p_expires_at bigint, p_trace text)
  returns table (o_run_status text, o_agent_found text, o_made ${json})
  language plpgsql volatile as $fn$${busy}
    with g as (
      select r.status as run_status,
        case when p_agent is null then null::text
          else (select a.id from ${tableIn(db, 'agents')} a where a.id = p_agent) end as agent_found
      from ${tableIn(db, 'coordinator_runs')} r where r.id = p_run
    ), free as (
      select f.handle, f.id, row_number() over (order by f.ord) as n
      from unnest(p_terminals, p_ids) with ordinality as f(handle, id, ord)
      where ${free}
    ), locked as (
      select t.id, t.coordinator_run_id, t.priority, t.seq from ${tasks} t
      where ${claimable(db)}
        and exists (select 1 from g where g.run_status = 'running' and (p_agent is null or g.agent_found is not null))
      order by t.priority desc, t.seq
      limit least(p_limit, (select count(*) from free))
      for update skip locked
    ), ranked as (
      select locked.id, locked.coordinator_run_id, row_number() over (order by locked.priority desc, locked.seq) as n
      from locked
    ), pick as (
      update ${tasks} set status = 'dispatched', updated_at = p_now
      from ranked where ${tasks}.id = ranked.id${stillReady}
      returning ${tasks}.id, ranked.coordinator_run_id, ranked.n
    ), dropped as (
      delete from ${tableIn(db, 'path_lease_claims')} where task_id in (select id from pick)
    ), made as (
      insert into ${dispatches} (id, task_id, agent_id, terminal_handle, status, error, created_at, updated_at,
        ended_at, coordinator_run_id, lease_expires_at, trace_context)
      select free.id, pick.id, p_agent, free.handle, 'active', null, p_now, p_now, null, pick.coordinator_run_id,
        p_expires_at, p_trace
      from pick join free on free.n = pick.n
      returning *
    )
    select g.run_status, g.agent_found,
      (select ${made}
        from made join free on free.handle = made.terminal_handle)
    from g;
  end
  $fn$`;
}

/**
 * The completion's function: `version` 1 (this migration); version 3 (0104; v2 is 0102's
 * composition) states its status tests of rows found by key as `(…) is true` and locks and
 * moves the dependents one by one by key (`dependentsByKey`; see `STILL_READY`). Otherwise the
 * same body.
 */
export function createCompleteDispatch(db: Kysely<any>, version: 1 | 3 = 1) {
  const tasks = tableIn(db, 'tasks');
  const deps = tableIn(db, 'task_dependencies');
  const dispatches = tableIn(db, 'dispatch_contexts');
  const gates = tableIn(db, 'decision_gates');
  const v3 = version === 3;
  const keyed = (test: ReturnType<typeof sql>) => (v3 ? sql`(${test}) is true` : test);
  return sql`create or replace function ${tableIn(db, `taskfence_complete_dispatch_v${version}`)}(
    p_id text, p_token bigint, p_now bigint, p_set_result boolean, p_result text)
  returns table (o_dispatch jsonb, o_open_gate_id text, o_ended boolean, o_moved_task jsonb, o_task_before jsonb)
  language plpgsql volatile as $fn$
  declare
    v_task text;${
      v3
        ? sql`
    v_dep text;
    v_locked text[] := '{}';`
        : sql``
    }
  begin
    with d as (
      select dc.id, dc.task_id, dc.seq, to_jsonb(dc) as row,
        (select g.id from ${gates} g where g.task_id = dc.task_id and ${keyed(sql`g.status = 'open'`)}
          order by g.created_at, g.id limit 1) as open_gate_id
      from ${dispatches} dc where dc.id = p_id
    ), ended as (
      update ${dispatches} set status = 'completed', updated_at = p_now, ended_at = p_now
      where id = p_id and ${keyed(sql`status = 'active'`)}
        and exists (select 1 from d where d.open_gate_id is null and d.seq = coalesce(p_token, d.seq))
      returning task_id
    ), moved as (
      update ${tasks} set status = 'done', updated_at = p_now, blocked_reason = null,
        result = case when p_set_result then p_result else ${tasks}.result end
      where id = (select task_id from ended) and ${keyed(sql`status in ('dispatched', 'in_progress')`)}
      returning *
    )
    select d.row, d.open_gate_id, exists (select 1 from ended), (select to_jsonb(moved) from moved),
      (select to_jsonb(t) from ${tasks} t where t.id = d.task_id), d.task_id
    into o_dispatch, o_open_gate_id, o_ended, o_moved_task, o_task_before, v_task
    from d;
    if not found then
      return;
    end if;
    if o_moved_task is not null then${
      v3
        ? dependentsByKey(db)
        : sql`
      -- The dependents, locked in id order, then moved: each its own statement and snapshot.
      perform 1 from ${tasks}
      where id in (select task_id from ${deps} where depends_on_id = v_task) and status in ('blocked', 'ready')
      order by id
      for update;
      -- None locked: none to move (the same shortcut as propagateFinish's).
      if found then
        update ${tasks} set status = 'ready', blocked_reason = null, updated_at = p_now
      where ${tasks}.id in (select task_id from ${deps} where depends_on_id = v_task)
        and ${tasks}.status = 'blocked'
        and (${tasks}.blocked_reason like 'dependencies: waiting for %'
          or ${tasks}.blocked_reason like 'dependency_failed: %')
        and not exists (
          select 1 from ${deps} dd join ${tasks} t on t.id = dd.depends_on_id
          where dd.task_id = ${tasks}.id and t.status <> 'done')
        and not exists (select 1 from ${gates} g where g.task_id = ${tasks}.id and g.status = 'open');
      end if;`
    }
    end if;
    return next;
  end
  $fn$`;
}

/**
 * v3's dependents' lock and move. The lock is v1's, one dependent at a time in id order from
 * `task_dependencies` (its index on `(depends_on_id, task_id)` gives the order), each locked by
 * primary key: a completion without waiting dependents pays one index read. The move, only when
 * some dependent was locked, is v1's UPDATE over the locked ids, run with `EXECUTE`: its
 * dependency and gate checks join other rows, and a kept plan made on small tables joined them
 * by scanning `tasks` (10 ms a move at 20,000 tasks); planned per call it costs about 0.1 ms
 * more. It takes its own snapshot after every lock is held, as v1's did. The whole part with
 * `EXECUTE` cost every completion about 0.3 ms of planning, which is why the lock goes by key.
 */
function dependentsByKey(db: Kysely<any>) {
  const tasks = tableIn(db, 'tasks');
  const deps = tableIn(db, 'task_dependencies');
  const gates = tableIn(db, 'decision_gates');
  return sql`
      -- The dependents, locked in id order, then moved: each its own statement and snapshot.
      for v_dep in select d.task_id from ${deps} d where d.depends_on_id = v_task order by d.task_id loop
        perform 1 from ${tasks} t where t.id = v_dep and (t.status in ('blocked', 'ready')) is true for update;
        if found then
          v_locked := v_locked || v_dep;
        end if;
      end loop;
      -- None locked: none to move (the same shortcut as propagateFinish's).
      if cardinality(v_locked) > 0 then
        execute 'update ${tasks} set status = ''ready'', blocked_reason = null, updated_at = $2
        where ${tasks}.id = any($1)
          and (${tasks}.status = ''blocked'') is true
          and (${tasks}.blocked_reason like ''dependencies: waiting for %''
            or ${tasks}.blocked_reason like ''dependency_failed: %'')
          and not exists (
            select 1 from ${deps} dd join ${tasks} t on t.id = dd.depends_on_id
            where dd.task_id = ${tasks}.id and t.status <> ''done'')
          and not exists (select 1 from ${gates} g where g.task_id = ${tasks}.id and (g.status = ''open'') is true)'
        using v_locked, p_now;
      end if;`;
}
