import { sql, type Kysely, type Transaction } from 'kysely';
import { InvalidArgumentError, NotFoundError, TaskfenceError } from '../errors.js';
import type {
  CoordinatorRunRow,
  CoordinatorRunStatus,
  Database,
  DispatchContextRow,
  DispatchStatus,
  TaskStatus,
} from '../schema/database.js';
import type { StoreContext } from './context.js';
import { dispatchTaskLockKey, dispatchTerminalLockKey } from './shared/lock-keys.js';
import { findRunningRun, requireRunningRunIn } from './shared/running-run.js';
import {
  optionalId,
  optionalIdFilter,
  optionalInput,
  optionalStatusFilter,
  optionalString,
  requireId,
  requireInput,
} from './validate.js';

/** Failed dispatches of one task that trip its circuit breaker: the task fails instead of returning to ready. */
export const DISPATCH_FAILURE_LIMIT = 3;

export interface Dispatch {
  readonly id: string;
  readonly taskId: string;
  readonly agentId: string | null;
  readonly terminalHandle: string;
  readonly status: DispatchStatus;
  readonly error: string | null;
  readonly createdAt: number;
  readonly updatedAt: number;
  readonly endedAt: number | null;
  readonly coordinatorRunId: string | null;
}

export interface CreateDispatchInput {
  readonly taskId: string;
  /** The worker terminal the task is sent to; its exit is reported by this handle. */
  readonly terminalHandle: string;
  readonly agentId?: string | null;
  /**
   * The dispatching run. If given it must be running and own the task (a run never dispatches
   * another run's task); default: the task's own run.
   */
  readonly runId?: string;
}

export interface ListDispatchesFilter {
  /** Only dispatches of this coordinator run. */
  readonly runId?: string;
  readonly taskId?: string;
  readonly terminalHandle?: string;
  readonly status?: DispatchStatus | readonly DispatchStatus[];
}

/** Where a worker's exit is escalated: which run's coordinator must hear about it. */
export interface EscalationTarget {
  readonly runId: string;
  readonly coordinatorHandle: string;
  readonly runStatus: CoordinatorRunStatus;
  /**
   * `dispatch_run`: the dispatch's own run. Legacy dispatches with no run fall back to
   * `task_target_run` (the running run of the task's target, exact under concurrency) and only
   * then to `latest_running_run` (the most recently started running run anywhere).
   */
  readonly via: 'dispatch_run' | 'task_target_run' | 'latest_running_run';
}

