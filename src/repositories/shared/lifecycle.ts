/**
 * The work lifecycle (issue 22): the one task–dispatch state machine, written down as data and
 * enforced by the repositories. Every status change of a task or a dispatch is a row of
 * `TASK_TRANSITIONS` or `DISPATCH_TRANSITIONS`, made by the call the row names; README "The work
 * lifecycle" renders the same tables (a unit test checks they match), and the lifecycle suite
 * walks every row.
 *
 * The helpers below run inside the caller's write transaction, so a dispatch's end and its
 * task's move, and a task's finish and its dependents' readiness, commit together.
 */
import { sql, type CompiledQuery, type Kysely, type Transaction } from 'kysely';
import { TaskfenceError } from '../../errors.js';
import { tableIn } from '../../query/schema.js';
import type { Database, DispatchContextRow, DispatchStatus, TaskRow, TaskStatus } from '../../schema/database.js';
import { LeaseLostError, type Lease, type LeaseLostReason } from './lease.js';
import { auditLeaseActs, type LeaseActRecord } from './audit.js';
import type { StoreContext } from '../context.js';

/** One allowed status change and the public call that makes it. */
export interface Transition<S extends string> {
  readonly from: S;
  readonly to: S;
  /** The call that makes it (`tasks.transitionTask`, `dispatches.completeDispatch`, …). */
  readonly call: string;
}

/**
 * The statuses a task may start in (`tasks.createTask`): the ones before any dispatch. A task is
 * never created in flight or finished; with open dependencies it is stored `blocked`.
 */
export const INITIAL_TASK_STATUSES = Object.freeze(['backlog', 'todo', 'ready', 'blocked'] as const);
export type InitialTaskStatus = (typeof INITIAL_TASK_STATUSES)[number];

/** What `tasks.transitionTask` may do: the general, guarded moves. */
const BY_CALLER: readonly (readonly [TaskStatus, TaskStatus])[] = [
  ['backlog', 'todo'],
  ['backlog', 'ready'],
  ['todo', 'backlog'],
  ['todo', 'ready'],
  ['ready', 'backlog'],
  ['ready', 'todo'],
  ['backlog', 'blocked'],
  ['todo', 'blocked'],
  ['ready', 'blocked'],
  ['blocked', 'ready'],
  ['blocked', 'todo'],
  ['blocked', 'backlog'],
  ['dispatched', 'in_progress'],
  // Cancel: an in-flight task's active dispatch ends `cancelled` in the same transaction.
  ['backlog', 'cancelled'],
  ['todo', 'cancelled'],
  ['ready', 'cancelled'],
  ['blocked', 'cancelled'],
  ['dispatched', 'cancelled'],
  ['in_progress', 'cancelled'],
  // Retry.
  ['failed', 'ready'],
  ['cancelled', 'ready'],
];

const IN_FLIGHT = ['dispatched', 'in_progress'] as const;

type Trx = Transaction<Database>;

/**
 * Every task status change. `tasks.transitionTask` rows are the caller's; the others are made by
 * the dispatch calls named, or follow a dependency (`dependency done` / `dependency failed`: in
 * the transaction that finished the dependency, whatever call finished it).
 */
export const TASK_TRANSITIONS: readonly Transition<TaskStatus>[] = Object.freeze([
  ...BY_CALLER.map(([from, to]) => ({ from, to, call: 'tasks.transitionTask' })),
  { from: 'ready', to: 'dispatched', call: 'dispatches.createDispatch' },
  { from: 'ready', to: 'dispatched', call: 'dispatches.dispatchNext' },
  { from: 'ready', to: 'dispatched', call: 'dispatches.dispatchNextBatch' },
  ...IN_FLIGHT.flatMap((from) => [
    { from, to: 'done' as const, call: 'dispatches.completeDispatch' },
    { from, to: 'done' as const, call: "dispatches.endDispatch(id, 'completed')" },
    { from, to: 'ready' as const, call: "dispatches.endDispatch(id, 'cancelled')" },
    { from, to: 'ready' as const, call: 'dispatches.failActiveDispatchOnExit' },
    { from, to: 'failed' as const, call: 'dispatches.failActiveDispatchOnExit (breaker)' },
    { from, to: 'ready' as const, call: 'dispatches.reclaimExpiredDispatches' },
    { from, to: 'failed' as const, call: 'dispatches.reclaimExpiredDispatches (breaker)' },
    // A gate opened while the task was in flight holds it when its dispatch ends without a result.
    { from, to: 'blocked' as const, call: "dispatches.endDispatch(id, 'cancelled') (open gate)" },
    { from, to: 'blocked' as const, call: 'dispatches.failActiveDispatchOnExit (open gate)' },
    { from, to: 'blocked' as const, call: 'dispatches.reclaimExpiredDispatches (open gate)' },
  ]),
  // The path leases' claim and result (`paths.claimTask` re-claims an in-progress task).
  ...(['ready', 'dispatched', 'in_progress'] as const).map((from) => ({
    from,
    to: 'in_progress' as const,
    call: 'paths.claimTask',
  })),
  { from: 'in_progress', to: 'done', call: 'paths.submitTaskResult' },
  { from: 'in_progress', to: 'failed', call: 'paths.submitTaskResult' },
  { from: 'blocked', to: 'ready', call: 'dependency done' },
  { from: 'blocked', to: 'blocked', call: 'dependency failed' },
  // An open gate holds a task that is not in flight; resolving its last open gate releases it.
  ...(['backlog', 'todo', 'ready'] as const).map((from) => ({ from, to: 'blocked' as const, call: 'gates.openGate' })),
  { from: 'blocked', to: 'ready', call: 'gates.resolveGate' },
]);

