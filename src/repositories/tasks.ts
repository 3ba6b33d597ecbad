import { sql, type ExpressionBuilder, type Transaction } from 'kysely';
import { tableIn } from '../query/schema.js';
import { InvalidArgumentError, NotFoundError, TaskfenceError } from '../errors.js';
import {
  TASK_STATUSES,
  type Database,
  type NewTaskRow,
  type TaskRow,
  type TaskStatus,
  type WorkspaceMode,
} from '../schema/database.js';
import { normalizeWritePath } from '../domain/write-paths.js';
import { lockBarriers, refuseIfAdmitted } from './shared/barrier.js';
import { activeGroupOf } from './shared/groups.js';
import { auditLeaseActs } from './shared/audit.js';
import {
  callerMayTransition,
  endedDispatches,
  failedDependencyReason,
  openDependencies,
  openGateOf,
  propagateFinish,
  TaskTransitionRefusedError,
  waitingReason,
  INITIAL_TASK_STATUSES,
  type InitialTaskStatus,
} from './shared/lifecycle.js';
import { dispatchTaskLockKey, runTargetLockKey } from '../protocol.js';
import { toTask, type Task } from './shared/records.js';
import { findRunningRun } from './shared/running-run.js';
import type { StoreContext } from './context.js';
import {
  createOnce,
  keyedCall,
  keyedWrite,
  requireSameCreate,
  type IdempotencyOptions,
  type Reference,
} from './idempotent.js';
import {
  optionalId,
  optionalIdFilter,
  optionalInput,
  optionalKeyFilter,
  optionalStatusFilter,
  optionalString,
  requireBoolean,
  requireId,
  requireInput,
  requireJson,
  requireOneOf,
  requirePathList,
  requireText,
} from './validate.js';
import { committed, type OutcomeDeclarations } from './shared/outcomes.js';
import { extend } from '../objects.js';

/** What `createTask` and each item of `createTasks` take. */
export interface CreateTaskInput {
  readonly id?: string;
  readonly companyId: string;
  readonly title: string;
  readonly description?: string | null;
  /**
   * Default `backlog`. A task starts `backlog`, `todo`, `ready` or `blocked` (README "The work
   * lifecycle"); with a dependency not done it is stored `blocked` (reason: the dependencies),
   * whatever status is asked.
   */
  readonly status?: InitialTaskStatus;
  readonly projectId?: string | null;
  readonly assigneeAgentId?: string | null;
  /** An explicit workspace: the task runs with an exclusive lock on it. */
  readonly workspaceId?: string | null;
  /** Does this task mutate the working tree? Every creation path must decide (seed 000). */
  readonly requiresFilesystem: boolean;
  /** The orchestration target (from `resolveOrchestrationTargetKey`); null shares the null slot. */
  readonly targetKey?: string | null;
  readonly parentId?: string | null;
  /** `shared`: the child joins its parent's shared workspace group in the same transaction. */
  readonly workspaceMode?: WorkspaceMode | null;
  /** Paths the task writes; omitted/null = the whole workspace, [] = dynamic. */
  readonly writes?: readonly string[] | null;
  /** Higher is taken first by `dispatchNext`; an integer, default 0. */
  readonly priority?: number;
  /** A JSON payload describing the work (validated like a message payload). */
  readonly spec?: unknown;
  /**
   * Tasks this one waits for (same run and target). While any is not `done` the task is stored
   * `blocked` (reason: its dependencies), even when `status` says `ready`.
   */
  readonly dependsOn?: readonly string[];
}

/** `tasks.transitionTask`: the status the caller believes is current, and the one it wants. */
export interface TransitionTaskInput extends IdempotencyOptions {
  readonly from: TaskStatus;
  readonly to: TaskStatus;
  /** Stored as `blockedReason` when `to` is `blocked` (default: "blocked by caller"). */
  readonly reason?: string | null;
}

/** One dependency edge: `taskId` waits for `dependsOnId` to be done. */
export interface TaskDependency {
  readonly taskId: string;
  readonly dependsOnId: string;
  /** The dependency's status now. */
  readonly dependsOnStatus: TaskStatus;
  readonly createdAt: number;
}

/** Why a dependency edge was refused. */
export type DependencyRefusal = 'self' | 'cycle' | 'cross_run' | 'cross_target' | 'task_started';

/** A dependency edge was refused (a cycle, a task of another run or target, or a task already started); nothing changed. */
export class TaskDependencyRefusedError extends TaskfenceError {
  readonly code = 'TASK_DEPENDENCY_REFUSED';
  constructor(
    readonly taskId: string,
    readonly dependsOnId: string,
    readonly refusal: DependencyRefusal,
    detail: string,
  ) {
    super(
      `Task ${taskId} cannot depend on task ${dependsOnId}: ${detail}. ` +
        'Dependencies form a DAG inside one run and target, added before the task starts.',
    );
  }
}

