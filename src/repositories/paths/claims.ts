/**
 * A task's path claim (`claimTask`) and its result (`submitTaskResult`): the leases a task takes
 * for its declared writes, and their release when it finishes.
 */
import { leaseKeys, WHOLE_WORKSPACE_KEY, decodePathLeaseKey } from '../../domain/write-paths.js';
import { NotFoundError } from '../../errors.js';
import type { TaskStatus } from '../../schema/database.js';
import type { StoreContext } from '../context.js';
import { pathsLockKey } from '../shared/lock-keys.js';
import { acquireKeys } from './acquire.js';
import { pathsTopic } from './statements.js';
import {
  PathClaimRefusedError,
  showKey,
  type PathClaimResult,
  type PathTaskSubmission,
  type TaskWriteMode,
} from './types.js';

const FINISHED: readonly TaskStatus[] = ['done', 'failed', 'cancelled'];

/** `claimTask` (validated input); its guarantee is stated on `PathLeaseRepository`. */
export async function claimTask(
  ctx: StoreContext,
  taskId: string,
  holder: string,
  ttlMs: number,
): Promise<PathClaimResult> {
  const { dialect } = ctx;
  return dialect.writeTransaction(async (trx): Promise<PathClaimResult> => {
    const task = await trx
      .selectFrom('tasks')
      .select(['workspace_id', 'writes', 'status'])
      .where('id', '=', taskId)
      .executeTakeFirst();
    if (!task) throw new NotFoundError('task', taskId);
    if (FINISHED.includes(task.status)) {
      throw new PathClaimRefusedError(taskId, holder, 'task_finished', `it is already ${task.status}`);
    }
    if (task.workspace_id === null) {
      throw new PathClaimRefusedError(taskId, holder, 'task_has_no_workspace', 'it has no workspace to lease paths in');
    }
    const writes = task.writes === null ? null : (JSON.parse(task.writes) as string[]);
    const mode: TaskWriteMode = writes === null ? 'whole-workspace' : writes.length === 0 ? 'dynamic' : 'paths';
    const keys = writes === null ? [WHOLE_WORKSPACE_KEY] : leaseKeys(writes);
    const result = await acquireKeys(ctx, trx, task.workspace_id, holder, keys, ttlMs, taskId);
    if (!result.acquired) return { claimed: false, mode, conflicts: result.conflicts };
    await trx
      .updateTable('tasks')
      .set({ status: 'in_progress', updated_at: ctx.clock.now() })
      .where('id', '=', taskId)
      .execute();
    return { claimed: true, mode, leases: result.leases };
  });
}

/** `submitTaskResult` (validated input); its guarantee is stated on `PathLeaseRepository`. */
export async function submitTaskResult(
  ctx: StoreContext,
  taskId: string,
  holder: string,
  status: 'done' | 'failed',
): Promise<PathTaskSubmission> {
  const { dialect } = ctx;
  return dialect.writeTransaction(async (trx) => {
    const task = await trx
      .selectFrom('tasks')
      .select(['workspace_id', 'status'])
      .where('id', '=', taskId)
      .executeTakeFirst();
    if (!task) throw new NotFoundError('task', taskId);
    if (FINISHED.includes(task.status)) {
      throw new PathClaimRefusedError(taskId, holder, 'task_finished', `it is already ${task.status}`);
    }
    if (task.workspace_id !== null) await dialect.lockKey(trx, pathsLockKey(task.workspace_id));
    const now = ctx.clock.now();
    const other = await trx
      .selectFrom('path_leases')
      .select(['holder', 'lease_key'])
      .where('task_id', '=', taskId)
      .where('holder', '<>', holder)
      .where('expires_at', '>', now)
      .executeTakeFirst();
    if (other) {
      throw new PathClaimRefusedError(
        taskId,
        holder,
        'held_by_other_holder',
        `holder ${JSON.stringify(other.holder)} holds its lease on ${showKey(decodePathLeaseKey(other.lease_key))}`,
      );
    }
    const released = await trx.deleteFrom('path_leases').where('task_id', '=', taskId).returning('lease_key').execute();
    if (released.length > 0 && task.workspace_id !== null)
      await dialect.wakeups.notify(trx, pathsTopic(task.workspace_id));
    await trx.updateTable('tasks').set({ status, updated_at: now }).where('id', '=', taskId).execute();
    return { status, released: released.map((r) => decodePathLeaseKey(r.lease_key)).sort() };
  });
}