/** Every dispatch status change (a dispatch is created `active`; the others are final). */
export const DISPATCH_TRANSITIONS: readonly Transition<DispatchStatus>[] = Object.freeze([
  { from: 'active', to: 'completed', call: 'dispatches.completeDispatch' },
  { from: 'active', to: 'completed', call: "dispatches.endDispatch(id, 'completed')" },
  { from: 'active', to: 'cancelled', call: "dispatches.endDispatch(id, 'cancelled')" },
  { from: 'active', to: 'cancelled', call: "tasks.transitionTask(→ 'cancelled')" },
  { from: 'active', to: 'failed', call: 'dispatches.failActiveDispatchOnExit' },
  { from: 'active', to: 'failed', call: 'dispatches.reclaimExpiredDispatches' },
  { from: 'active', to: 'completed', call: "paths.submitTaskResult(→ 'done')" },
  { from: 'active', to: 'failed', call: "paths.submitTaskResult(→ 'failed')" },
]);

/** True when `tasks.transitionTask` may move a task from `from` to `to`. */
export function callerMayTransition(from: TaskStatus, to: TaskStatus): boolean {
  return BY_CALLER.some(([f, t]) => f === from && t === to);
}

/** Why `transitionTask` refused. */
export type TaskTransitionRefusal = 'not_in_table' | 'stale_from' | 'open_dependencies' | 'open_gate';

/**
 * `tasks.transitionTask` refused: the move is not in `TASK_TRANSITIONS` for the caller, the task
 * is no longer in `from`, or it would become ready with dependencies not done. Nothing changed.
 */
export class TaskTransitionRefusedError extends TaskfenceError {
  readonly code = 'TASK_TRANSITION_REFUSED';
  constructor(
    readonly taskId: string,
    readonly from: TaskStatus,
    readonly to: TaskStatus,
    readonly current: TaskStatus,
    readonly refusal: TaskTransitionRefusal,
  ) {
    super(
      refusal === 'stale_from'
        ? `Task ${taskId} is ${current}, not ${from}, so it was not moved to ${to}. Re-read the task and decide again.`
        : refusal === 'open_dependencies'
          ? `Task ${taskId} cannot become ready: some of its dependencies are not done. It becomes ready by itself when the last one is done.`
          : refusal === 'open_gate'
            ? `Task ${taskId} cannot become ready: a decision gate on it is open. It becomes ready by itself when the gate is resolved.`
            : `Task ${taskId} cannot move from ${from} to ${to}: that transition is not in the state machine (README "The work lifecycle"). ` +
              'Use the call the table names for it.',
    );
  }
}

/** The task is not `ready`, so it cannot be dispatched. */
export class TaskNotDispatchableError extends TaskfenceError {
  readonly code = 'TASK_NOT_DISPATCHABLE';
  constructor(
    readonly taskId: string,
    readonly status: TaskStatus,
  ) {
    super(
      `Task ${taskId} is ${status}, not ready, so it cannot be dispatched. Dispatch it once it is ready (a failed dispatch returns it to ready).`,
    );
  }
}

/** The error a reclaimed dispatch ends with, and the reason its task returned to ready. */
export const LEASE_EXPIRED = 'lease_expired';