/** Most dependencies one call adds. */
export const MAX_DEPENDENCIES = 1_000;

/** Most tasks one `createTasks` call creates. */
export const MAX_TASK_BATCH = 1_000;
/** Rows per INSERT statement in a batch (SQLite binds at most 32,766 parameters per statement). */
const INSERT_CHUNK = 500;

export interface ListTasksFilter {
  /** Only tasks of this coordinator run. */
  readonly runId?: string;
  readonly status?: TaskStatus | readonly TaskStatus[];
  readonly targetKey?: string | null;
  readonly parentId?: string;
}

/** Task creation and reads shared by every area. */
export interface TaskRepository {
  /**
   * Creates a task. In one write transaction it stamps the running coordinator run of the
   * task's target (if any) and, for a `shared` child, attaches the parent's workspace-group
   * membership: a child is never visible without its membership.
   */
  createTask(input: CreateTaskInput): Promise<Task>;
  /**
   * Creates up to `MAX_TASK_BATCH` tasks in one write transaction (one commit): **atomic**, every
   * task is created or none is, and the first refusal is thrown as `createTask` would throw it.
   * Each is created as `createTask` creates it (the running run of its target stamped, a `shared`
   * child's membership, dependencies), and idempotent by id the same way: a task whose id exists
   * with the same input is returned as stored, other input is `AlreadyExistsError`. `dependsOn`
   * may name tasks earlier in the batch (a later one is `INVALID_ARGUMENT`); a `parentId` names a
   * task that exists before the call. Returns the tasks in input order.
   *
   * @example
   * const [build, test] = await store.tasks.createTasks([
   *   { id: 'build', companyId, title: 'build', requiresFilesystem: true, targetKey, status: 'ready' },
   *   { id: 'test', companyId, title: 'test', requiresFilesystem: true, targetKey, status: 'ready', dependsOn: ['build'] },
   * ]);
   */
  createTasks(inputs: readonly CreateTaskInput[]): Promise<Task[]>;
  /** The task, or null if there is none with that id. */
  getTask(id: string): Promise<Task | null>;
  /** Like `getTask`, but a missing task is a `NotFoundError`. */
  requireTask(id: string): Promise<Task>;
  /** Tasks matching the filter, oldest first (by `seq`, the insertion order). */
  listTasks(filter?: ListTasksFilter): Promise<Task[]>;
  /**
   * Moves a task from `from` to `to` if `TASK_TRANSITIONS` lets the caller (README "The work
   * lifecycle") and the task is still `from`; otherwise `TaskTransitionRefusedError` and nothing
   * changes. Cancel (`to: 'cancelled'`) ends an in-flight task's active dispatch as cancelled and
   * blocks its dependents; retry is `failed`/`cancelled` → `ready`. A task becomes `ready` only
   * when its dependencies are all done.
   */
  transitionTask(taskId: string, input: TransitionTaskInput): Promise<Task>;
  /**
   * Adds the edge "`taskId` waits for `dependsOnId`", atomically with its checks (serialized per
   * target): a self edge, a cycle, a task of another run or target, or a task that already
   * started is refused with `TaskDependencyRefusedError`. A `ready` task with a dependency not
   * done becomes `blocked`. Adding an existing edge changes nothing.
   */
  addDependency(taskId: string, dependsOnId: string, options?: IdempotencyOptions): Promise<Task>;
  /** The dependencies of a task, oldest first, with their current statuses. */
  listDependencies(taskId: string): Promise<TaskDependency[]>;
}

/** Checks `writes` and stores canonical paths; a bad path is an `InvalidWritePathError` at creation, not at claim. */
function validateWrites(writes: unknown): readonly string[] | null {
  if (writes === undefined || writes === null) return null;
  if (!Array.isArray(writes) || writes.some((w) => typeof w !== 'string')) {
    throw new InvalidArgumentError(
      'writes',
      'must be an array of path strings, [] for dynamic, or null for the whole workspace',
    );
  }
  return (writes as string[]).map(normalizeWritePath);
}

/** Every argument of `createTask`, checked before its transaction (see validate.ts for the limits). */
function checkCreateTaskInput(input: CreateTaskInput): void {
  requireInput('input', input);
  optionalId('id', input.id);
  requireId('companyId', input.companyId);
  requireText('title', input.title);
  optionalString('description', input.description);
  if (input.status !== undefined) requireOneOf('status', input.status, INITIAL_TASK_STATUSES);
  optionalId('projectId', input.projectId);
  optionalId('assigneeAgentId', input.assigneeAgentId);
  optionalId('workspaceId', input.workspaceId);
  requireBoolean('requiresFilesystem', input.requiresFilesystem);
  optionalId('targetKey', input.targetKey);
  optionalId('parentId', input.parentId);
  if (input.workspaceMode !== undefined && input.workspaceMode !== null)
    requireOneOf('workspaceMode', input.workspaceMode, ['isolated', 'shared']);
  if (input.writes !== undefined && input.writes !== null) requirePathList('writes', input.writes);
  if (input.priority !== undefined) requirePriority(input.priority);
  if (input.dependsOn !== undefined) requireDependencyList(input.dependsOn);
}

