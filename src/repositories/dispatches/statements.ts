/**
 * PostgreSQL's folded statements of `store.dispatches` (dialects with writable CTEs): one call's
 * guards, claim and writes in one statement, so a hot call makes three round trips (BEGIN, the
 * statement, COMMIT). SQLite runs the same steps as separate statements (index.ts), where a
 * statement costs no round trip. ARCHITECTURE.md, "Fewer round trips", gives the rule.
 */
import { sql } from 'kysely';
import { prepared } from '../../query/prepared.js';
import { tableIn } from '../../query/schema.js';
import type { DispatchContextRow } from '../../schema/database.js';

/** `CLAIM_NEXT`'s shape: whether an agent is checked, the assignee filter, and a minimum priority. */
export type ClaimNextShape = `${'agent' | 'no-agent'}|${'any' | 'unassigned' | 'assignee'}|${'min' | 'all'}`;

interface ClaimNextParams {
  readonly runId: string;
  readonly terminalHandle: string;
  readonly agentId: string | null;
  readonly assignee: string | null;
  readonly minPriority: number;
  readonly id: string;
  readonly now: number;
  readonly expiresAt: number;
  readonly traceContext: string | null;
}

/** `CLAIM_NEXT`'s row: the guards' reads, and the dispatch made (its columns null when none was). */
export type ClaimNextRow = { run_status: string; agent_found: string | null; busy_id: string | null } & {
  [K in keyof DispatchContextRow]: DispatchContextRow[K] | null;
};

/**
 * `dispatchNext` in one statement, the steps of the SQLite path in the same order:
 * - `g` reads the guards: the run's status, the agent (when one is given), the terminal's newest
 *   active dispatch. Plain reads, no locks, as the separate read was;
 * - `pick` claims the run's best ready task whose dependencies are all done (`FOR UPDATE SKIP
 *   LOCKED`, re-checking `ready`), only when every guard passed (a one-time filter: a refused
 *   call locks and writes nothing);
 * - `dropped` deletes the task's earlier path claim, and `made` inserts the dispatch with its lease.
 *
 * The caller reads the guards from the one row (none: the run does not exist) and refuses in the
 * order of the separate reads. A second active dispatch on the terminal, made by a racing call,
 * still violates the one-active-per-terminal index.
 */
export const CLAIM_NEXT = prepared((db, p: ClaimNextParams, shape: ClaimNextShape) => {
  const [agent, assignee, min] = shape.split('|');
  const tasks = tableIn(db, 'tasks');
  const dispatches = tableIn(db, 'dispatch_contexts');
  const agentFound =
    agent === 'agent' ? sql`(select a.id from ${tableIn(db, 'agents')} a where a.id = ${p.agentId})` : sql`null::text`;
  const assigneeFilter =
    assignee === 'unassigned'
      ? sql`and t.assignee_agent_id is null`
      : assignee === 'assignee'
        ? sql`and t.assignee_agent_id = ${p.assignee}`
        : sql``;
  const minFilter = min === 'min' ? sql`and t.priority >= ${p.minPriority}` : sql``;
  const agentGuard = agent === 'agent' ? sql`and g.agent_found is not null` : sql``;
  return sql<ClaimNextRow>`with g as (
      select r.status as run_status, ${agentFound} as agent_found,
        (select d.id from ${dispatches} d where d.terminal_handle = ${p.terminalHandle} and d.status = 'active'
          order by d.seq desc limit 1) as busy_id
      from ${tableIn(db, 'coordinator_runs')} r where r.id = ${p.runId}
    ), pick as (
      update ${tasks} set status = 'dispatched', updated_at = ${p.now}
      where id = (
        select t.id from ${tasks} t
        where t.coordinator_run_id = ${p.runId} and t.status = 'ready'
          and not exists (select 1 from ${tableIn(db, 'task_dependencies')} d join ${tasks} dep on dep.id = d.depends_on_id
            where d.task_id = t.id and dep.status <> 'done')
          ${assigneeFilter} ${minFilter}
          and exists (select 1 from g where g.run_status = 'running' and g.busy_id is null ${agentGuard})
        order by t.priority desc, t.seq
        limit 1
        for update skip locked)
      and status = 'ready'
      returning id, coordinator_run_id
    ), dropped as (
      delete from ${tableIn(db, 'path_lease_claims')} where task_id in (select id from pick)
    ), made as (
      insert into ${dispatches} (id, task_id, agent_id, terminal_handle, status, error, created_at, updated_at,
        ended_at, coordinator_run_id, lease_expires_at, trace_context)
      select ${p.id}::text, pick.id, ${p.agentId}::text, ${p.terminalHandle}::text, 'active', null, ${p.now}::bigint,
        ${p.now}::bigint, null, pick.coordinator_run_id, ${p.expiresAt}::bigint, ${p.traceContext}::text
      from pick
      returning *
    )
    select g.run_status, g.agent_found, g.busy_id, made.* from g left join made on true`;
});

interface CompleteParams {
  readonly id: string;
  readonly token: number | null;
  readonly now: number;
  readonly result: string | null;
}

/** `COMPLETE`'s row: the dispatch as read (with its task's open gate), whether it ended, and its task once moved. */
export type CompleteRow = DispatchContextRow & {
  open_gate_id: string | null;
  ended: boolean;
  moved_task: Record<string, unknown> | null;
  /** The task as the statement's snapshot saw it, before `moved`. */
  task_before: Record<string, unknown> | null;
};

/**
 * `completeDispatch`'s read and writes in one statement, the caller holding the task's key (taken
 * with BEGIN), so its snapshot sees every earlier report:
 * - `d` reads the dispatch and its task's oldest open gate, as `reportable`'s read did;
 * - `ended` completes it only when the report may be made: active, the lease's token (when given)
 *   its `seq`, no open gate. The caller refuses from `d` when it did not, as `checkReport` does;
 * - `moved` moves the task, if still in flight, to `done` (with `result` when `shape` is `set`).
 *
 * The dependents move in later statements (`propagateFinish`): their lock must be taken, and
 * their dependencies read, after this one waited for any row lock on the task.
 */
export const COMPLETE = prepared((db, p: CompleteParams, shape: 'set' | 'keep') => {
  const dispatches = tableIn(db, 'dispatch_contexts');
  const tasks = tableIn(db, 'tasks');
  return sql<CompleteRow>`with d as (
      select dc.*, (select g.id from ${tableIn(db, 'decision_gates')} g where g.task_id = dc.task_id and g.status = 'open'
        order by g.created_at, g.id limit 1) as open_gate_id
      from ${dispatches} dc where dc.id = ${p.id}
    ), ended as (
      update ${dispatches} set status = 'completed', updated_at = ${p.now}, ended_at = ${p.now}
      where id = ${p.id} and status = 'active'
        and exists (select 1 from d where d.open_gate_id is null and d.seq = coalesce(${p.token}::bigint, d.seq))
      returning task_id
    ), moved as (
      update ${tasks} set status = 'done', updated_at = ${p.now}, blocked_reason = null
        ${shape === 'set' ? sql`, result = ${p.result}` : sql``}
      where id = (select task_id from ended) and status in ('dispatched', 'in_progress')
      returning *
    )
    select d.*, exists (select 1 from ended) as ended, (select to_jsonb(moved) from moved) as moved_task,
      (select to_jsonb(t) from ${tasks} t where t.id = d.task_id) as task_before from d`;
});
