/**
 * PostgreSQL's folded statements of `store.dispatches` (dialects with writable CTEs and stored
 * functions): one call's guards, claim and writes in one statement, a call of a function
 * migrations 0101–0104 installed, so a hot call is one round trip with BEGIN and COMMIT, and its
 * plan is kept per connection (0104: in forms whose kept plans hold as the tables grow). SQLite runs the same steps as separate statements (index.ts), where a
 * statement costs no round trip. ARCHITECTURE.md, "Fewer round trips", gives the rule.
 */
import { sql } from 'kysely';
import { prepared } from '../../query/prepared.js';
import { tableIn } from '../../query/schema.js';
import type { DispatchContextRow } from '../../schema/database.js';

interface ClaimNextParams {
  readonly runId: string;
  readonly terminalHandle: string;
  readonly agentId: string | null;
  /** `any`, `unassigned` (no assignee) or `assignee` (`assignee`'s tasks). */
  readonly assigneeMode: 'any' | 'unassigned' | 'assignee';
  readonly assignee: string | null;
  /** The lowest priority to claim, or null for any. */
  readonly minPriority: number | null;
  readonly id: string;
  readonly now: number;
  readonly expiresAt: number;
  readonly traceContext: string | null;
}

/** `CLAIM_NEXT`'s row: the guards' reads, and the dispatch made (null when none was). */
export interface ClaimNextRow {
  run_status: string;
  agent_found: string | null;
  busy_id: string | null;
  made: DispatchContextRow | null;
}

/**
 * `dispatchNext` in one statement: a call of `taskfence_dispatch_next_v2` (migration 0104; 0101's v1 with kept plans that hold), the
 * steps of the SQLite path in the same order:
 * - `g` reads the guards: the run's status, the agent (when one is given), the terminal's newest
 *   active dispatch. Plain reads, no locks, as the separate read was;
 * - `pick` claims the run's best ready task whose dependencies are all done (`FOR UPDATE SKIP
 *   LOCKED`, re-checking `ready`), only when every guard passed (a one-time filter: a refused
 *   call locks and writes nothing);
 * - `dropped` deletes the task's earlier path claim, and `made` inserts the dispatch with its lease.
 *
 * The caller reads the guards from the one row (none: the run does not exist) and refuses in the
 * order of the separate reads. A second active dispatch on the terminal, made by a racing call,
 * still violates the one-active-per-terminal index. The function keeps its plan per connection.
 */
export const CLAIM_NEXT = prepared(
  (db, p: ClaimNextParams) =>
    sql<ClaimNextRow>`select o_run_status as run_status, o_agent_found as agent_found, o_busy_id as busy_id,
      o_made as made
    from ${tableIn(db, 'taskfence_dispatch_next_v2')}(${p.runId}::text, ${p.terminalHandle}::text, ${p.agentId}::text,
      ${p.assigneeMode}::text, ${p.assignee}::text, ${p.minPriority}::numeric, ${p.id}::text, ${p.now}::bigint,
      ${p.expiresAt}::bigint, ${p.traceContext}::text)`,
);

interface ClaimNextBatchParams extends Omit<ClaimNextParams, 'terminalHandle' | 'id'> {
  /** The terminals, a JSON array of strings (a value BEGIN can carry as a literal). */
  readonly terminalHandles: string;
  /** One new dispatch id per terminal, in the same order, a JSON array of strings. */
  readonly ids: string;
  readonly limit: number;
}

/** `CLAIM_NEXT_BATCH`'s row: the guards' reads and the dispatches made, in the terminals' order. */
export interface ClaimNextBatchRow {
  run_status: string;
  agent_found: string | null;
  made: DispatchContextRow[];
}

/**
 * `dispatchNextBatch` in one statement: a call of `taskfence_dispatch_next_batch_v4` (migration
 * 0107; v1 of 0101 with its rows as `json` as v2 of 0103, plans that hold as the tables grow as
 * v3 of 0104, and the busy terminals found by one probe each),
 * set-based: the terminals without an active dispatch in the caller's order, the best
 * ready tasks (as `CLAIM_NEXT` picks) up to their number and `limit` (`FOR UPDATE SKIP LOCKED`),
 * the n-th best task to the n-th free terminal, each task's earlier path claim dropped. The
 * guards are `CLAIM_NEXT`'s (the run, the agent); a refused call claims and writes nothing.
 * No row: the run does not exist.
 */
