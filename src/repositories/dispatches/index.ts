/**
 * `store.dispatches` (SPEC §3): a task sent to a worker terminal, scoped to a run. The
 * guarantees are stated on `DispatchRepository` (types.ts).
 */
import { sql, type Kysely, type Transaction } from 'kysely';
import { InvalidArgumentError, NotFoundError } from '../../errors.js';
import type {
  CoordinatorRunRow,
  Database,
  DispatchContextRow,
  DispatchStatus,
  TaskStatus,
} from '../../schema/database.js';
import type { StoreContext } from '../context.js';
import { dispatchTaskLockKey, dispatchTerminalLockKey } from '../shared/lock-keys.js';
import { findRunningRun, requireRunningRunIn } from '../shared/running-run.js';
import {
  optionalId,
  optionalIdFilter,
  optionalInput,
  optionalStatusFilter,
  optionalString,
  requireId,
  requireInput,
} from '../validate.js';
import {
  DISPATCH_FAILURE_LIMIT,
  DispatchAlreadyActiveError,
  DispatchNotActiveError,
  DispatchRunMismatchError,
  TaskNotDispatchableError,
  type Dispatch,
  type DispatchRepository,
  type EscalationTarget,
} from './types.js';

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