/** A priority: a safe integer. */
function requirePriority(value: unknown): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || Math.abs(value) > 2_147_483_647)
    throw new InvalidArgumentError('priority', 'must be an integer from -2147483647 to 2147483647');
  return value;
}

/** A list of task ids, deduplicated. */
function requireDependencyList(value: unknown): string[] {
  if (!Array.isArray(value)) throw new InvalidArgumentError('dependsOn', 'must be an array of task ids');
  if (value.length > MAX_DEPENDENCIES)
    throw new InvalidArgumentError('dependsOn', `must hold at most ${MAX_DEPENDENCIES} task ids`);
  return [...new Set(value.map((id, i) => requireId(`dependsOn[${i}]`, id)))];
}

type Trx = Transaction<Database>;

/** Reads task rows, row-locked where the dialect has row locks (SQLite's write transaction already holds the database). */
function lockedTasks(ctx: StoreContext, trx: Trx, ids: readonly string[], mode: 'update' | 'share') {
  const query = trx.selectFrom('tasks').selectAll().where('id', 'in', ids).orderBy('id');
  if (!ctx.dialect.supportsSkipLocked) return query.execute();
  return mode === 'update' ? query.forUpdate().execute() : query.forShare().execute();
}

/** Refuses an edge to a task of another run or target. */
function checkSameScope(
  task: { id: string; coordinator_run_id: string | null; target_key: string | null },
  dep: { id: string; coordinator_run_id: string | null; target_key: string | null },
): void {
  if ((task.target_key ?? '') !== (dep.target_key ?? ''))
    throw new TaskDependencyRefusedError(
      task.id,
      dep.id,
      'cross_target',
      `it belongs to target ${JSON.stringify(dep.target_key)}, not ${JSON.stringify(task.target_key)}`,
    );
  if ((task.coordinator_run_id ?? '') !== (dep.coordinator_run_id ?? ''))
    throw new TaskDependencyRefusedError(
      task.id,
      dep.id,
      'cross_run',
      `it belongs to ${dep.coordinator_run_id === null ? 'no run' : `run ${dep.coordinator_run_id}`}, not ${
        task.coordinator_run_id === null ? 'no run' : `run ${task.coordinator_run_id}`
      }`,
    );
}

/** The status and reason a task with these dependency statuses is stored with (null: as asked). */
function blockedBy(deps: readonly { id: string; status: TaskStatus }[]): string | null {
  const failed = deps.find((d) => d.status === 'failed' || d.status === 'cancelled');
  if (failed) return failedDependencyReason(failed.id, failed.status);
  const open = deps.filter((d) => d.status !== 'done');
  return open.length === 0 ? null : waitingReason(open.map((d) => d.id));
}

// The typed refusals a keyed transition / dependency stores.
const TRANSITION_REFUSALS = [NotFoundError, TaskTransitionRefusedError];
const DEPENDENCY_REFUSALS = [NotFoundError, TaskDependencyRefusedError];