export const CLAIM_NEXT_BATCH = prepared(
  (db, p: ClaimNextBatchParams) =>
    sql<ClaimNextBatchRow>`select o_run_status as run_status, o_agent_found as agent_found, o_made as made
    from ${tableIn(db, 'taskfence_dispatch_next_batch_v4')}(${p.runId}::text,
      (select coalesce(array_agg(h order by i), '{}') from jsonb_array_elements_text(${p.terminalHandles}::jsonb)
        with ordinality as x(h, i)),
      (select coalesce(array_agg(h order by i), '{}') from jsonb_array_elements_text(${p.ids}::jsonb)
        with ordinality as x(h, i)),
      ${p.agentId}::text, ${p.assigneeMode}::text, ${p.assignee}::text, ${p.minPriority}::numeric, ${p.limit}::integer,
      ${p.now}::bigint, ${p.expiresAt}::bigint, ${p.traceContext}::text)`,
);

interface CompleteParams {
  readonly id: string;
  readonly token: number | null;
  readonly now: number;
  /** Set the task's `result` to `result` (else it is kept). */
  readonly setResult: boolean;
  readonly result: string | null;
}

/** `COMPLETE`'s row: the dispatch as read (with its task's open gate), whether it ended, and its task once moved. */
export interface CompleteRow {
  dispatch: DispatchContextRow;
  open_gate_id: string | null;
  ended: boolean;
  moved_task: Record<string, unknown> | null;
  /** The task as the statement's snapshot saw it, before `moved`. */
  task_before: Record<string, unknown> | null;
}

/**
 * `completeDispatch`'s read and writes: a call of `taskfence_complete_dispatch_v3` (migration
 * 0104; 0101's v1 with kept plans that hold), the caller holding the task's key (taken with
 * BEGIN), so its first snapshot sees every
 * earlier report:
 * - it reads the dispatch and its task's oldest open gate, as `reportable`'s read did;
 * - it completes the dispatch only when the report may be made: active, the lease's token (when
 *   given) its `seq`, no open gate. The caller refuses from the row when it did not, as
 *   `checkReport` does;
 * - it moves the task, if still in flight, to `done` (with `result` when `setResult`);
 * - then, once the task moved, its dependents' lock and move (`propagateFinish` for `done`), each
 *   its own statement, so each waits and then reads a fresh snapshot.
 * No row: no dispatch has the id.
 */
export const COMPLETE = prepared(
  (db, p: CompleteParams) =>
    sql<CompleteRow>`select o_dispatch as dispatch, o_open_gate_id as open_gate_id, o_ended as ended,
      o_moved_task as moved_task, o_task_before as task_before
    from ${tableIn(db, 'taskfence_complete_dispatch_v3')}(${p.id}::text, ${p.token}::bigint, ${p.now}::bigint,
      ${p.setResult}::boolean, ${p.result}::text)`,
);

/** `COMPLETE`'s parameters, and `CLAIM_NEXT`'s for the next claim (its run and terminal are the dispatch's). */
interface CompleteV2Params
  extends CompleteParams,
    Pick<ClaimNextParams, 'agentId' | 'assigneeMode' | 'assignee' | 'minPriority' | 'expiresAt' | 'traceContext'> {
  /** The task key's prefix as `lockKey` scopes it: `lockKeyText(dispatchTaskLockKey(''))`. */
  readonly keyPrefix: string;
  /** Claim the terminal's next task after the completion (`completeDispatch`'s `next`). */
  readonly next: boolean;
  /** The next dispatch's id. */
  readonly nextId: string;
}

/** `COMPLETE_V2`'s row: `COMPLETE`'s, the next claim's agent and run reads, and the next dispatch (null when none was made). */
export interface CompleteV2Row extends Omit<CompleteRow, 'dispatch'> {
  /** Null only when the next claim's agent was missing (nothing was read or written). */
  dispatch: DispatchContextRow | null;
  agent_found: string | null;
  run_status: string | null;
  next: DispatchContextRow | null;
}

/**
 * `completeDispatch` in one statement that takes the task's key itself, and with `next` the
 * terminal's next claim: a call of `taskfence_complete_dispatch_v4` (migration 0104; 0102's v2): the next
 * claim's agent read (a missing one: nothing else), the task key, `COMPLETE`, then, only with
 * `next` and once the dispatch ended, `CLAIM_NEXT` for its run and terminal. No row: no dispatch
 * has the id.
 */
export const COMPLETE_V2 = prepared(
  (db, p: CompleteV2Params) =>
    sql<CompleteV2Row>`select o_dispatch as dispatch, o_open_gate_id as open_gate_id, o_ended as ended,
      o_moved_task as moved_task, o_task_before as task_before, o_agent_found as agent_found,
      o_run_status as run_status, o_next as next
    from ${tableIn(db, 'taskfence_complete_dispatch_v4')}(${p.keyPrefix}::text, ${p.id}::text, ${p.token}::bigint,
      ${p.now}::bigint, ${p.setResult}::boolean, ${p.result}::text, ${p.next}::boolean, ${p.agentId}::text,
      ${p.assigneeMode}::text, ${p.assignee}::text, ${p.minPriority}::numeric, ${p.nextId}::text, ${p.expiresAt}::bigint,
      ${p.traceContext}::text)`,
);
