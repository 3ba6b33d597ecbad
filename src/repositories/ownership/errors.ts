/** The errors of `store.ownership` (SPEC §6); `CleanupBarrierError` lives with the barrier in `shared/`. */
import { TaskfenceError } from '../../errors.js';
import { LeaseLostError, type LeaseLostReason } from '../shared/lease.js';
import type { CleanupResourceKind } from '../../schema/database.js';

export type OwnedResourceKind = CleanupResourceKind;

/** How messages name each kind of owned resource. */
export const RESOURCE_LABEL: Record<OwnedResourceKind, string> = {
  environment: 'environment',
  group: 'workspace group',
};

/** A transfer's expected owner or generation is not the resource's current one; nothing changed. */
export class OwnershipChangedError extends TaskfenceError {
  readonly code = 'OWNERSHIP_CHANGED';
  constructor(
    readonly resourceKind: OwnedResourceKind,
    readonly resourceId: string,
    readonly expectedOwnerTaskId: string,
    readonly expectedGeneration: number,
    readonly currentOwnerTaskId: string,
    readonly currentGeneration: number,
  ) {
    super(
      `The ${RESOURCE_LABEL[resourceKind]} ${resourceId} is owned by task ${currentOwnerTaskId} at generation ${currentGeneration}, ` +
        `not by task ${expectedOwnerTaskId} at generation ${expectedGeneration} as the caller expected; nothing was changed. ` +
        'Re-read the resource and decide again with its current owner and generation.',
    );
  }
}

/** The resource has an active cleanup claim, so it cannot change owner (or be claimed by someone else) now. */
export class CleanupInProgressError extends TaskfenceError {
  readonly code = 'CLEANUP_IN_PROGRESS';
  constructor(
    readonly resourceKind: OwnedResourceKind,
    readonly resourceId: string,
    readonly claimedBy: string,
    readonly claimExpiresAt: number,
  ) {
    super(
      `The ${RESOURCE_LABEL[resourceKind]} ${resourceId} is being cleaned up by ${claimedBy} (claim valid until ` +
        `${new Date(claimExpiresAt).toISOString()}); nothing was changed. Wait for that cleanup to complete, fail or expire.`,
    );
  }
}

/**
 * A cleanup snapshot no longer describes its resource: the owner or generation has moved (or the
 * resource is gone) since the inventory was taken. The snapshot is now `stale` and the resource
 * was not touched; the caller must not tear it down.
 */
export class StaleOwnershipError extends TaskfenceError {
  readonly code = 'STALE_OWNERSHIP';
  constructor(
    readonly snapshotId: string,
    readonly resourceKind: OwnedResourceKind,
    readonly resourceId: string,
    readonly snapshotOwnerTaskId: string,
    readonly snapshotGeneration: number,
    readonly currentOwnerTaskId: string | null,
    readonly currentGeneration: number | null,
  ) {
    super(
      `Cleanup snapshot ${snapshotId} recorded the ${RESOURCE_LABEL[resourceKind]} ${resourceId} as owned by task ` +
        `${snapshotOwnerTaskId} at generation ${snapshotGeneration}, but it is now ` +
        (currentOwnerTaskId === null
          ? 'gone'
          : `owned by task ${currentOwnerTaskId} at generation ${currentGeneration}`) +
        '. The snapshot was marked stale and the resource left untouched: do not tear it down; its current owner decides its lifecycle.',
    );
  }
}

/**
 * The caller's cleanup claim is no longer the active one: `complete`, `fail`, `release`, `renew`
 * and `tx.assertLease` refuse it. `reason` says why: `superseded` (the snapshot was claimed again
 * after this claim, by anyone), `released` (it was released, failed or completed), `expired` (it
 * lapsed; `tx.assertLease` only) or `never_granted`. The caller must stop the teardown.
 */
export class CleanupClaimLostError extends LeaseLostError {
  readonly code = 'CLEANUP_CLAIM_LOST';
  readonly kind = 'cleanup_claim';
  constructor(
    readonly snapshotId: string,
    readonly claimant: string,
    readonly currentClaimant: string | null,
    readonly reason: LeaseLostReason = 'superseded',
    /** The claim's token (its `attempt`), when known. */
    readonly token: number | null = null,
  ) {
    super(
      `${claimant} no longer holds the cleanup claim of snapshot ${snapshotId} (${reason}` +
        (token === null ? '' : `, token ${token}`) +
        (currentClaimant ? `; ${currentClaimant} holds it now` : '') +
        '). Stop the teardown; claim the snapshot again if it is still pending.',
    );
  }
}

/** The snapshot's cleanup already completed; there is nothing left to claim. */
export class CleanupAlreadyCompletedError extends TaskfenceError {
  readonly code = 'CLEANUP_ALREADY_COMPLETED';
  constructor(
    readonly snapshotId: string,
    readonly completedBy: string | null,
  ) {
    super(
      `Cleanup snapshot ${snapshotId} was already completed${completedBy ? ` by ${completedBy}` : ''}; nothing to do.`,
    );
  }
}

/** `detachSubtask` was called with a parent that is not the task's current parent; nothing changed. */
export class ParentChangedError extends TaskfenceError {
  readonly code = 'PARENT_CHANGED';
  constructor(
    readonly taskId: string,
    readonly expectedParentId: string,
    readonly currentParentId: string,
  ) {
    super(
      `Task ${taskId} is a subtask of ${currentParentId}, not of ${expectedParentId} as expected; nothing was detached. ` +
        'Re-read the task and decide again.',
    );
  }
}

/**
 * The `StaleOwnershipError` for `snapshot` against the resource's current `state` (null when
 * the resource is gone): claim and the fence of complete / fail / release / renew throw it.
 */
export function staleOwnershipError(
  snapshot: {
    readonly id: string;
    readonly resourceKind: OwnedResourceKind;
    readonly resourceId: string;
    readonly ownerTaskId: string;
    readonly generation: number;
  },
  state: { readonly owner: string; readonly generation: number } | null,
): StaleOwnershipError {
  return new StaleOwnershipError(
    snapshot.id,
    snapshot.resourceKind,
    snapshot.resourceId,
    snapshot.ownerTaskId,
    snapshot.generation,
    state?.owner ?? null,
    state?.generation ?? null,
  );
}
