/**
 * Owner changes: the two transfers and subtask detachment. Each is a compare-and-swap on
 * (expected owner, expected generation) that bumps the generation, taken behind the cleanup
 * barrier of the task the resource moves to and under the resource's key (protocol.ts, levels
 * 3 and 5), so the diagnosis after a failed CAS is consistent.
 */
import type { Transaction } from 'kysely';
import { InvalidArgumentError, NotFoundError } from '../../errors.js';
import type { Database } from '../../schema/database.js';
import type { StoreContext } from '../context.js';
import { CleanupBarrierError, lockBarriers, refuseIfAdmitted } from '../shared/barrier.js';
import { keyedWrite, type IdempotentCall } from '../idempotent.js';
import { activeGroupOf } from '../shared/groups.js';
import { barrierLockKey, ownedResourceLockKey } from '../../protocol.js';
import {
  CleanupInProgressError,
  OwnershipChangedError,
  ParentChangedError,
  RESOURCE_LABEL,
  type OwnedResourceKind,
} from './errors.js';
import { requireTaskExists } from './rows.js';
import { activeClaim, CAS_TRANSFER, GUARDED_TRANSFER, readResource, type ResourceState } from './statements.js';
import type { DetachResult, OwnershipTransfer } from './types.js';
import { auditLeaseActs } from '../shared/audit.js';

type Trx = Transaction<Database>;

/**
 * Why a transfer CAS did not match; throws the matching typed error. Called under the resource
 * key: the miss is explained holding the keys (shared/misses.ts).
 */
async function explainTransferMiss(
  trx: Trx,
  kind: OwnedResourceKind,
  id: string,
  expected: { readonly owner: string; readonly generation: number },
  now: number,
): Promise<never> {
  const state = await readResource(trx, kind, id);
  if (!state || state.status !== 'active') throw new NotFoundError(`active ${RESOURCE_LABEL[kind]}`, id);
  const changed = () =>
    new OwnershipChangedError(kind, id, expected.owner, expected.generation, state.owner, state.generation);
  if (state.owner !== expected.owner || state.generation !== expected.generation) throw changed();
  const claim = activeClaim(state, now);
  if (claim) throw new CleanupInProgressError(kind, id, claim.claimant, claim.expiresAt);
  // Unreachable while every writer takes the resource key; fail closed rather than guess.
  throw changed();
}

/** The bare CAS (`CAS_TRANSFER`): the new generation, or the typed error explaining why it did not match. */
async function casTransferOrThrow(
  trx: Trx,
  kind: OwnedResourceKind,
  id: string,
  expected: { readonly owner: string; readonly generation: number },
  newOwner: string,
  now: number,
): Promise<number> {
  const p = { id, expectedOwner: expected.owner, expectedGeneration: expected.generation, newOwner, now };
  const row = await CAS_TRANSFER.first(trx, p, kind);
  return row ? Number(row.generation) : explainTransferMiss(trx, kind, id, expected, now);
}

/** Moves the steward role inside a group: demote the old steward first (one steward per group, by index). */
async function moveStewardRole(trx: Trx, groupId: string, from: string, to: string, now: number): Promise<void> {
  await trx
    .updateTable('workspace_group_members')
    .set({ role: 'member' })
    .where('group_id', '=', groupId)
    .where('task_id', '=', from)
    .execute();
  await trx
    .insertInto('workspace_group_members')
    .values({ group_id: groupId, task_id: to, role: 'steward', joined_at: now })
    .onConflict((oc) => oc.columns(['group_id', 'task_id']).doUpdateSet({ role: 'steward' }))
    .execute();
}

/** The typed refusals a keyed transfer stores. */
export const TRANSFER_REFUSALS = [NotFoundError, OwnershipChangedError, CleanupInProgressError, CleanupBarrierError];

