/**
 * A task's path claim (`claimTask`) and its result (`submitTaskResult`): the leases a task takes
 * for its declared writes, and their release when it finishes.
 */
import { leaseKeys, WHOLE_WORKSPACE_KEY, decodePathLeaseKey } from '../../domain/write-paths.js';
import { NotFoundError } from '../../errors.js';
import type { TaskStatus } from '../../schema/database.js';
import { auditLeaseActs, type LeaseActRecord } from '../shared/audit.js';
import type { StoreContext } from '../context.js';
import { keyedWrite, type IdempotentCall } from '../idempotent.js';
import type { Lease } from '../shared/lease.js';
import {
  afterTaskFinished,
  GateOpenError,
  requireNoOpenGate,
  requireTaskDispatchLease,
  TaskTransitionRefusedError,
} from '../shared/lifecycle.js';
import { dispatchTaskLockKey, pathsLockKey, pathsTopic } from '../../protocol.js';
import { acquireKeys } from './acquire.js';
import {
  PathClaimRefusedError,
  PathLeaseLostError,
  type PathLeaseGrant,
  showKey,
  type PathClaimResult,
  type PathTaskSubmission,
  type TaskWriteMode,
} from './types.js';

const FINISHED: readonly TaskStatus[] = ['done', 'failed', 'cancelled'];
/** The statuses `claimTask` moves to `in_progress` (TASK_TRANSITIONS; `in_progress` is a re-claim). */
export const CLAIMABLE: readonly TaskStatus[] = ['ready', 'dispatched', 'in_progress'];
/** The status `submitTaskResult` finishes (TASK_TRANSITIONS): a task claimed with `claimTask`. */
export const SUBMITTABLE: readonly TaskStatus[] = ['in_progress'];

/** The typed refusals a keyed `claimTask` / `submitTaskResult` stores (a busy claim is a result). */
export const CLAIM_REFUSALS = [NotFoundError, PathClaimRefusedError];
export const SUBMIT_REFUSALS = [NotFoundError, PathClaimRefusedError, PathLeaseLostError, GateOpenError];

/** `claimTask` (validated input); its guarantee is stated on `PathLeaseRepository`. */
export async function claimTask(
  ctx: StoreContext,
  taskId: string,
  holder: string,
  ttlMs: number,
  dispatchLease: Lease<'dispatch'> | undefined,
  call: IdempotentCall | null = null,
): Promise<PathClaimResult> {
  const { dialect } = ctx;
  return keyedWrite(ctx, call, async (trx): Promise<PathClaimResult> => {
    // The task's dispatch key, then its row (locked on PostgreSQL) before the claim's row: a
    // dispatch of the task moves the task row first and then drops the claim, in the same order.
    await dialect.lockKey(trx, dispatchTaskLockKey(taskId));
    const read = trx.selectFrom('tasks').select(['workspace_id', 'writes', 'status']).where('id', '=', taskId);
    const task = await (dialect.supportsSkipLocked ? read.forUpdate() : read).executeTakeFirst();
    if (!task) throw new NotFoundError('task', taskId);
    if (FINISHED.includes(task.status)) {
      throw new PathClaimRefusedError(taskId, holder, 'task_finished', `it is already ${task.status}`);
    }
    if (!CLAIMABLE.includes(task.status))
      throw new TaskTransitionRefusedError(taskId, task.status, 'in_progress', task.status, 'not_in_table');
    await requireTaskDispatchLease(trx, taskId, dispatchLease);
    if (task.workspace_id === null) {
      throw new PathClaimRefusedError(taskId, holder, 'task_has_no_workspace', 'it has no workspace to lease paths in');
    }
    const writes = task.writes === null ? null : (JSON.parse(task.writes) as string[]);
    const mode: TaskWriteMode = writes === null ? 'whole-workspace' : writes.length === 0 ? 'dynamic' : 'paths';
    const keys = writes === null ? [WHOLE_WORKSPACE_KEY] : leaseKeys(writes);
    const result = await acquireKeys(ctx, trx, task.workspace_id, holder, keys, ttlMs, taskId);
    if (result.status === 'busy')
      return { status: 'busy', mode, heldBy: result.heldBy, claimed: false, conflicts: result.conflicts };
    const now = ctx.clock.now();
    // The task's current claim: a later claim supersedes this grant, whatever its holder name.
    const { token, workspaceId } = result.lease;
    await trx
      .insertInto('path_lease_claims')
      .values({ task_id: taskId, workspace_id: workspaceId, holder, token, claimed_at: now })
      .onConflict((oc) =>
        oc.column('task_id').doUpdateSet({ workspace_id: workspaceId, holder, token, claimed_at: now }),
      )
      .execute();
    await trx.updateTable('tasks').set({ status: 'in_progress', updated_at: now }).where('id', '=', taskId).execute();
    return { status: 'acquired', mode, lease: result.lease, claimed: true, leases: result.leases };
  });
}

