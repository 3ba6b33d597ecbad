import { InvalidArgumentError, NotFoundError } from '../errors.js';
import { TASK_STATUSES, type TaskRow, type TaskStatus, type WorkspaceMode } from '../schema/database.js';
import { normalizeWritePath } from '../domain/write-paths.js';
import { lockBarriers, refuseIfAdmitted } from './shared/barrier.js';
import { activeGroupOf } from './shared/groups.js';
import { runTargetLockKey } from './shared/lock-keys.js';
import { toTask, type Task } from './shared/records.js';
import { findRunningRun } from './shared/running-run.js';
import type { StoreContext } from './context.js';
import { createOnce, requireSameCreate } from './idempotent.js';
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
  requireOneOf,
  requirePathList,
  requireText,
} from './validate.js';

export interface CreateTaskInput {
  readonly id?: string;
  readonly companyId: string;
  readonly title: string;
  readonly description?: string | null;
  /** Default `backlog`. */
  readonly status?: TaskStatus;
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
}

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
  getTask(id: string): Promise<Task | null>;
  /** Like `getTask`, but a missing task is a `NotFoundError`. */
  requireTask(id: string): Promise<Task>;
  /** Tasks matching the filter, oldest first. */
  listTasks(filter?: ListTasksFilter): Promise<Task[]>;
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
  if (input.status !== undefined) requireOneOf('status', input.status, TASK_STATUSES);
  optionalId('projectId', input.projectId);
  optionalId('assigneeAgentId', input.assigneeAgentId);
  optionalId('workspaceId', input.workspaceId);
  requireBoolean('requiresFilesystem', input.requiresFilesystem);
  optionalId('targetKey', input.targetKey);
  optionalId('parentId', input.parentId);
  if (input.workspaceMode !== undefined && input.workspaceMode !== null)
    requireOneOf('workspaceMode', input.workspaceMode, ['isolated', 'shared']);
  if (input.writes !== undefined && input.writes !== null) requirePathList('writes', input.writes);
}

export function createTaskRepository(ctx: StoreContext): TaskRepository {
  const { dialect } = ctx;
  const repo: TaskRepository = {
    async createTask(input) {
      checkCreateTaskInput(input);
      const requiresFilesystem = requireBoolean('requiresFilesystem', input.requiresFilesystem);
      const status = input.status ?? 'backlog';
      if (!TASK_STATUSES.includes(status))
        throw new InvalidArgumentError('status', `must be one of ${TASK_STATUSES.join(', ')}`);
      if (input.targetKey === '') throw new InvalidArgumentError('targetKey', 'must be null or a non-empty key');
      const writes = validateWrites(input.writes);
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
        dialect.writeTransaction(async (trx): Promise<Task> => {
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
              });
              return toTask(existing);
            }
          }
          // Run start takes the same key after inserting its run: whichever commits first, the
          // task ends up in the run (stamped here, or adopted there).
          await dialect.lockKey(trx, runTargetLockKey(input.targetKey ?? null));
          const runId = (await findRunningRun(trx, input.targetKey ?? null))?.id ?? null;
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
          const row: TaskRow = {
            id,
            company_id: companyId,
            project_id: input.projectId ?? null,
            assignee_agent_id: input.assigneeAgentId ?? null,
            workspace_id: input.workspaceId ?? null,
            title,
            description: input.description ?? null,
            status,
            created_at: now,
            updated_at: now,
            coordinator_run_id: runId,
            target_key: input.targetKey ?? null,
            requires_filesystem: requiresFilesystem ? 1 : 0,
            parent_id: input.parentId ?? null,
            workspace_mode: input.workspaceMode ?? null,
            writes: writes === null ? null : JSON.stringify(writes),
          };
          await trx.insertInto('tasks').values(row).execute();
          if (groupId) {
            await trx
              .insertInto('workspace_group_members')
              .values({ group_id: groupId, task_id: id, role: 'member', joined_at: now })
              .execute();
          }
          // What the transaction wrote, not a read after it: a connection lost after COMMIT must not turn a created task into a failure.
          return toTask(row);
        }),
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
      const rows = await query.orderBy('created_at').orderBy('id').execute();
      return rows.map(toTask);
    },
  };
  return repo;
}
