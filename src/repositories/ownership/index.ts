/**
 * `store.ownership` (SPEC §6): ownership generations, cleanup claims, the cleanup barrier and
 * subtask detachment. The guarantees are stated on `OwnershipRepository` (types.ts); the fenced
 * statements are in statements.ts, owner changes in transfer.ts, cleanup in cleanup.ts.
 */
import { InvalidArgumentError, NotFoundError } from '../../errors.js';
import type { StoreContext } from '../context.js';
import { createOnce, keyedCall, requireSameCreate, type IdempotencyOptions } from '../idempotent.js';
import { lockBarriers, refuseIfAdmitted } from '../shared/barrier.js';
import { activeGroupOf } from '../shared/groups.js';
import { auditLeaseActs } from '../shared/audit.js';
import {
  optionalId,
  optionalIdFilter,
  optionalInput,
  requireCounter,
  requireId,
  requireInput,
  requireLimit,
  requirePositiveMs,
  requireText,
} from '../validate.js';
import {
  ADMIT_REFUSALS,
  admitTaskCleanup,
  claimCleanup,
  cleanupAct,
  cleanupClaim,
  CLEANUP_REFUSALS,
  fenced,
  repeatRelease,
  settleSnapshot,
} from './cleanup.js';
import { CleanupInProgressError } from './errors.js';
import { loadEnvironment, loadGroup, loadSnapshot, requireTaskExists, snapshotsOf, toCleanupSnapshot } from './rows.js';
import { endResourceClaim, renewResourceClaim } from './statements.js';
import { detachSubtask, transfer, TRANSFER_REFUSALS } from './transfer.js';
import {
  DEFAULT_CLEANUP_CLAIM_TTL_MS,
  type CleanupClaim,
  type CleanupSnapshot,
  type OwnershipRepository,
} from './types.js';
import { extend } from '../../objects.js';

/** Upper bound of `listPendingCleanups`' `limit`. */
export const MAX_PENDING_CLEANUPS_LIMIT = 10_000;

function requireGeneration(field: string, value: unknown): number {
  return requireCounter(field, value, 'generation');
}

/** A claim as `claimCleanup` returned it: the fields the fence reads. */
function requireClaim(claim: CleanupClaim): void {
  requireInput('claim', claim);
  requireId('claim.snapshotId', claim.snapshotId);
  requireId('claim.claimant', claim.claimant);
  requireCounter('claim.attempt', claim.attempt, 'attempt (token) the claim returned');
  requireInput('claim.target', claim.target);
  requireId('claim.target.id', claim.target.id);
  requireGeneration('claim.target.generation', claim.target.generation);
}

/** The resource a settled claim's snapshot names, as the fence expects it. */
const fenceOf = (snapshot: CleanupSnapshot) => ({
  id: snapshot.resourceId,
  owner: snapshot.ownerTaskId,
  generation: snapshot.generation,
});

