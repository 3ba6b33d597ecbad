/**
 * Lock-mode resolution lookups and run dispatch (seed 000, SPEC §4). The decision itself is the
 * pure `decideLockMode` (domain/lock-mode.ts); this module looks up the records it needs and ties
 * the task lease, the resolution and the workspace lock together.
 */
import { InvalidArgumentError, NotFoundError, TaskfenceError } from '../errors.js';
import {
  completeResolution,
  decideLockMode,
  WorkspaceConfigurationError,
  type LockModeAgent,
  type LockModeTask,
  type WorkspaceConfigurationReason,
  type WorkspaceResolution,
  type WorkspaceSource,
} from '../domain/lock-mode.js';
import type { Transaction } from 'kysely';
import type { Database, TaskStatus } from '../schema/database.js';
import type { StoreContext } from './context.js';
import { TaskNotDispatchableError } from './shared/lifecycle.js';
import {
  DEFAULT_TASK_LEASE_TTL_MS,
  StaleTaskLeaseError,
  type LockRepository,
  type TaskLease,
  type TaskLeaseHolder,
  type WorkspaceLock,
  type WorkspaceLockHolder,
} from './shared/leases.js';
import { toProject, toTask, toWorkspace, type WorkspaceRecord } from './shared/records.js';
import { claimTaskLeaseWith } from './shared/task-lease-claim.js';
import { keyedCall, keyedWrite, type IdempotencyOptions } from './idempotent.js';
import { optionalId, requireBoolean, requireId, requireInput, requirePositiveMs } from './validate.js';
import type { OutcomeDeclarations } from './shared/outcomes.js';

/** Lease and lock lifetime of a dispatched run unless the caller says otherwise (renew at about a third of it). */
export const DEFAULT_DISPATCH_TTL_MS = DEFAULT_TASK_LEASE_TTL_MS;

/** Statuses `dispatchRun` refuses: the task waits for something, or it is over. */
const NOT_RUNNABLE: readonly TaskStatus[] = ['blocked', 'done', 'failed', 'cancelled'];
/** What the task-lease claim of `dispatchRun` refuses (a keyed retry replays the refusal). */
const CLAIM_REFUSALS = [NotFoundError, TaskNotDispatchableError];

/**
 * `dispatchRun`'s readiness check, in the task-lease claim's transaction: the task row is read
 * `FOR NO KEY UPDATE` on PostgreSQL (SQLite's writer lock covers it), so a status change either
 * commits before the check and is seen, or waits for the claim to commit. A blocked or finished
 * task is never leased to a run, however the status change and the claim interleave. Not `FOR
 * SHARE`: a stream of claimers would share the lock among themselves and starve the status change;
 * the claimers queue on the task's lease row anyway.
 */
async function requireRunnable(trx: Transaction<Database>, ctx: StoreContext, taskId: string): Promise<void> {
  const query = trx.selectFrom('tasks').select('status').where('id', '=', taskId);
  const task = await (ctx.dialect.supportsSkipLocked ? query.forNoKeyUpdate() : query).executeTakeFirst();
  if (!task) throw new NotFoundError('task', taskId);
  if (NOT_RUNNABLE.includes(task.status)) throw new TaskNotDispatchableError(taskId, task.status);
}

/** `heartbeat`: a failed resolution is a skipped beat. `task-runner`: it is an error the UI shows. */
export type DispatchMode = 'heartbeat' | 'task-runner';

/** What to dispatch: one run of one task by one agent. */
/**
 * With an `idempotencyKey`, the key is recorded with the input first, and the task-lease and
 * workspace-lock claims run under keys derived from it: a retry replays both claims (and gives a
 * released lease back again, a no-op), so it returns the first call's outcome and holds nothing twice.
 */
export interface DispatchRunInput extends IdempotencyOptions {
  readonly taskId: string;
  readonly agentId: string;
  readonly runId: string;
  readonly mode: DispatchMode;
  /** Lifetime of the task lease and workspace lock (default `DEFAULT_DISPATCH_TTL_MS`). */
  readonly ttlMs?: number;
}

/** What `dispatchRun` came to. Only `dispatched` leaves anything held, and only by this run. */
export type DispatchResult =
  | {
      readonly outcome: 'dispatched';
      readonly lockMode: 'none';
      readonly workspace: null;
      readonly taskLease: TaskLease;
    }
  | {
      readonly outcome: 'dispatched';
      readonly lockMode: 'exclusive';
      readonly workspace: WorkspaceRecord;
      readonly source: WorkspaceSource;
      readonly taskLease: TaskLease;
      readonly workspaceLock: WorkspaceLock;
    }
  | {
      /** Another run holds the workspace: retry on a later beat. The task lease was released. */
      readonly outcome: 'cancelled';
      readonly reason: 'workspace_busy';
      readonly workspace: WorkspaceRecord;
      readonly heldBy: WorkspaceLockHolder;
    }
  | {
      /** Heartbeat mode only: the workspace cannot be resolved. The task lease was released. */
      readonly outcome: 'skipped';
      readonly reason: 'workspace_unresolved';
      readonly error: WorkspaceConfigurationError;
    }
  | {
      /** Another run holds the task's lease; nothing was claimed. */
      readonly outcome: 'skipped';
      readonly reason: 'task_leased';
      readonly heldBy: TaskLeaseHolder;
    };