/** `transferEnvironmentOwnership` / `transferGroupStewardship` (validated input). */
export async function transfer(
  ctx: StoreContext,
  kind: OwnedResourceKind,
  id: string,
  expected: { readonly owner: string; readonly generation: number },
  newOwner: string,
  call: IdempotentCall | null = null,
): Promise<OwnershipTransfer> {
  const { dialect } = ctx;
  // The new owner's barrier, then the resource's key: known up front, so BEGIN takes them.
  const keys = [barrierLockKey(newOwner), ownedResourceLockKey(kind, id)];
  return keyedWrite(
    ctx,
    call,
    async (trx) => {
      const now = ctx.clock.now();
      for (const key of keys) await dialect.lockKey(trx, key);
      const p = { id, expectedOwner: expected.owner, expectedGeneration: expected.generation, newOwner, now };
      const moved = await GUARDED_TRANSFER.first(trx, p, kind);
      const result = (generation: number, changed: boolean): OwnershipTransfer => ({
        resourceKind: kind,
        resourceId: id,
        ownerTaskId: newOwner,
        generation,
        changed,
      });
      if (moved) {
        if (kind === 'group') await moveStewardRole(trx, id, expected.owner, newOwner, now);
        // The trail: which transfer moved which resource, from whom, at which generation.
        await auditLeaseActs(ctx, trx, now, [
          {
            act: 'granted',
            kind: kind === 'group' ? 'group_ownership' : 'environment_ownership',
            resource: id,
            holder: newOwner,
            token: null,
            generation: Number(moved.generation),
            detail: { from: expected.owner, fromGeneration: expected.generation },
          },
        ]);
        return result(Number(moved.generation), true);
      }
      // Nothing moved: find out why, checking in the documented order (the keys above are held).
      const current = await readResource(trx, kind, id);
      if (!current || current.status !== 'active') throw new NotFoundError(`active ${RESOURCE_LABEL[kind]}`, id);
      if (
        current.owner === newOwner &&
        current.owner === expected.owner &&
        current.generation === expected.generation
      ) {
        return result(current.generation, false);
      }
      await requireTaskExists(trx, newOwner);
      await refuseIfAdmitted(trx, 'transfer', newOwner);
      if (kind === 'group') {
        // A task belongs to at most one active group (task creation joins "the" group of a parent).
        const other = (await activeGroupOf(trx, newOwner))?.id;
        if (other && other !== id)
          throw new InvalidArgumentError(
            'newStewardTaskId',
            `task ${newOwner} already belongs to workspace group ${other}`,
          );
      }
      return explainTransferMiss(trx, kind, id, expected, now);
    },
    keys,
  );
}

/** `detachSubtask` (validated input); its guarantee is stated on `OwnershipRepository`. */
export async function detachSubtask(
  ctx: StoreContext,
  taskId: string,
  expectedParentId: string,
): Promise<DetachResult> {
  const { dialect } = ctx;
  return dialect.writeTransaction<DetachResult>(async (trx) => {
    const now = ctx.clock.now();
    await lockBarriers(ctx, trx, [taskId, expectedParentId]);
    const task = await trx.selectFrom('tasks').select(['id', 'parent_id']).where('id', '=', taskId).executeTakeFirst();
    if (!task) throw new NotFoundError('task', taskId);
    if (task.parent_id === null) return { outcome: 'already_root', taskId };
    if (task.parent_id !== expectedParentId) throw new ParentChangedError(taskId, expectedParentId, task.parent_id);
    await refuseIfAdmitted(trx, 'detach', taskId, [taskId, expectedParentId]);

    let group: { id: string; formerStewardTaskId: string; generation: number } | null = null;
    const environments: { id: string; generation: number }[] = [];
    const membership = await activeGroupOf(trx, taskId);
    if (membership && membership.role === 'member') {
      // The steward may be the parent or a further ancestor; its barrier is taken too, so a
      // cleanup admitted for it either saw the group before or sees it moved.
      let steward: ResourceState;
      for (;;) {
        const seen = await readResource(trx, 'group', membership.id);
        await lockBarriers(ctx, trx, [seen!.owner]);
        await dialect.lockKey(trx, ownedResourceLockKey('group', membership.id));
        steward = (await readResource(trx, 'group', membership.id))!;
        if (steward.owner === seen!.owner) break;
      }
      await refuseIfAdmitted(trx, 'detach', taskId, [steward.owner]);
      const generation = await casTransferOrThrow(trx, 'group', membership.id, steward, taskId, now);
      await moveStewardRole(trx, membership.id, steward.owner, taskId, now);
      group = { id: membership.id, formerStewardTaskId: steward.owner, generation };

      const owned = await trx
        .selectFrom('task_environments')
        .select('id')
        .where('group_id', '=', membership.id)
        .where('task_id', '=', steward.owner)
        .where('status', '=', 'active')
        .orderBy('id')
        .execute();
      for (const { id } of owned) {
        await dialect.lockKey(trx, ownedResourceLockKey('environment', id));
        const env = (await readResource(trx, 'environment', id))!;
        const expected = { owner: steward.owner, generation: env.generation };
        environments.push({ id, generation: await casTransferOrThrow(trx, 'environment', id, expected, taskId, now) });
      }
    }
    await trx.updateTable('tasks').set({ parent_id: null, updated_at: now }).where('id', '=', taskId).execute();
    return { outcome: 'detached', taskId, formerParentId: expectedParentId, group, environments };
  });
}