/** The dispatch lease is not the caller's any more (reclaimed after expiry, superseded, or ended); nothing changed. */
export class DispatchLeaseLostError extends LeaseLostError {
  readonly code = 'DISPATCH_LEASE_LOST';
  readonly kind = 'dispatch';
  constructor(
    readonly dispatchId: string,
    readonly token: number,
    readonly reason: LeaseLostReason,
  ) {
    super(
      `Dispatch ${dispatchId} (token ${token}) is no longer this worker's (${reason}). ` +
        'Stop the work: its task was reclaimed or ended; its result is refused.',
    );
  }
}

/**
 * Why a dispatch that is not active (any more) is not its worker's: superseded by a newer
 * dispatch of its task, reclaimed (`expired`), or ended (`released`).
 */
export async function endedReason(
  trx: Transaction<Database> | Kysely<Database>,
  row: Pick<DispatchContextRow, 'task_id' | 'seq' | 'error'>,
): Promise<LeaseLostReason> {
  const newer = await trx
    .selectFrom('dispatch_contexts')
    .select('id')
    .where('task_id', '=', row.task_id)
    .where('seq', '>', row.seq)
    .limit(1)
    .executeTakeFirst();
  if (newer) return 'superseded';
  return row.error === LEASE_EXPIRED ? 'expired' : 'released';
}

/** The read of a task's active dispatch (its newest, by `seq`), for `requireTaskDispatchLease`. */
export function activeDispatchRead(db: Kysely<Database>, taskId: string) {
  return db
    .selectFrom('dispatch_contexts')
    .selectAll()
    .where('task_id', '=', taskId)
    .where('status', '=', 'active')
    .orderBy('seq', 'desc')
    .limit(1);
}

/**
 * The dispatch-lease fence of a result reported outside the dispatch calls
 * (`paths.submitTaskResult`, `paths.claimTask` with `dispatchLease`), in `trx` under the task's
 * dispatch key: `lease` must be the task's active dispatch's lease (its id and token), else
 * `DispatchLeaseLostError` (`superseded` once the task was dispatched again, `expired` after a
 * reclaim, `released` after an end, `never_granted` for a lease of another task or a wrong token).
 * Returns the task's active dispatch (null when it has none and no lease was passed).
 */
export async function requireTaskDispatchLease(
  trx: Trx,
  taskId: string,
  lease: Lease<'dispatch'> | undefined,
  /** The task's active dispatch as the caller read it (`activeDispatchRead`), else read here. */
  read?: DispatchContextRow | null,
): Promise<DispatchContextRow | null> {
  const active = read !== undefined ? read : ((await activeDispatchRead(trx, taskId).executeTakeFirst()) ?? null);
  if (lease === undefined) return active;
  if (active !== null && active.id === lease.resource && Number(active.seq) === lease.token) return active;
  const named = await trx
    .selectFrom('dispatch_contexts')
    .select(['task_id', 'seq', 'error', 'status'])
    .where('id', '=', lease.resource)
    .executeTakeFirst();
  if (!named || named.task_id !== taskId || Number(named.seq) !== lease.token)
    throw new DispatchLeaseLostError(lease.resource, lease.token, 'never_granted');
  throw new DispatchLeaseLostError(lease.resource, lease.token, await endedReason(trx, named));
}

/** `blocked_reason` prefixes the lifecycle writes: a task blocked by them unblocks by itself. */
export const WAITING_REASON = 'dependencies: waiting for ';
export const FAILED_DEPENDENCY_REASON = 'dependency_failed: ';
/** The reason of a task held by an open decision gate (`gate: <id>`). */
export const GATE_REASON = 'gate: ';
/** The reason of a task whose gate timed out (`gate_timeout: <id>`): the caller decides. */
export const GATE_TIMEOUT_REASON = 'gate_timeout: ';

/**
 * A task's result (a completion) was refused: a decision gate on the task is open. Resolve the
 * gate (or let it time out) first. Nothing changed.
 */
export class GateOpenError extends TaskfenceError {
  readonly code = 'GATE_OPEN';
  constructor(
    readonly taskId: string,
    readonly gateId: string,
  ) {
    super(
      `Task ${taskId} waits on decision gate ${gateId}, which is open, so its result was not recorded. ` +
        'Resolve the gate (gates.resolveGate) and report again; nothing changed.',
    );
  }
}

/** The id of an open decision gate on `taskId` (the oldest), or null. */
export async function openGateOf(trx: Transaction<Database>, taskId: string): Promise<string | null> {
  const row = await trx
    .selectFrom('decision_gates')
    .select('id')
    .where('task_id', '=', taskId)
    .where('status', '=', 'open')
    .orderBy('created_at')
    .orderBy('id')
    .executeTakeFirst();
  return row?.id ?? null;
}