/**
 * Task-runner dispatch of a task whose workspace cannot be resolved. The task lease was released,
 * so the task is back in the pool; the cause is the `WorkspaceConfigurationError`.
 */
export class WorkspaceUnresolvedError extends TaskfenceError {
  readonly code = 'WORKSPACE_UNRESOLVED';
  readonly reason: WorkspaceConfigurationReason;
  constructor(
    readonly taskId: string,
    readonly agentId: string,
    readonly projectId: string | null,
    readonly runId: string,
    cause: WorkspaceConfigurationError,
  ) {
    super(`Run ${runId} of task ${taskId} was not started: ${cause.message}`, { cause });
    this.reason = cause.reason;
  }
}

/** Lock-mode resolution and run dispatch (SPEC §4). */
export interface SchedulerRepository {
  /**
   * Resolves the (task, agent) pair to an exclusive workspace or none, reading task state only
   * (explicit workspace → requiresFilesystem: agent workspace → project primary). Throws
   * `WorkspaceConfigurationError` instead of falling back to any other workspace of the company.
   *
   * @example
   * const r = await store.scheduler.resolveWorkspaceWithLockMode(task, agent);
   * if (r.lockMode === 'exclusive') console.log(r.workspace.id);
   */
  resolveWorkspaceWithLockMode(task: LockModeTask, agent: LockModeAgent): Promise<WorkspaceResolution>;
  /**
   * Dispatches one run: claims the task lease, resolves the lock mode and, for `exclusive`, claims
   * the workspace lock. A cognitive run never touches a workspace lock; of any number of runs racing
   * one workspace exactly one is dispatched and the rest are `cancelled` (`workspace_busy`); every
   * outcome but `dispatched` leaves the task lease released. A task that is blocked, done, failed
   * or cancelled when the lease would be claimed is `TaskNotDispatchableError`, and nothing is claimed.
   *
   * @example
   * const r = await store.scheduler.dispatchRun({ taskId, agentId, runId, mode: 'heartbeat' });
   * if (r.outcome === 'dispatched' && r.lockMode === 'exclusive') startAgentIn(r.workspace.rootPath);
   */
  dispatchRun(input: DispatchRunInput): Promise<DispatchResult>;
}

/**
 * Builds `store.scheduler` on a store context, using `locks` (the same context's `store.locks`,
 * passed in by `createRepositories`) for its leases and locks.
 */