export interface DispatchExitResult {
  /** The dispatch, now `failed`. */
  readonly dispatch: Dispatch;
  /** Failed dispatches of the task so far, this one included. */
  readonly failureCount: number;
  /** True when this failure reached `DISPATCH_FAILURE_LIMIT` and failed the task. */
  readonly circuitBreakerTripped: boolean;
  /** The task's status afterwards: `ready` again, `failed` by the breaker, or unchanged if it had already left flight. */
  readonly taskStatus: TaskStatus;
  /** Null only for a legacy dispatch when no run is running at all. */
  readonly escalateTo: EscalationTarget | null;
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

/** The task already has an active dispatch in this run. */
export class DispatchAlreadyActiveError extends TaskfenceError {
  readonly code = 'DISPATCH_ALREADY_ACTIVE';
  constructor(
    readonly taskId: string,
    readonly runId: string | null,
    readonly activeDispatchId: string,
    readonly terminalHandle: string,
  ) {
    super(
      `Task ${taskId} already has active dispatch ${activeDispatchId} on terminal ${terminalHandle}` +
        `${runId === null ? '' : ` in run ${runId}`}. End or fail that dispatch before dispatching the task again.`,
    );
  }
}

/** A run tried to dispatch a task it does not own. */
export class DispatchRunMismatchError extends TaskfenceError {
  readonly code = 'DISPATCH_RUN_MISMATCH';
  constructor(
    readonly taskId: string,
    readonly runId: string,
    readonly taskRunId: string | null,
  ) {
    super(
      `Run ${runId} cannot dispatch task ${taskId}: the task belongs to ${taskRunId === null ? 'no run' : `run ${taskRunId}`}. ` +
        'A run dispatches only its own tasks; adopt the task first (adoptUnownedTasks) if it is unowned.',
    );
  }
}

/** The dispatch already ended. */
export class DispatchNotActiveError extends TaskfenceError {
  readonly code = 'DISPATCH_NOT_ACTIVE';
  constructor(
    readonly dispatchId: string,
    readonly status: DispatchStatus,
  ) {
    super(
      `Dispatch ${dispatchId} is already ${status}; it was ended by someone else (for example its terminal's exit). Re-read it before acting.`,
    );
  }
}

/** Dispatch contexts (SPEC §3): a task sent to a worker terminal, scoped to a run. */
export interface DispatchRepository {
  /**
   * Dispatches a `ready` task to a terminal and moves it to `dispatched`, atomically: of
   * concurrent dispatches of one task exactly one succeeds, the others get
   * `TaskNotDispatchableError` (or `DispatchAlreadyActiveError`). The dispatch is stamped with the task's run.
   */
  createDispatch(input: CreateDispatchInput): Promise<Dispatch>;
  /** The dispatch with this id, or null; a plain read. */
  getDispatch(id: string): Promise<Dispatch | null>;
  /** The terminal's active dispatch; if it has several, deterministically the newest (by creation time, then id). */
  getActiveDispatchForTerminal(terminalHandle: string): Promise<Dispatch | null>;
  /**
   * On a worker terminal's exit: fails its active dispatch (exactly once, however many exit
   * reports race), counts the task's failures, trips the circuit breaker at
   * `DISPATCH_FAILURE_LIMIT` (task `failed`) or returns the task to `ready`, and names the run to
   * escalate to. Returns null if the terminal has no active dispatch.
   */
  failActiveDispatchOnExit(terminalHandle: string, options?: { error?: string }): Promise<DispatchExitResult | null>;
  /** Ends an active dispatch as completed or cancelled; an ended one gets `DispatchNotActiveError`. */
  endDispatch(dispatchId: string, status: 'completed' | 'cancelled'): Promise<Dispatch>;
  /** Dispatches matching the filter, oldest first. */
  listDispatches(filter?: ListDispatchesFilter): Promise<Dispatch[]>;
  /** Dispatch counts of one run by status (every status present, zero if none). */
  countDispatchesByStatus(runId: string): Promise<Record<DispatchStatus, number>>;
}

/** Maps a `dispatch_contexts` row to the public shape. */
export function toDispatch(row: DispatchContextRow): Dispatch {
  return {
    id: row.id,
    taskId: row.task_id,
    agentId: row.agent_id,
    terminalHandle: row.terminal_handle,
    status: row.status,
    error: row.error,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
    endedAt: row.ended_at,
    coordinatorRunId: row.coordinator_run_id,
  };
}

const IN_FLIGHT: readonly TaskStatus[] = ['dispatched', 'in_progress'];
const DISPATCH_STATUSES: readonly DispatchStatus[] = ['active', 'completed', 'failed', 'cancelled'];

/** The newest active dispatch of a terminal (ties broken by id), read in `db` (a transaction or the store). */
function newestActiveFor(trx: Transaction<Database> | Kysely<Database>, terminalHandle: string) {
  return trx
    .selectFrom('dispatch_contexts')
    .selectAll()
    .where('terminal_handle', '=', terminalHandle)
    .where('status', '=', 'active')
    .orderBy('created_at', 'desc')
    .orderBy('id', 'desc')
    .limit(1)
    .executeTakeFirst();
}

async function escalationFor(
  trx: Transaction<Database>,
  dispatch: DispatchContextRow,
): Promise<EscalationTarget | null> {
  const target = (run: CoordinatorRunRow, via: EscalationTarget['via']): EscalationTarget => ({
    runId: run.id,
    coordinatorHandle: run.coordinator_handle,
    runStatus: run.status,
    via,
  });
  if (dispatch.coordinator_run_id !== null) {
    const own = await trx
      .selectFrom('coordinator_runs')
      .selectAll()
      .where('id', '=', dispatch.coordinator_run_id)
      .executeTakeFirst();
    if (own) return target(own, 'dispatch_run');
  }
  // Legacy row (written before runs were stamped): the running run of the task's target is
  // unique, so it is exact; only a task whose target has no running run falls back further.
  const task = await trx.selectFrom('tasks').select('target_key').where('id', '=', dispatch.task_id).executeTakeFirst();
  const sameTarget = await findRunningRun(trx, task?.target_key ?? null);
  if (sameTarget) return target(sameTarget, 'task_target_run');
  const latest = await trx
    .selectFrom('coordinator_runs')
    .selectAll()
    .where('status', '=', 'running')
    .orderBy('started_at', 'desc')
    .orderBy('id', 'desc')
    .limit(1)
    .executeTakeFirst();
  return latest ? target(latest, 'latest_running_run') : null;
}

/** The dispatch repository on a store context (wired as `store.dispatches`). */
export function createDispatchRepository(ctx: StoreContext): DispatchRepository {
  const { dialect } = ctx;
  const { db } = dialect;

  async function getDispatch(id: string): Promise<Dispatch | null> {
    requireId('id', id);
    const row = await db.selectFrom('dispatch_contexts').selectAll().where('id', '=', id).executeTakeFirst();
    return row ? toDispatch(row) : null;
  }

  const repo: DispatchRepository = {
    async createDispatch(input) {
      requireInput('input', input);
      const taskId = requireId('taskId', input.taskId);
      const terminalHandle = requireId('terminalHandle', input.terminalHandle);
      const agentId = optionalId('agentId', input.agentId);
      if (input.runId !== undefined) requireId('runId', input.runId);
      const id = ctx.newId();
      const now = ctx.clock.now();
      const row = await dialect.writeTransaction(async (trx) => {
        await dialect.lockKey(trx, dispatchTaskLockKey(taskId));
        const task = await trx
          .selectFrom('tasks')
          .select(['id', 'status', 'coordinator_run_id'])
          .where('id', '=', taskId)
          .executeTakeFirst();
        if (!task) throw new NotFoundError('task', taskId);
        if (input.runId !== undefined) {
          await requireRunningRunIn(trx, input.runId);
          if (task.coordinator_run_id !== input.runId)
            throw new DispatchRunMismatchError(taskId, input.runId, task.coordinator_run_id);
        }
        const runId = task.coordinator_run_id;
        const active = await trx
          .selectFrom('dispatch_contexts')
          .select(['id', 'terminal_handle'])
          .where('task_id', '=', taskId)
          .where('status', '=', 'active')
          .where(sql<string>`coalesce(coordinator_run_id, '')`, '=', runId ?? '')
          .executeTakeFirst();
        if (active) throw new DispatchAlreadyActiveError(taskId, runId, active.id, active.terminal_handle);
        // The agent reference is checked before the first write, so a missing one is a NotFoundError and changes nothing.
        if (
          agentId !== null &&
          !(await trx.selectFrom('agents').select('id').where('id', '=', agentId).executeTakeFirst())
        ) {
          throw new NotFoundError('agent', agentId);
        }
        // The conditional UPDATE is the claim: it row-locks the task and re-checks `ready`.
        const claimed = await trx
          .updateTable('tasks')
          .set({ status: 'dispatched', updated_at: now })
          .where('id', '=', taskId)
          .where('status', '=', 'ready')
          .executeTakeFirst();
        if (claimed.numUpdatedRows === 0n) throw new TaskNotDispatchableError(taskId, task.status);
        return trx
          .insertInto('dispatch_contexts')
          .values({
            id,
            task_id: taskId,
            agent_id: agentId,
            terminal_handle: terminalHandle,
            status: 'active',
            error: null,
            created_at: now,
            updated_at: now,
            ended_at: null,
            coordinator_run_id: runId,
          })
          .returningAll()
          .executeTakeFirstOrThrow();
      });
      return toDispatch(row);
    },

    getDispatch,

    async getActiveDispatchForTerminal(terminalHandle) {
      requireId('terminalHandle', terminalHandle);
      const row = await newestActiveFor(db, terminalHandle);
      return row ? toDispatch(row) : null;
    },

    async failActiveDispatchOnExit(terminalHandle, options) {
      requireId('terminalHandle', terminalHandle);
      const error = optionalString('error', optionalInput('options', options).error) ?? 'worker terminal exited';
      return dialect.writeTransaction(async (trx) => {
        // Exit reports for one terminal queue here, so each sees the previous one's result.
        await dialect.lockKey(trx, dispatchTerminalLockKey(terminalHandle));
        for (;;) {
          const active = await newestActiveFor(trx, terminalHandle);
          if (!active) return null;
          await dialect.lockKey(trx, dispatchTaskLockKey(active.task_id));
          const now = ctx.clock.now();
          const failed = await trx
            .updateTable('dispatch_contexts')
            .set({ status: 'failed', error, updated_at: now, ended_at: now })
            .where('id', '=', active.id)
            .where('status', '=', 'active')
            .returningAll()
            .executeTakeFirst();
          if (!failed) continue; // ended by endDispatch meanwhile: look again
          const { failures } = await trx
            .selectFrom('dispatch_contexts')
            .select((eb) => eb.fn.countAll<number>().as('failures'))
            .where('task_id', '=', failed.task_id)
            .where('status', '=', 'failed')
            .executeTakeFirstOrThrow();
          const failureCount = Number(failures);
          const tripped = failureCount >= DISPATCH_FAILURE_LIMIT;
          const task = await trx
            .updateTable('tasks')
            .set({ status: tripped ? 'failed' : 'ready', updated_at: now })
            .where('id', '=', failed.task_id)
            .where('status', 'in', IN_FLIGHT)
            .returning('status')
            .executeTakeFirst();
          const taskStatus =
            task?.status ??
            (await trx.selectFrom('tasks').select('status').where('id', '=', failed.task_id).executeTakeFirstOrThrow())
              .status;
          return {
            dispatch: toDispatch(failed),
            failureCount,
            circuitBreakerTripped: tripped && task !== undefined,
            taskStatus,
            escalateTo: await escalationFor(trx, failed),
          };
        }
      });
    },

    async endDispatch(dispatchId, status) {
      requireId('dispatchId', dispatchId);
      if (status !== 'completed' && status !== 'cancelled')
        throw new InvalidArgumentError('status', 'must be completed or cancelled');
      const now = ctx.clock.now();
      const row = await dialect.writeTransaction((trx) =>
        trx
          .updateTable('dispatch_contexts')
          .set({ status, updated_at: now, ended_at: now })
          .where('id', '=', dispatchId)
          .where('status', '=', 'active')
          .returningAll()
          .executeTakeFirst(),
      );
      if (row) return toDispatch(row);
      const current = await getDispatch(dispatchId);
      if (!current) throw new NotFoundError('dispatch', dispatchId);
      throw new DispatchNotActiveError(dispatchId, current.status);
    },

    async listDispatches(options) {
      const filter = optionalInput('filter', options);
      const runId = optionalIdFilter('runId', filter.runId);
      const taskId = optionalIdFilter('taskId', filter.taskId);
      const terminalHandle = optionalIdFilter('terminalHandle', filter.terminalHandle);
      const statuses = optionalStatusFilter('status', filter.status, DISPATCH_STATUSES);
      if (statuses !== null && statuses.length === 0) return [];
      let query = db.selectFrom('dispatch_contexts').selectAll();
      if (runId !== undefined) query = query.where('coordinator_run_id', '=', runId);
      if (taskId !== undefined) query = query.where('task_id', '=', taskId);
      if (terminalHandle !== undefined) query = query.where('terminal_handle', '=', terminalHandle);
      if (statuses !== null) query = query.where('status', 'in', statuses);
      const rows = await query.orderBy('created_at').orderBy('id').execute();
      return rows.map(toDispatch);
    },

    async countDispatchesByStatus(runId) {
      requireId('runId', runId);
      const rows = await db
        .selectFrom('dispatch_contexts')
        .select(['status', (eb) => eb.fn.countAll<number>().as('n')])
        .where('coordinator_run_id', '=', runId)
        .groupBy('status')
        .execute();
      const counts: Record<DispatchStatus, number> = { active: 0, completed: 0, failed: 0, cancelled: 0 };
      for (const r of rows) counts[r.status] = Number(r.n);
      return counts;
    },
  };
  return repo;
}