export function createTaskRepository(ctx: StoreContext): TaskRepository {
  const { dialect } = ctx;
  const repo: TaskRepository = {
    async createTask(input) {
      checkCreateTaskInput(input);
      const requiresFilesystem = requireBoolean('requiresFilesystem', input.requiresFilesystem);
      const status = input.status ?? 'backlog';
      if (input.targetKey === '') throw new InvalidArgumentError('targetKey', 'must be null or a non-empty key');
      const writes = validateWrites(input.writes);
      const priority = input.priority === undefined ? 0 : requirePriority(input.priority);
      const spec = requireJson('spec', input.spec);
      const dependsOn = input.dependsOn === undefined ? [] : requireDependencyList(input.dependsOn);
      const id = input.id ?? ctx.newId();
      const now = ctx.clock.now();
      const companyId = requireText('companyId', input.companyId);
      const title = requireText('title', input.title);
      const references = [
        ['company', 'companies', companyId],
        ['project', 'projects', input.projectId],
        ['assignee agent', 'agents', input.assigneeAgentId],
        ['workspace', 'workspaces', input.workspaceId],
      ] as const;
      return createOnce(dialect, references, () =>
        dialect.writeTransaction(
          async (trx): Promise<Task> => {
            if (input.id !== undefined) {
              const existing = await trx.selectFrom('tasks').selectAll().where('id', '=', id).executeTakeFirst();
              if (existing) {
                // A retry of this create (e.g. after COMMIT_OUTCOME_UNKNOWN): the same input gets the stored task.
                requireSameCreate('task', id, {
                  companyId: [companyId, existing.company_id],
                  title: [title, existing.title],
                  description: [input.description ?? null, existing.description],
                  projectId: [input.projectId ?? null, existing.project_id],
                  assigneeAgentId: [input.assigneeAgentId ?? null, existing.assignee_agent_id],
                  workspaceId: [input.workspaceId ?? null, existing.workspace_id],
                  requiresFilesystem: [requiresFilesystem ? 1 : 0, existing.requires_filesystem],
                  targetKey: [input.targetKey ?? null, existing.target_key],
                  parentId: [input.parentId ?? null, existing.parent_id],
                  workspaceMode: [input.workspaceMode ?? null, existing.workspace_mode],
                  writes: [writes === null ? null : JSON.stringify(writes), existing.writes],
                  priority: [priority, Number(existing.priority)],
                  spec: [spec, existing.spec],
                });
                return toTask(existing);
              }
            }
            // Run start takes the same key after inserting its run: whichever commits first, the
            // task ends up in the run (stamped here, or adopted there).
            await dialect.lockKey(trx, runTargetLockKey(input.targetKey ?? null));
            // The target's running run stamps the task. Only a dependency check needs it before the
            // insert; otherwise, where RETURNING shows the row (PostgreSQL), the insert reads it.
            const runInInsert = dialect.insertReturnsSeq && dependsOn.length === 0;
            const runId = runInInsert ? null : ((await findRunningRun(trx, input.targetKey ?? null))?.id ?? null);
            let groupId: string | null = null;
            if (input.parentId) {
              // The parent's cleanup barrier: once its cleanup is admitted its inventory is fixed,
              // so no child may join it.
              await lockBarriers(ctx, trx, [input.parentId]);
              const parent = await trx
                .selectFrom('tasks')
                .select('id')
                .where('id', '=', input.parentId)
                .executeTakeFirst();
              if (!parent) throw new NotFoundError('parent task', input.parentId);
              await refuseIfAdmitted(trx, 'create', id, [input.parentId]);
              if (input.workspaceMode === 'shared') {
                const membership = await activeGroupOf(trx, input.parentId);
                if (!membership) {
                  throw new InvalidArgumentError(
                    'workspaceMode',
                    `parent task ${input.parentId} has no shared workspace group to join`,
                  );
                }
                groupId = membership.id;
              }
            } else if (input.workspaceMode === 'shared') {
              throw new InvalidArgumentError(
                'workspaceMode',
                'a shared task needs a parentId whose workspace group it joins',
              );
            }
            const deps = dependsOn.length === 0 ? [] : await lockedTasks(ctx, trx, dependsOn, 'share');
            for (const depId of dependsOn)
              if (!deps.some((d) => d.id === depId)) throw new NotFoundError('task (dependency)', depId);
            for (const dep of deps)
              checkSameScope({ id, coordinator_run_id: runId, target_key: input.targetKey ?? null }, dep);
            const reason = blockedBy(deps);
            // Open dependencies always hold the task: it becomes ready when the last one is done.
            const stored = reason !== null ? 'blocked' : status;
            const row: NewTaskRow = {
              id,
              company_id: companyId,
              project_id: input.projectId ?? null,
              assignee_agent_id: input.assigneeAgentId ?? null,
              workspace_id: input.workspaceId ?? null,
              title,
              description: input.description ?? null,
              status: stored,
              created_at: now,
              updated_at: now,
              coordinator_run_id: runId,
              target_key: input.targetKey ?? null,
              requires_filesystem: requiresFilesystem ? 1 : 0,
              parent_id: input.parentId ?? null,
              workspace_mode: input.workspaceMode ?? null,
              writes: writes === null ? null : JSON.stringify(writes),
              priority,
              spec,
              blocked_reason: stored === 'blocked' ? reason : null,
            };
            // PostgreSQL's RETURNING sees the seq the database assigned; SQLite's trigger is read back below.
            const inserted = dialect.insertReturnsSeq
              ? await trx
                  .insertInto('tasks')
                  .values(
                    runInInsert
                      ? extend(row, {
                          coordinator_run_id: (eb: ExpressionBuilder<Database, 'tasks'>) =>
                            eb
                              .selectFrom('coordinator_runs')
                              .select('id')
                              .where('status', '=', 'running')
                              .where(sql<string>`coalesce(target_key, '')`, '=', input.targetKey ?? '')
                              .limit(1),
                        })
                      : row,
                  )
                  .returningAll()
                  .executeTakeFirstOrThrow()
              : (await trx.insertInto('tasks').values(row).execute(), undefined);
            if (dependsOn.length > 0) {
              await trx
                .insertInto('task_dependencies')
                .values(dependsOn.map((depId) => ({ task_id: id, depends_on_id: depId, created_at: now })))
                .execute();
            }
            if (groupId) {
              await trx
                .insertInto('workspace_group_members')
                .values({ group_id: groupId, task_id: id, role: 'member', joined_at: now })
                .execute();
            }
            // What the transaction wrote (with the seq the database assigned), not a read after it:
            // a connection lost after COMMIT must not turn a created task into a failure.
            return toTask(
              inserted ?? (await trx.selectFrom('tasks').selectAll().where('id', '=', id).executeTakeFirstOrThrow()),
            );
          },
          { lockKeys: [runTargetLockKey(input.targetKey ?? null)] },
        ),
      );
    },

    async createTasks(inputs) {
      if (!Array.isArray(inputs)) throw new InvalidArgumentError('inputs', 'must be an array of createTask inputs');
      if (inputs.length > MAX_TASK_BATCH)
        throw new InvalidArgumentError('inputs', `must hold at most ${MAX_TASK_BATCH} tasks`);
      const items = (inputs as readonly CreateTaskInput[]).map((input, i) => prepareCreate(ctx, input, i));
      const position = new Map<string, number>();
      items.forEach((item, i) => {
        if (position.has(item.id)) throw new InvalidArgumentError(`inputs[${i}].id`, `repeats task id ${item.id}`);
        position.set(item.id, i);
      });
      items.forEach((item, i) => {
        for (const dep of item.dependsOn) {
          const at = position.get(dep);
          if (at !== undefined && at >= i)
            throw new InvalidArgumentError(`inputs[${i}].dependsOn`, `names ${dep}, which is not earlier in the batch`);
        }
        if (item.input.parentId && position.has(item.input.parentId))
          throw new InvalidArgumentError(`inputs[${i}].parentId`, 'must name a task that exists before the call');
      });
      if (items.length === 0) return [];
      const references = items.flatMap((item) => item.references);
      return createOnce(
        dialect,
        references,
        () => dialect.writeTransaction((trx) => createTasksIn(ctx, trx, items, position)),
        items.length + 1,
      );
    },

    async getTask(id) {
      requireId('id', id);
      const row = await dialect.db.selectFrom('tasks').selectAll().where('id', '=', id).executeTakeFirst();
      return row ? toTask(row) : null;
    },

    async requireTask(id) {
      requireId('id', id);
      const task = await repo.getTask(id);
      if (!task) throw new NotFoundError('task', id);
      return task;
    },

    async listTasks(options) {
      const filter = optionalInput('filter', options);
      const runId = optionalIdFilter('runId', filter.runId);
      const parentId = optionalIdFilter('parentId', filter.parentId);
      const targetKey = optionalKeyFilter('targetKey', filter.targetKey);
      const statuses = optionalStatusFilter('status', filter.status, TASK_STATUSES);
      if (statuses !== null && statuses.length === 0) return [];
      let query = dialect.db.selectFrom('tasks').selectAll();
      if (runId !== undefined) query = query.where('coordinator_run_id', '=', runId);
      if (parentId !== undefined) query = query.where('parent_id', '=', parentId);
      if (targetKey !== undefined) {
        query = targetKey === null ? query.where('target_key', 'is', null) : query.where('target_key', '=', targetKey);
      }
      if (statuses !== null) query = query.where('status', 'in', statuses);
      const rows = await query.orderBy('seq').execute();
      return rows.map(toTask);
    },

    async transitionTask(taskId, input) {
      requireId('taskId', taskId);
      requireInput('input', input);
      const from = requireOneOf('from', input.from, TASK_STATUSES);
      const to = requireOneOf('to', input.to, TASK_STATUSES);
      const reason = optionalString('reason', input.reason);
      if (!callerMayTransition(from, to)) {
        const current = await repo.requireTask(taskId);
        throw new TaskTransitionRefusedError(taskId, from, to, current.status, 'not_in_table');
      }
      const call = keyedCall('tasks.transitionTask', input, { taskId, from, to, reason }, TRANSITION_REFUSALS);
      return keyedWrite(ctx, call, async (trx) => {
        // The dispatch key first: a cancel ends the task's active dispatch, as dispatch calls do.
        await dialect.lockKey(trx, dispatchTaskLockKey(taskId));
        const [task] = await lockedTasks(ctx, trx, [taskId], 'update');
        if (!task) throw new NotFoundError('task', taskId);
        if (task.status !== from) throw new TaskTransitionRefusedError(taskId, from, to, task.status, 'stale_from');
        if (to === 'ready' && (await openDependencies(trx, taskId)).length > 0)
          throw new TaskTransitionRefusedError(taskId, from, to, task.status, 'open_dependencies');
        if (to === 'ready' && (await openGateOf(trx, taskId)) !== null)
          throw new TaskTransitionRefusedError(taskId, from, to, task.status, 'open_gate');
        const now = ctx.clock.now();
        if (to === 'cancelled') {
          const ended = await trx
            .updateTable('dispatch_contexts')
            .set({ status: 'cancelled', updated_at: now, ended_at: now, error: reason ?? 'task cancelled' })
            .where('task_id', '=', taskId)
            .where('status', '=', 'active')
            .returning(['id', 'terminal_handle', 'seq', 'status'])
            .execute();
          await auditLeaseActs(ctx, trx, now, endedDispatches(ended, 'tasks.transitionTask'));
        }
        const row = await trx
          .updateTable('tasks')
          .set({
            status: to,
            updated_at: now,
            blocked_reason: to === 'blocked' ? (reason ?? 'blocked by caller') : null,
          })
          .where('id', '=', taskId)
          .where('status', '=', from)
          .returningAll()
          .executeTakeFirstOrThrow();
        if (to === 'cancelled') await propagateFinish(trx, taskId, 'cancelled', now, dialect.supportsSkipLocked);
        return toTask(row);
      });
    },

    async addDependency(taskId, dependsOnId, options) {
      requireId('taskId', taskId);
      requireId('dependsOnId', dependsOnId);
      if (taskId === dependsOnId)
        throw new TaskDependencyRefusedError(taskId, dependsOnId, 'self', 'a task cannot wait for itself');
      const opts = optionalInput('options', options);
      const call = keyedCall('tasks.addDependency', opts, { taskId, dependsOnId }, DEPENDENCY_REFUSALS);
      return keyedWrite(ctx, call, async (trx) => {
        const target = await trx.selectFrom('tasks').select('target_key').where('id', '=', taskId).executeTakeFirst();
        if (!target) throw new NotFoundError('task', taskId);
        // Every edge of a target is added under its run-target key, so two concurrent edges that
        // would close a cycle are checked one after the other.
        await dialect.lockKey(trx, runTargetLockKey(target.target_key));
        const [task] = await lockedTasks(ctx, trx, [taskId], 'update');
        const [dep] = await lockedTasks(ctx, trx, [dependsOnId], 'share');
        if (!task) throw new NotFoundError('task', taskId);
        if (!dep) throw new NotFoundError('task (dependency)', dependsOnId);
        if (!['backlog', 'todo', 'ready', 'blocked'].includes(task.status))
          throw new TaskDependencyRefusedError(
            taskId,
            dependsOnId,
            'task_started',
            `task ${taskId} is already ${task.status}`,
          );
        checkSameScope(task, dep);
        const existing = await trx
          .selectFrom('task_dependencies')
          .select('task_id')
          .where('task_id', '=', taskId)
          .where('depends_on_id', '=', dependsOnId)
          .executeTakeFirst();
        if (existing) return toTask(task);
        if (await reaches(trx, dependsOnId, taskId))
          throw new TaskDependencyRefusedError(
            taskId,
            dependsOnId,
            'cycle',
            `task ${dependsOnId} already waits for task ${taskId}, directly or through others`,
          );
        const now = ctx.clock.now();
        await trx
          .insertInto('task_dependencies')
          .values({ task_id: taskId, depends_on_id: dependsOnId, created_at: now })
          .execute();
        const reason = blockedBy([{ id: dep.id, status: dep.status }]);
        if (reason !== null && task.status === 'ready') {
          const blocked = await trx
            .updateTable('tasks')
            .set({ status: 'blocked', blocked_reason: reason, updated_at: now })
            .where('id', '=', taskId)
            .returningAll()
            .executeTakeFirstOrThrow();
          return toTask(blocked);
        }
        return toTask(task);
      });
    },

    async listDependencies(taskId) {
      requireId('taskId', taskId);
      const rows = await dialect.db
        .selectFrom('task_dependencies as d')
        .innerJoin('tasks as t', 't.id', 'd.depends_on_id')
        .select(['d.task_id', 'd.depends_on_id', 'd.created_at', 't.status'])
        .where('d.task_id', '=', taskId)
        .orderBy('t.seq')
        .execute();
      return rows.map((r) => ({
        taskId: r.task_id,
        dependsOnId: r.depends_on_id,
        dependsOnStatus: r.status,
        createdAt: Number(r.created_at),
      }));
    },
  };
  return repo;
}