/** Builds `store.ownership` on a store's context; every guarantee is stated on `OwnershipRepository`. */
export function createOwnershipRepository(ctx: StoreContext): OwnershipRepository {
  const { dialect } = ctx;
  const { db } = dialect;

  /** Ends the claim (removing the resource with `remove`), then settles the snapshot; null if the fence refused. */
  const endClaim =
    (claim: CleanupClaim, remove: boolean, settle: Parameters<typeof settleSnapshot>[4]) =>
    async (trx: Parameters<typeof settleSnapshot>[0], snapshot: CleanupSnapshot, now: number) => {
      const p = extend(fenceOf(snapshot), { claimant: claim.claimant, now, remove });
      if (!(await endResourceClaim(trx, snapshot.resourceKind, p))) return null;
      const detail = { state: settle.state, ...(settle.last_error ? { error: settle.last_error } : {}) };
      await auditLeaseActs(ctx, trx, now, [cleanupAct('released', snapshot.id, claim.claimant, claim.attempt, detail)]);
      return settleSnapshot(trx, snapshot, claim.claimant, now, settle);
    };

  const repo: OwnershipRepository = {
    async createEnvironment(input) {
      requireInput('input', input);
      optionalId('id', input.id);
      requireId('ownerTaskId', input.ownerTaskId);
      requireText('rootPath', input.rootPath);
      optionalId('groupId', input.groupId);
      const ownerTaskId = requireText('ownerTaskId', input.ownerTaskId);
      const rootPath = requireText('rootPath', input.rootPath);
      const id = input.id ?? ctx.newId();
      return createOnce(dialect, [], () =>
        dialect.writeTransaction(async (trx) => {
          const now = ctx.clock.now();
          if (input.id !== undefined) {
            // A retry of this create (e.g. after COMMIT_OUTCOME_UNKNOWN) gets the stored environment.
            const existing = await loadEnvironment(trx, id);
            if (existing) {
              requireSameCreate('task environment', id, {
                ownerTaskId: [ownerTaskId, existing.ownerTaskId],
                rootPath: [rootPath, existing.rootPath],
                groupId: [input.groupId ?? null, existing.groupId],
              });
              return existing;
            }
          }
          await lockBarriers(ctx, trx, [ownerTaskId]);
          await requireTaskExists(trx, ownerTaskId);
          await refuseIfAdmitted(trx, 'create', ownerTaskId);
          if (input.groupId) {
            const group = await trx
              .selectFrom('workspace_groups')
              .select('status')
              .where('id', '=', input.groupId)
              .executeTakeFirst();
            if (!group || group.status !== 'active') throw new NotFoundError('active workspace group', input.groupId);
          }
          await trx
            .insertInto('task_environments')
            .values({
              id,
              task_id: ownerTaskId,
              group_id: input.groupId ?? null,
              root_path: rootPath,
              created_at: now,
              updated_at: now,
            })
            .execute();
          return (await loadEnvironment(trx, id))!;
        }),
      );
    },

    async createWorkspaceGroup(input) {
      requireInput('input', input);
      optionalId('id', input.id);
      requireId('stewardTaskId', input.stewardTaskId);
      const stewardTaskId = requireText('stewardTaskId', input.stewardTaskId);
      const id = input.id ?? ctx.newId();
      return createOnce(dialect, [], () =>
        dialect.writeTransaction(async (trx) => {
          const now = ctx.clock.now();
          if (input.id !== undefined) {
            const existing = await loadGroup(trx, id);
            if (existing) {
              requireSameCreate('workspace group', id, { stewardTaskId: [stewardTaskId, existing.stewardTaskId] });
              return existing;
            }
          }
          await lockBarriers(ctx, trx, [stewardTaskId]);
          await requireTaskExists(trx, stewardTaskId);
          await refuseIfAdmitted(trx, 'create', stewardTaskId);
          const existing = (await activeGroupOf(trx, stewardTaskId))?.id;
          if (existing)
            throw new InvalidArgumentError(
              'stewardTaskId',
              `task ${stewardTaskId} already belongs to workspace group ${existing}`,
            );
          await trx
            .insertInto('workspace_groups')
            .values({ id, steward_task_id: stewardTaskId, created_at: now, updated_at: now })
            .execute();
          await trx
            .insertInto('workspace_group_members')
            .values({ group_id: id, task_id: stewardTaskId, role: 'steward', joined_at: now })
            .execute();
          return (await loadGroup(trx, id))!;
        }),
      );
    },

    getEnvironment: async (id) => loadEnvironment(db, requireId('id', id)),
    getWorkspaceGroup: async (id) => loadGroup(db, requireId('id', id)),

    async transferEnvironmentOwnership(input) {
      requireInput('input', input);
      const id = requireId('environmentId', input.environmentId);
      const owner = requireId('expectedOwnerTaskId', input.expectedOwnerTaskId);
      const generation = requireGeneration('expectedGeneration', input.expectedGeneration);
      const newOwner = requireId('newOwnerTaskId', input.newOwnerTaskId);
      const call = keyedCall(
        'ownership.transferEnvironmentOwnership',
        input,
        { id, owner, generation, newOwner },
        TRANSFER_REFUSALS,
      );
      return transfer(ctx, 'environment', id, { owner, generation }, newOwner, call);
    },

    async transferGroupStewardship(input) {
      requireInput('input', input);
      const id = requireId('groupId', input.groupId);
      const owner = requireId('expectedStewardTaskId', input.expectedStewardTaskId);
      const generation = requireGeneration('expectedGeneration', input.expectedGeneration);
      const newOwner = requireId('newStewardTaskId', input.newStewardTaskId);
      const call = keyedCall(
        'ownership.transferGroupStewardship',
        input,
        { id, owner, generation, newOwner },
        TRANSFER_REFUSALS,
      );
      return transfer(ctx, 'group', id, { owner, generation }, newOwner, call);
    },

    async admitTaskCleanup(taskId, kind = 'archive', options?: IdempotencyOptions) {
      requireId('taskId', taskId);
      if (kind !== 'archive' && kind !== 'delete')
        throw new InvalidArgumentError('kind', "must be 'archive' or 'delete'");
      const opts = optionalInput('options', options);
      return admitTaskCleanup(
        ctx,
        taskId,
        kind,
        keyedCall('ownership.admitTaskCleanup', opts, { taskId, kind }, ADMIT_REFUSALS),
      );
    },

    listCleanupSnapshots: async (taskId) => snapshotsOf(db, requireId('taskId', taskId)),
    getCleanupSnapshot: async (id) => loadSnapshot(db, requireId('id', id)),

    async listPendingCleanups(input) {
      const options = optionalInput('options', input);
      const taskId = optionalIdFilter('taskId', options.taskId);
      const limit =
        options.limit === undefined ? undefined : requireLimit('limit', options.limit, MAX_PENDING_CLEANUPS_LIMIT);
      const now = ctx.clock.now();
      let query = db
        .selectFrom('cleanup_snapshots')
        .selectAll()
        .where((eb) =>
          eb.or([
            eb('state', 'in', ['pending', 'failed']),
            eb.and([eb('state', '=', 'claimed'), eb('claim_expires_at', '<=', now)]),
          ]),
        );
      if (taskId !== undefined) query = query.where('task_id', '=', taskId);
      if (limit !== undefined) query = query.limit(limit);
      const rows = await query.orderBy('created_at').orderBy('id').execute();
      return rows.map(toCleanupSnapshot);
    },

    async claimCleanup(snapshotId, claimant, options) {
      requireId('snapshotId', snapshotId);
      requireId('claimant', claimant);
      const opts = optionalInput('options', options);
      const ttlMs = requirePositiveMs('ttlMs', opts.ttlMs ?? DEFAULT_CLEANUP_CLAIM_TTL_MS);
      const call = keyedCall('ownership.claimCleanup', opts, { snapshotId, claimant, ttlMs }, CLEANUP_REFUSALS);
      return claimCleanup(ctx, snapshotId, claimant, ttlMs, call);
    },

    async tryClaimCleanup(snapshotId, claimant, options) {
      try {
        return { status: 'acquired', claim: await repo.claimCleanup(snapshotId, claimant, options) };
      } catch (error) {
        if (!(error instanceof CleanupInProgressError)) throw error;
        const { claimedBy, claimExpiresAt, resourceKind, resourceId } = error;
        return { status: 'busy', heldBy: { holder: claimedBy, expiresAt: claimExpiresAt, resourceKind, resourceId } };
      }
    },

    async renewCleanupClaim(claim, options) {
      requireClaim(claim);
      const opts = optionalInput('options', options);
      const ttlMs = requirePositiveMs('ttlMs', opts.ttlMs ?? DEFAULT_CLEANUP_CLAIM_TTL_MS);
      const call = keyedCall('ownership.renewCleanupClaim', opts, { claim, ttlMs }, CLEANUP_REFUSALS);
      return fenced(
        ctx,
        claim,
        { unexpired: true },
        async (trx, snapshot, now) => {
          const expiresAt = now + ttlMs;
          const p = extend(fenceOf(snapshot), { claimant: claim.claimant, expiresAt, now });
          if (!(await renewResourceClaim(trx, snapshot.resourceKind, p))) return null;
          await trx
            .updateTable('cleanup_snapshots')
            .set({ claim_expires_at: expiresAt, updated_at: now })
            .where('id', '=', snapshot.id)
            .execute();
          await auditLeaseActs(ctx, trx, now, [
            cleanupAct('renewed', snapshot.id, claim.claimant, claim.attempt, { expiresAt }),
          ]);
          return cleanupClaim(claim.snapshotId, claim.claimant, claim.attempt, expiresAt, claim.target);
        },
        call,
      );
    },

    async completeCleanup(claim, options?: IdempotencyOptions) {
      requireClaim(claim);
      const call = keyedCall(
        'ownership.completeCleanup',
        optionalInput('options', options),
        { claim },
        CLEANUP_REFUSALS,
      );
      return fenced(
        ctx,
        claim,
        { onCompleted: (snapshot) => (snapshot.claimedBy === claim.claimant ? { ok: true, value: snapshot } : null) },
        endClaim(claim, true, { state: 'completed', last_error: null, keepClaimant: true }),
        call,
      );
    },

    async failCleanup(claim, error, options?: IdempotencyOptions) {
      requireClaim(claim);
      const message = requireText('error', error);
      const opts = optionalInput('options', options);
      const call = keyedCall('ownership.failCleanup', opts, { claim, error: message }, CLEANUP_REFUSALS);
      return fenced(ctx, claim, {}, endClaim(claim, false, { state: 'failed', last_error: message }), call);
    },

    async releaseCleanupClaim(claim, options?: IdempotencyOptions) {
      requireClaim(claim);
      const opts = optionalInput('options', options);
      const call = keyedCall('ownership.releaseCleanupClaim', opts, { claim }, CLEANUP_REFUSALS);
      const rules = { onLost: repeatRelease(claim) };
      return fenced(ctx, claim, rules, endClaim(claim, false, { state: 'pending' }), call);
    },

    async detachSubtask(input) {
      requireInput('input', input);
      const taskId = requireId('taskId', input.taskId);
      const expectedParentId = requireId('expectedParentId', input.expectedParentId);
      return detachSubtask(ctx, taskId, expectedParentId);
    },
  };
  return repo;
}