/** The trail's rows of the task's path leases a result released: one per grant (token), with its keys. */
function releasedGrants(
  workspaceId: string,
  rows: readonly { lease_key: string; holder: string; token: number | null }[],
  status: 'done' | 'failed',
): LeaseActRecord[] {
  const grants = new Map<string, { holder: string; token: number | null; keys: string[] }>();
  for (const row of rows) {
    const token = row.token === null ? null : Number(row.token);
    const id = `${token}\0${row.holder}`;
    const grant = grants.get(id) ?? { holder: row.holder, token, keys: [] };
    grant.keys.push(decodePathLeaseKey(row.lease_key));
    grants.set(id, grant);
  }
  return [...grants.values()].map((g) => ({
    act: 'released',
    kind: 'path_lease',
    resource: workspaceId,
    holder: g.holder,
    token: g.token,
    detail: { keys: g.keys.sort(), by: 'paths.submitTaskResult', status },
  }));
}

/** `submitTaskResult` (validated input); its guarantee is stated on `PathLeaseRepository`. */
export async function submitTaskResult(
  ctx: StoreContext,
  taskId: string,
  by: string | PathLeaseGrant,
  status: 'done' | 'failed',
  dispatchLease: Lease<'dispatch'> | undefined,
  call: IdempotentCall | null = null,
): Promise<PathTaskSubmission> {
  const holder = typeof by === 'string' ? by : by.holder;
  const { dialect } = ctx;
  return keyedWrite(ctx, call, async (trx) => {
    // The task's dispatch key first (it precedes the workspace's paths key in the lock order):
    // the result ends the task's active dispatch in this transaction, as completeDispatch does.
    await dialect.lockKey(trx, dispatchTaskLockKey(taskId));
    const task = await trx
      .selectFrom('tasks')
      .select(['workspace_id', 'status'])
      .where('id', '=', taskId)
      .executeTakeFirst();
    if (!task) throw new NotFoundError('task', taskId);
    if (FINISHED.includes(task.status)) {
      throw new PathClaimRefusedError(taskId, holder, 'task_finished', `it is already ${task.status}`);
    }
    // Only a claimed task takes a result: a blocked, ready or backlog one is not the table's.
    if (!SUBMITTABLE.includes(task.status))
      throw new TaskTransitionRefusedError(taskId, task.status, status, task.status, 'not_in_table');
    // The dispatch fence: with `dispatchLease`, it must be the task's active dispatch's.
    const active = await requireTaskDispatchLease(trx, taskId, dispatchLease);
    // A result waits for the decision of an open gate on the task.
    if (status === 'done') await requireNoOpenGate(trx, taskId);
    if (task.workspace_id !== null) await dialect.lockKey(trx, pathsLockKey(task.workspace_id));
    const now = ctx.clock.now();
    // The task's current claim. A new dispatch of the task drops it, so with a dispatch active
    // the claim (if any) was made under that dispatch.
    const claim = await trx
      .selectFrom('path_lease_claims')
      .select(['token', 'workspace_id', 'holder'])
      .where('task_id', '=', taskId)
      .executeTakeFirst();
    if (typeof by !== 'string') {
      // The grant must be the task's current claim: a later claim (any holder name) or a later
      // dispatch of the task supersedes it.
      const current = claim && claim.workspace_id === by.resource ? Number(claim.token) : null;
      if (current === null || current !== by.token || claim?.holder !== by.holder)
        throw new PathLeaseLostError(
          by.resource,
          by.token,
          (current !== null && by.token < current) || (claim === undefined && active !== null)
            ? 'superseded'
            : 'never_granted',
        );
    } else if (active !== null && dispatchLease === undefined && claim?.holder !== holder) {
      // By holder name, with no lease: the holder must have claimed the task under its active dispatch.
      throw new PathClaimRefusedError(
        taskId,
        holder,
        'not_dispatch_holder',
        `its active dispatch ${active.id} (terminal ${active.terminal_handle}) has no claim by this holder; ` +
          'pass the dispatch lease (dispatchLease) or claim the task under that dispatch first',
      );
    }
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
    const released = await trx
      .deleteFrom('path_leases')
      .where('task_id', '=', taskId)
      .returning(['lease_key', 'holder', 'token'])
      .execute();
    if (released.length > 0 && task.workspace_id !== null) {
      await auditLeaseActs(ctx, trx, now, releasedGrants(task.workspace_id, released, status));
      await dialect.wakeups.notify(trx, pathsTopic(task.workspace_id));
    }
    await trx.updateTable('tasks').set({ status, updated_at: now }).where('id', '=', taskId).execute();
    // Its active dispatch ends with it, and its dependents move on (ready, or blocked on a failure).
    await afterTaskFinished(ctx, trx, taskId, status, now);
    return { status, released: released.map((r) => decodePathLeaseKey(r.lease_key)).sort() };
  });
}