/** Does `from` wait for `to`, directly or through others? (A recursive walk of the edges, in the transaction.) */
async function reaches(trx: Trx, from: string, to: string): Promise<boolean> {
  const deps = tableIn(trx, 'task_dependencies');
  const found = await sql<{ hit: number }>`
    with recursive reach(id) as (
      select depends_on_id from ${deps} where task_id = ${from}
      union
      select d.depends_on_id from ${deps} d join reach r on d.task_id = r.id
    )
    select 1 as hit from reach where id = ${to} limit 1`.execute(trx);
  return found.rows.length > 0;
}

/** A `createTask` input, checked and normalized before the transaction. */
interface PreparedCreate {
  readonly input: CreateTaskInput;
  readonly id: string;
  readonly companyId: string;
  readonly title: string;
  readonly status: TaskStatus;
  readonly requiresFilesystem: boolean;
  readonly writes: readonly string[] | null;
  readonly priority: number;
  readonly spec: string | null;
  readonly dependsOn: readonly string[];
  readonly references: readonly Reference[];
}

/** `createTask`'s checks for item `i` of a batch, with the field names prefixed `inputs[i].`. */
function prepareCreate(ctx: StoreContext, input: CreateTaskInput, i: number): PreparedCreate {
  try {
    checkCreateTaskInput(input);
    if (input.targetKey === '') throw new InvalidArgumentError('targetKey', 'must be null or a non-empty key');
    const companyId = requireText('companyId', input.companyId);
    return {
      input,
      id: input.id ?? ctx.newId(),
      companyId,
      title: requireText('title', input.title),
      status: input.status ?? 'backlog',
      requiresFilesystem: requireBoolean('requiresFilesystem', input.requiresFilesystem),
      writes: validateWrites(input.writes),
      priority: input.priority === undefined ? 0 : requirePriority(input.priority),
      spec: requireJson('spec', input.spec),
      dependsOn: input.dependsOn === undefined ? [] : requireDependencyList(input.dependsOn),
      references: [
        ['company', 'companies', companyId],
        ['project', 'projects', input.projectId],
        ['assignee agent', 'agents', input.assigneeAgentId],
        ['workspace', 'workspaces', input.workspaceId],
      ],
    };
  } catch (error) {
    if (error instanceof InvalidArgumentError) {
      throw new InvalidArgumentError(`inputs[${i}].${error.field}`, error.reason);
    }
    throw error;
  }
}