/** Throws `GateOpenError` while a gate on `taskId` is open (a result must wait for the decision). */
export async function requireNoOpenGate(trx: Transaction<Database>, taskId: string): Promise<void> {
  const gate = await openGateOf(trx, taskId);
  if (gate !== null) throw new GateOpenError(taskId, gate);
}

/** The reason a task with open dependencies is stored with. */
export function waitingReason(openIds: readonly string[]): string {
  const shown = openIds.slice(0, 10).join(', ');
  return `${WAITING_REASON}${shown}${openIds.length > 10 ? ` and ${openIds.length - 10} more` : ''}`;
}

/** The reason a task whose dependency failed or was cancelled is blocked with. */
export function failedDependencyReason(dependencyId: string, status: TaskStatus): string {
  return `${FAILED_DEPENDENCY_REASON}task ${dependencyId} is ${status}`;
}

/** The dependencies of `taskId` that are not done, with their statuses. */
export async function openDependencies(
  trx: Trx,
  taskId: string,
): Promise<{ readonly id: string; readonly status: TaskStatus }[]> {
  return trx
    .selectFrom('task_dependencies as d')
    .innerJoin('tasks as t', 't.id', 'd.depends_on_id')
    .select(['t.id as id', 't.status as status'])
    .where('d.task_id', '=', taskId)
    .where('t.status', '<>', 'done')
    .orderBy('t.seq')
    .execute();
}

/**
 * After `taskId` reached `status` (done, failed or cancelled), in the same transaction: a done
 * task's dependents waiting on it become `ready` when every dependency is done; a failed or
 * cancelled one blocks them with the reason. Only dependents the lifecycle blocked are moved (a
 * task blocked by its caller stays so). `rowLocks`: the dialect has row locks (PostgreSQL).
 * `completeDispatch` does the same for `done` inside `taskfence_complete_dispatch_v1` (0101).
 */
export async function propagateFinish(
  trx: Trx,
  taskId: string,
  status: TaskStatus,
  now: number,
  rowLocks: boolean,
): Promise<void> {
  const { lock, move } = finishStatements(trx, taskId, status, now);
  if (rowLocks) {
    // Two dependencies of one task finishing at once must not each miss the other's commit (READ
    // COMMITTED: each UPDATE below reads as of its start). Locking the dependents first queues the
    // second finisher behind the first, and its UPDATE then sees the first one's done.
    const locked = await trx.executeQuery(lock);
    // Every dependent either UPDATE below could move is among these rows (blocked or ready), and
    // none can join them before this transaction ends: a new edge to this task locks its row,
    // which this transaction holds. None locked: nothing to move, one round trip less.
    if (locked.rows.length === 0) return;
  }
  if (move) await trx.executeQuery(move);
}

/**
 * `propagateFinish`'s two statements, compiled: `lock` row-locks the dependents (blocked or ready,
 * by id) and `move` moves those the finish releases or blocks (null for a status that moves
 * none). `task`: the finished task's id.
 */
function finishStatements(
  db: Kysely<Database>,
  task: string,
  status: TaskStatus,
  now: number,
): { lock: CompiledQuery; move: CompiledQuery | null } {
  const tasks = tableIn(db, 'tasks');
  const deps = tableIn(db, 'task_dependencies');
  const dependents = sql`${tasks}.id in (select task_id from ${deps} where depends_on_id = ${task})`;
  // The status re-checks are written `(…) is true`, which no index serves: the dependents are
  // reached from `task_dependencies` and then by primary key. Written `status = 'blocked'`,
  // SQLite (no statistics) walked `tasks_status_idx` instead: every blocked task of the store
  // (and for a failure every ready one too) read on each finish, 10.8 ms at 100,000.
  const lifecycleBlocked = sql`(${tasks}.status = 'blocked' and (${tasks}.blocked_reason like ${WAITING_REASON + '%'} or ${tasks}.blocked_reason like ${FAILED_DEPENDENCY_REASON + '%'})) is true`;
  const move =
    status === 'done'
      ? sql`
      update ${tasks} set status = 'ready', blocked_reason = null, updated_at = ${now}
      where ${dependents} and ${lifecycleBlocked}
        and not exists (
          select 1 from ${deps} d join ${tasks} t on t.id = d.depends_on_id
          where d.task_id = ${tasks}.id and t.status <> 'done')
        and not exists (
          select 1 from ${tableIn(db, 'decision_gates')} g where g.task_id = ${tasks}.id and g.status = 'open')`
      : status === 'failed' || status === 'cancelled'
        ? sql`
      update ${tasks} set status = 'blocked', blocked_reason = ${failedDependencyReason(task, status)}, updated_at = ${now}
      where ${dependents} and (${lifecycleBlocked} or (${tasks}.status = 'ready') is true)`
        : null;
  const lock = db
    .selectFrom('tasks')
    .select('id')
    .where('id', 'in', db.selectFrom('task_dependencies').select('task_id').where('depends_on_id', '=', task))
    .where('status', 'in', ['blocked', 'ready'])
    .orderBy('id')
    .forUpdate();
  return { lock: lock.compile(), move: move ? move.compile(db) : null };
}