export function createSchedulerRepository(ctx: StoreContext, locks: LockRepository): SchedulerRepository {
  const { db } = ctx.dialect;

  async function resolve(task: LockModeTask, agent: LockModeAgent): Promise<WorkspaceResolution> {
    // The project is the only lookup the decision needs up front; the workspace row is read after.
    const projectRow =
      task.projectId === null
        ? undefined
        : await db.selectFrom('projects').selectAll().where('id', '=', task.projectId).executeTakeFirst();
    const decision = decideLockMode(task, agent, projectRow ? toProject(projectRow) : null);
    if (decision.lockMode === 'none') return completeResolution(task, agent, decision, null);
    const workspaceRow = await db
      .selectFrom('workspaces')
      .selectAll()
      .where('id', '=', decision.workspaceId)
      .executeTakeFirst();
    return completeResolution(task, agent, decision, workspaceRow ? toWorkspace(workspaceRow) : null);
  }

  return {
    async resolveWorkspaceWithLockMode(task, agent) {
      requireInput('task', task);
      requireId('task.id', task.id);
      optionalId('task.workspaceId', task.workspaceId);
      optionalId('task.projectId', task.projectId);
      requireBoolean('task.requiresFilesystem', task.requiresFilesystem);
      requireInput('agent', agent);
      requireId('agent.id', agent.id);
      optionalId('agent.workspaceId', agent.workspaceId);
      return resolve(task, agent);
    },

    async dispatchRun(input) {
      requireInput('input', input);
      const taskId = requireId('taskId', input.taskId);
      const agentId = requireId('agentId', input.agentId);
      const runId = requireId('runId', input.runId);
      if (input.mode !== 'heartbeat' && input.mode !== 'task-runner') {
        throw new InvalidArgumentError('mode', "must be 'heartbeat' or 'task-runner'");
      }
      const ttlMs = input.ttlMs === undefined ? DEFAULT_DISPATCH_TTL_MS : requirePositiveMs('ttlMs', input.ttlMs);
      const call = keyedCall('scheduler.dispatchRun', input, { taskId, agentId, runId, mode: input.mode, ttlMs }, []);
      const key = (step: string) => (call === null ? undefined : `${call.key}:${step}`);
      // Keyed: the key and input are recorded first (other input under it is a conflict); a retry
      // of a call that got past this point skips the checks below and replays its claims.
      let fresh = call === null;
      if (call !== null)
        await keyedWrite(ctx, call, async () => {
          fresh = true;
          return null;
        });
      // Refusals come before the first write: a missing agent or task must not bump the task lease's token.
      if (fresh && !(await db.selectFrom('agents').select('id').where('id', '=', agentId).executeTakeFirst()))
        throw new NotFoundError('agent', agentId);

      const lease = await claimTaskLeaseWith(
        ctx,
        taskId,
        { holder: runId, ttlMs, idempotencyKey: key('task-lease') },
        (trx) => requireRunnable(trx, ctx, taskId),
        CLAIM_REFUSALS,
      );
      if (lease.status === 'busy') return { outcome: 'skipped', reason: 'task_leased', heldBy: lease.heldBy };
      const taskLease = lease.lease;
      // Gives the task back. If the lease already expired and another run claimed the task, there
      // is nothing left to give back, so a stale token is not an error here.
      const releaseLease = () =>
        locks.releaseTaskLease(taskLease).catch((error: unknown) => {
          if (!(error instanceof StaleTaskLeaseError)) throw error;
        });

      let result: DispatchResult;
      try {
        // Read after the lease is ours, so the resolution sees the task as the lease holder does.
        const taskRow = await db.selectFrom('tasks').selectAll().where('id', '=', taskId).executeTakeFirst();
        if (!taskRow) throw new NotFoundError('task', taskId);
        const agentRow = await db
          .selectFrom('agents')
          .select(['id', 'workspace_id'])
          .where('id', '=', agentId)
          .executeTakeFirst();
        if (!agentRow) throw new NotFoundError('agent', agentId);
        const task = toTask(taskRow);
        let resolution: WorkspaceResolution;
        try {
          resolution = await resolve(task, { id: agentRow.id, workspaceId: agentRow.workspace_id });
        } catch (error) {
          if (!(error instanceof WorkspaceConfigurationError)) throw error;
          await releaseLease();
          if (input.mode === 'task-runner')
            throw new WorkspaceUnresolvedError(taskId, agentId, task.projectId, runId, error);
          return { outcome: 'skipped', reason: 'workspace_unresolved', error };
        }
        if (resolution.lockMode === 'none') {
          result = { outcome: 'dispatched', lockMode: 'none', workspace: null, taskLease };
        } else {
          const claim = await locks.claimWorkspaceLock(resolution.workspace.id, {
            holder: runId,
            runId,
            ttlMs,
            idempotencyKey: key('workspace-lock'),
          });
          if (claim.status === 'busy') {
            await releaseLease();
            return {
              outcome: 'cancelled',
              reason: 'workspace_busy',
              workspace: resolution.workspace,
              heldBy: claim.heldBy,
            };
          }
          result = {
            outcome: 'dispatched',
            lockMode: 'exclusive',
            workspace: resolution.workspace,
            source: resolution.source,
            taskLease,
            workspaceLock: claim.lease,
          };
        }
      } catch (error) {
        // Anything unexpected after the claim: give the task back before reporting it.
        if (!(error instanceof WorkspaceUnresolvedError)) await releaseLease().catch(() => {});
        throw error;
      }
      return result;
    },
  };
}

/**
 * Each call's declared outcome (see shared/outcomes.ts). `dispatchRun` claims with the store's
 * unobserved locks, so its own result is where its contention is reported: a run cancelled
 * because another run holds the workspace, or skipped because another run holds the task, is
 * `busy`; a heartbeat skipped for an unresolvable workspace holds nothing and is `committed`.
 */
export const SCHEDULER_OUTCOMES: OutcomeDeclarations<SchedulerRepository> = {
  resolveWorkspaceWithLockMode: { returned: () => ({ outcome: 'committed' }), stale: 'refused' },
  dispatchRun: {
    returned: (r) => ({
      outcome:
        r.outcome === 'dispatched'
          ? 'acquired'
          : r.reason === 'workspace_busy' || r.reason === 'task_leased'
            ? 'busy'
            : 'committed',
    }),
    stale: 'refused',
  },
};