/**
 * The batch's transaction. Keys are taken once, up front and in the documented order: every
 * target's run-target key (level 2, sorted), then every parent's cleanup barrier (level 3,
 * sorted), so a batch never takes a key above one it holds. Then one read per kind (existing ids,
 * running runs, dependencies) and one multi-row INSERT per table, whatever the batch's size.
 */
async function createTasksIn(
  ctx: StoreContext,
  trx: Trx,
  items: readonly PreparedCreate[],
  position: ReadonlyMap<string, number>,
): Promise<Task[]> {
  const { dialect } = ctx;
  const now = ctx.clock.now();
  const named = items.filter((item) => item.input.id !== undefined).map((item) => item.id);
  const existing = new Map<string, TaskRow>();
  for (const chunk of chunks(named, INSERT_CHUNK)) {
    for (const row of await trx.selectFrom('tasks').selectAll().where('id', 'in', chunk).execute())
      existing.set(row.id, row);
  }
  for (const item of items) {
    const stored = existing.get(item.id);
    // A retry of this create (e.g. after COMMIT_OUTCOME_UNKNOWN): the same input gets the stored task.
    if (stored) requireSameCreate('task', item.id, sameCreateFields(item, stored));
  }
  const fresh = items.filter((item) => !existing.has(item.id));
  const targets = [...new Set(fresh.map((item) => item.input.targetKey ?? null))];
  for (const target of targets.map((t) => runTargetLockKey(t)).sort()) await dialect.lockKey(trx, target);
  const parents = [...new Set(fresh.flatMap((item) => (item.input.parentId ? [item.input.parentId] : [])))];
  if (parents.length > 0) await lockBarriers(ctx, trx, parents);
  const runOf = new Map<string, string | null>();
  for (const target of targets) runOf.set(target ?? '', (await findRunningRun(trx, target))?.id ?? null);

  // Each parent checked as createTask checks it (exists, not admitted for cleanup; its group for a shared child).
  const groupOf = new Map<string, string | null>();
  for (const item of fresh) {
    const parentId = item.input.parentId;
    if (!parentId) {
      if (item.input.workspaceMode === 'shared')
        throw new InvalidArgumentError(
          'workspaceMode',
          'a shared task needs a parentId whose workspace group it joins',
        );
      continue;
    }
    if (!groupOf.has(parentId)) {
      const parent = await trx.selectFrom('tasks').select('id').where('id', '=', parentId).executeTakeFirst();
      if (!parent) throw new NotFoundError('parent task', parentId);
      groupOf.set(parentId, (await activeGroupOf(trx, parentId))?.id ?? null);
    }
    await refuseIfAdmitted(trx, 'create', item.id, [parentId]);
    if (item.input.workspaceMode === 'shared' && !groupOf.get(parentId))
      throw new InvalidArgumentError('workspaceMode', `parent task ${parentId} has no shared workspace group to join`);
  }

  // Dependencies outside the batch, row-locked as createTask locks them; inside it, the rows about to be written.
  const outside = [...new Set(fresh.flatMap((item) => item.dependsOn.filter((dep) => !position.has(dep))))];
  const depRows = new Map<
    string,
    { id: string; status: TaskStatus; coordinator_run_id: string | null; target_key: string | null }
  >();
  for (const chunk of chunks(outside, INSERT_CHUNK))
    for (const row of await lockedTasks(ctx, trx, chunk, 'share')) depRows.set(row.id, row);
  for (const [id, row] of existing) depRows.set(id, row);

  const rows: NewTaskRow[] = [];
  for (const item of fresh) {
    const input = item.input;
    const runId = runOf.get(input.targetKey ?? '') ?? null;
    const deps = item.dependsOn.map((depId) => {
      const dep = depRows.get(depId);
      if (!dep) throw new NotFoundError('task (dependency)', depId);
      checkSameScope({ id: item.id, coordinator_run_id: runId, target_key: input.targetKey ?? null }, dep);
      return dep;
    });
    const reason = blockedBy(deps);
    const stored = reason !== null && (item.status === 'ready' || item.status === 'blocked') ? 'blocked' : item.status;
    const row: NewTaskRow = {
      id: item.id,
      company_id: item.companyId,
      project_id: input.projectId ?? null,
      assignee_agent_id: input.assigneeAgentId ?? null,
      workspace_id: input.workspaceId ?? null,
      title: item.title,
      description: input.description ?? null,
      status: stored,
      created_at: now,
      updated_at: now,
      coordinator_run_id: runId,
      target_key: input.targetKey ?? null,
      requires_filesystem: item.requiresFilesystem ? 1 : 0,
      parent_id: input.parentId ?? null,
      workspace_mode: input.workspaceMode ?? null,
      writes: item.writes === null ? null : JSON.stringify(item.writes),
      priority: item.priority,
      spec: item.spec,
      blocked_reason: stored === 'blocked' ? reason : null,
    };
    rows.push(row);
    // A later item of the batch that depends on this one sees what is about to be stored.
    depRows.set(item.id, {
      id: item.id,
      status: stored,
      coordinator_run_id: runId,
      target_key: row.target_key ?? null,
    });
  }
  // In input order, so `seq` follows the batch's order.
  for (const chunk of chunks(rows, INSERT_CHUNK)) await trx.insertInto('tasks').values(chunk).execute();
  const edges = fresh.flatMap((item) =>
    item.dependsOn.map((depId) => ({ task_id: item.id, depends_on_id: depId, created_at: now })),
  );
  for (const chunk of chunks(edges, INSERT_CHUNK)) await trx.insertInto('task_dependencies').values(chunk).execute();
  const members = fresh.flatMap((item) => {
    const groupId =
      item.input.workspaceMode === 'shared' && item.input.parentId ? groupOf.get(item.input.parentId) : null;
    return groupId ? [{ group_id: groupId, task_id: item.id, role: 'member' as const, joined_at: now }] : [];
  });
  for (const chunk of chunks(members, INSERT_CHUNK))
    await trx.insertInto('workspace_group_members').values(chunk).execute();
  // Read back inside the transaction (the seq the database assigned), as createTask does.
  const written = new Map(existing);
  for (const chunk of chunks(
    fresh.map((item) => item.id),
    INSERT_CHUNK,
  ))
    for (const row of await trx.selectFrom('tasks').selectAll().where('id', 'in', chunk).execute())
      written.set(row.id, row);
  return items.map((item) => toTask(written.get(item.id)!));
}