/**
 * Moves an in-flight task to `to` (with `result` when done) and propagates the finish to its
 * dependents (`rowLocks`: the dialect has row locks, PostgreSQL); a task that already left flight
 * is left as it is. Returns its status afterwards. A task sent back to `ready` while a decision
 * gate on it is open goes to `blocked` (reason `gate: <id>`) instead: the gate opened while it was
 * in flight still holds it, and resolving the gate readies it.
 */
export async function moveInFlightTask(
  trx: Trx,
  taskId: string,
  to: 'done' | 'failed' | 'ready' | 'cancelled',
  now: number,
  rowLocks: boolean,
  result?: string | null,
): Promise<TaskStatus> {
  return (await moveInFlightTaskRow(trx, taskId, to, now, rowLocks, result)).status;
}

/**
 * `moveInFlightTask`, returning the task's whole row afterwards (from the move's own RETURNING, or
 * the read that finds it already out of flight): the finish writes only its dependents, so this
 * is the row as the transaction leaves it.
 */
export async function moveInFlightTaskRow(
  trx: Trx,
  taskId: string,
  to: 'done' | 'failed' | 'ready' | 'cancelled',
  now: number,
  rowLocks: boolean,
  result?: string | null,
): Promise<TaskRow> {
  const gate = to === 'ready' ? await openGateOf(trx, taskId) : null;
  const moved = await trx
    .updateTable('tasks')
    .set({
      status: gate === null ? to : 'blocked',
      updated_at: now,
      blocked_reason: gate === null ? null : `${GATE_REASON}${gate}`,
      ...(result !== undefined ? { result } : {}),
    })
    .where('id', '=', taskId)
    .where('status', 'in', IN_FLIGHT)
    .returningAll()
    .executeTakeFirst();
  if (moved) {
    if (to !== 'ready') await propagateFinish(trx, taskId, to, now, rowLocks);
    return moved;
  }
  return trx.selectFrom('tasks').selectAll().where('id', '=', taskId).executeTakeFirstOrThrow();
}

/**
 * @internal For a task finished outside the dispatch calls (`paths.submitTaskResult`), after its
 * status was set to `status` in `trx`: ends its active dispatch (`completed` for done, `failed`
 * otherwise) so a later exit of that terminal counts nothing against it, and moves its dependents
 * as `propagateFinish` does. The caller holds the task's dispatch key (`dispatchTaskLockKey`).
 */
export async function afterTaskFinished(
  ctx: StoreContext,
  trx: Trx,
  taskId: string,
  status: 'done' | 'failed',
  now: number,
): Promise<void> {
  const ended = await trx
    .updateTable('dispatch_contexts')
    .set({
      status: status === 'done' ? 'completed' : 'failed',
      error: status === 'done' ? null : 'task result: failed',
      updated_at: now,
      ended_at: now,
    })
    .where('task_id', '=', taskId)
    .where('status', '=', 'active')
    .returning(['id', 'terminal_handle', 'seq', 'status'])
    .execute();
  await auditLeaseActs(ctx, trx, now, endedDispatches(ended, 'paths.submitTaskResult'));
  await propagateFinish(trx, taskId, status, now, ctx.dialect.supportsSkipLocked);
}

/** The trail's rows of dispatches a task transition ended (their leases released by `by`). */
export function endedDispatches(
  rows: readonly { id: string; terminal_handle: string; seq: number; status: string }[],
  by: string,
): LeaseActRecord[] {
  return rows.map((row) => ({
    act: 'released',
    kind: 'dispatch',
    resource: row.id,
    holder: row.terminal_handle,
    token: Number(row.seq),
    detail: { status: row.status, by },
  }));
}
