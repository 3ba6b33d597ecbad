/**
 * A task's path claim (`claimTask`) and its result (`submitTaskResult`): the leases a task takes
 * for its declared writes, and their release when it finishes.
 */
import { leaseKeys, WHOLE_WORKSPACE_KEY, decodePathLeaseKey } from '../../domain/write-paths.js';
import { sql, type CompiledQuery, type Transaction } from 'kysely';
import { NotFoundError } from '../../errors.js';
import { runBound } from '../../query/prepared.js';
import type { Database } from '../../schema/database.js';
import type { TaskStatus } from '../../schema/database.js';
import { auditLeaseActs, type LeaseActRecord } from '../shared/audit.js';
import type { StoreContext } from '../context.js';
import { keyedWrite, type IdempotentCall } from '../idempotent.js';
import type { Lease } from '../shared/lease.js';
import {
  activeDispatchRead,
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

/**
 * `claimTask`'s reads and locks, bound, for BEGIN to send after the task's dispatch key
 * (PostgreSQL; null where `lockKey` is a no-op): the task's row (locked), its active dispatch, and
 * then, for a claimable task with a workspace, the workspace's paths key and its token row, in
 * the lock order `acquireKeys` takes them. A refused claim takes no paths lock.
 */
function claimReads(ctx: StoreContext, taskId: string) {
  const { db } = ctx.dialect;
  const taking = ctx.dialect.lockKeyExpression(sql<string>`${pathsLockKey('')} || ${sql.ref('workspace_id')}`);
  if (taking === null) return null;
  const claimable = db
    .selectFrom('tasks')
    .where('id', '=', taskId)
    .where('workspace_id', 'is not', null)
    .where('status', 'in', CLAIMABLE);
  return {
    task: db
      .selectFrom('tasks')
      .select(['workspace_id', 'writes', 'status'])
      .where('id', '=', taskId)
      .forUpdate()
      .compile(),
    active: activeDispatchRead(db, taskId).compile(),
    key: claimable.select(taking.as('locked')).compile(),
    tokenRow: db
      .selectFrom('path_lease_tokens')
      .select('token')
      .where('workspace_id', '=', claimable.select('workspace_id'))
      .forUpdate()
      .compile(),
  };
}

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
  // PostgreSQL: BEGIN takes the keys and makes the reads, one statement grants, and the claim's
  // writes go with COMMIT (3 round trips).
  const reads = claimReads(ctx, taskId);
  const effect = async (trx: Transaction<Database>): Promise<PathClaimResult> => {
    const result = <R>(stmt: CompiledQuery<R>) => dialect.beginResult(stmt) ?? runBound(trx, stmt);
    // The task's dispatch key, then its row (locked on PostgreSQL) before the claim's row: a
    // dispatch of the task moves the task row first and then drops the claim, in the same order.
    await dialect.lockKey(trx, dispatchTaskLockKey(taskId));
    const read = trx.selectFrom('tasks').select(['workspace_id', 'writes', 'status']).where('id', '=', taskId);
    const task = reads ? (await result(reads.task)).rows[0] : await read.executeTakeFirst();
    const active = reads ? ((await result(reads.active)).rows[0] ?? null) : undefined;
    if (!task) throw new NotFoundError('task', taskId);
    if (FINISHED.includes(task.status)) {
      throw new PathClaimRefusedError(taskId, holder, 'task_finished', `it is already ${task.status}`);
    }
    if (!CLAIMABLE.includes(task.status))
      throw new TaskTransitionRefusedError(taskId, task.status, 'in_progress', task.status, 'not_in_table');
    await requireTaskDispatchLease(trx, taskId, dispatchLease, active);
    if (task.workspace_id === null) {
      throw new PathClaimRefusedError(taskId, holder, 'task_has_no_workspace', 'it has no workspace to lease paths in');
    }
    const writes = task.writes === null ? null : (JSON.parse(task.writes) as string[]);
    const mode: TaskWriteMode = writes === null ? 'whole-workspace' : writes.length === 0 ? 'dynamic' : 'paths';
    const keys = writes === null ? [WHOLE_WORKSPACE_KEY] : leaseKeys(writes);
    if (reads) await result(reads.key);
    const held = reads ? { tokenRow: reads.tokenRow, keyTaken: true } : undefined;
    const acquired = await acquireKeys(ctx, trx, task.workspace_id, holder, keys, ttlMs, taskId, held);
    if (acquired.status === 'busy')
      return { status: 'busy', mode, heldBy: acquired.heldBy, claimed: false, conflicts: acquired.conflicts };
    const now = ctx.clock.now();
    // The task's current claim: a later claim supersedes this grant, whatever its holder name.
    // These are the call's last writes: they go with COMMIT.
    const { token, workspaceId } = acquired.lease;
    const claimRow = { task_id: taskId, workspace_id: workspaceId, holder, token, claimed_at: now };
    await dialect.commitWith(
      trx,
      trx
        .insertInto('path_lease_claims')
        .values(claimRow)
        .onConflict((oc) =>
          oc.column('task_id').doUpdateSet({ workspace_id: workspaceId, holder, token, claimed_at: now }),
        )
        .compile(),
    );
    await dialect.commitWith(
      trx,
      trx.updateTable('tasks').set({ status: 'in_progress', updated_at: now }).where('id', '=', taskId).compile(),
    );
    return { status: 'acquired', mode, lease: acquired.lease, claimed: true, leases: acquired.leases };
  };
  const first = reads ? [reads.task, reads.active, reads.key, reads.tokenRow] : undefined;
  return keyedWrite(ctx, call, effect, [dispatchTaskLockKey(taskId)], first);
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