/** What `requireSameCreate` compares for a retried create of a stored task. */
function sameCreateFields(item: PreparedCreate, existing: TaskRow) {
  const input = item.input;
  return {
    companyId: [item.companyId, existing.company_id],
    title: [item.title, existing.title],
    description: [input.description ?? null, existing.description],
    projectId: [input.projectId ?? null, existing.project_id],
    assigneeAgentId: [input.assigneeAgentId ?? null, existing.assignee_agent_id],
    workspaceId: [input.workspaceId ?? null, existing.workspace_id],
    requiresFilesystem: [item.requiresFilesystem ? 1 : 0, existing.requires_filesystem],
    targetKey: [input.targetKey ?? null, existing.target_key],
    parentId: [input.parentId ?? null, existing.parent_id],
    workspaceMode: [input.workspaceMode ?? null, existing.workspace_mode],
    writes: [item.writes === null ? null : JSON.stringify(item.writes), existing.writes],
    priority: [item.priority, Number(existing.priority)],
    spec: [item.spec, existing.spec],
  } as const;
}

function chunks<T>(list: readonly T[], size: number): T[][] {
  const out: T[][] = [];
  for (let i = 0; i < list.length; i += size) out.push(list.slice(i, i + size));
  return out;
}
/** Each call's declared outcome (see shared/outcomes.ts). */
export const TASK_OUTCOMES: OutcomeDeclarations<TaskRepository> = {
  createTask: committed,
  createTasks: committed,
  getTask: committed,
  requireTask: committed,
  listTasks: committed,
  transitionTask: committed,
  addDependency: committed,
  listDependencies: committed,
};
