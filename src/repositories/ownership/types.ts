/**
 * The public types of `store.ownership` (SPEC §6), with the guarantee each method gives.
 *
 * Every task environment and shared workspace group has an owner task (`task_id` /
 * `steward_task_id`) and an `ownership_generation`. The tuple (resource id, owner, generation) is
 * the authority for transfer and destructive cleanup:
 *
 * - every owner change is a compare-and-swap on (expected owner, expected generation) that bumps
 *   the generation; it is refused while a cleanup claim is active;
 * - cleanup claims the generation recorded in a durable snapshot for the whole external teardown;
 *   completing, failing or releasing the claim is fenced on the same tuple, and a snapshot whose
 *   resource has moved is marked `stale` instead of touching the resource;
 * - the task cleanup barrier (`task_cleanup_admissions`, see `shared/barrier.ts`) serializes
 *   cleanup admission with detachment and with ownership arriving at a task.
 *
 * The keys each operation locks, and in which order, are in `src/protocol.ts`.
 */
import type { CleanupKind, CleanupSnapshotState, GroupMemberRole } from '../../schema/database.js';
import type { OwnedResourceKind } from './errors.js';
import type { IdempotencyOptions } from '../idempotent.js';
import type { Lease } from '../shared/lease.js';
import { claim, committed, grant, release, renewal, type OutcomeDeclarations } from '../shared/outcomes.js';

/** How long a cleanup claim lives unless renewed (10 min): `claimCleanup` and `renewCleanupClaim`'s default `ttlMs`. */
export const DEFAULT_CLEANUP_CLAIM_TTL_MS = 10 * 60_000;

/** An active cleanup claim on a resource. */
export interface ResourceCleanupClaim {
  readonly claimant: string;
  readonly generation: number;
  readonly expiresAt: number;
}

export interface TaskEnvironment {
  readonly id: string;
  readonly ownerTaskId: string;
  readonly groupId: string | null;
  readonly rootPath: string;
  readonly status: 'active' | 'removed';
  readonly generation: number;
  /** The claim columns as stored (an expired claim is still shown; it no longer blocks anything). */
  readonly cleanupClaim: ResourceCleanupClaim | null;
}

export interface WorkspaceGroupMember {
  readonly taskId: string;
  readonly role: GroupMemberRole;
}

export interface WorkspaceGroup {
  readonly id: string;
  readonly stewardTaskId: string;
  readonly status: 'active' | 'removed';
  readonly generation: number;
  readonly cleanupClaim: ResourceCleanupClaim | null;
  /** Sorted by task id. */
  readonly members: readonly WorkspaceGroupMember[];
}

/** The result of a successful transfer: the resource's owner and generation now. */
export interface OwnershipTransfer {
  readonly resourceKind: OwnedResourceKind;
  readonly resourceId: string;
  readonly ownerTaskId: string;
  readonly generation: number;
  /** False when the resource already belonged to the new owner (no bump). */
  readonly changed: boolean;
}

export interface TransferEnvironmentInput extends IdempotencyOptions {
  readonly environmentId: string;
  readonly expectedOwnerTaskId: string;
  readonly expectedGeneration: number;
  readonly newOwnerTaskId: string;
}

export interface TransferStewardshipInput extends IdempotencyOptions {
  readonly groupId: string;
  readonly expectedStewardTaskId: string;
  readonly expectedGeneration: number;
  readonly newStewardTaskId: string;
}

/** One inventoried resource of an admitted cleanup: what (resource, owner, generation) may be torn down. */
export interface CleanupSnapshot {
  readonly id: string;
  /** The task whose cleanup was admitted. */
  readonly taskId: string;
  readonly resourceKind: OwnedResourceKind;
  readonly resourceId: string;
  readonly ownerTaskId: string;
  readonly generation: number;
  readonly state: CleanupSnapshotState;
  readonly attempts: number;
  /** The current claimant while `claimed`; the last one after `completed`. */
  readonly claimedBy: string | null;
  readonly claimExpiresAt: number | null;
  readonly lastError: string | null;
  readonly createdAt: number;
  readonly updatedAt: number;
}

export interface CleanupAdmission {
  readonly taskId: string;
  readonly kind: CleanupKind;
  readonly admittedAt: number;
  /** True when this call found an earlier admission and returned its snapshots. */
  readonly alreadyAdmitted: boolean;
  /** The inventory, environments first, then groups, each by id. */
  readonly snapshots: readonly CleanupSnapshot[];
}

/** What a claim lets a worker tear down. */
export type CleanupTarget =
  | {
      readonly kind: 'environment';
      readonly id: string;
      readonly ownerTaskId: string;
      readonly generation: number;
      readonly rootPath: string;
    }
  | { readonly kind: 'group'; readonly id: string; readonly ownerTaskId: string; readonly generation: number };

/** Who holds a contended cleanup claim. */
export interface CleanupClaimHolder {
  readonly holder: string;
  readonly expiresAt: number;
  readonly resourceKind: OwnedResourceKind;
  readonly resourceId: string;
}

/** `tryClaimCleanup`'s result: the claim, or the live claimant it lost to. */
export type CleanupClaimResult =
  | { readonly status: 'acquired'; readonly claim: CleanupClaim }
  | { readonly status: 'busy'; readonly heldBy: CleanupClaimHolder };

/**
 * A held cleanup claim: pass it back to complete, fail, release or renew, and its `lease` to
 * `tx.assertLease`. `attempt` is the claim's fencing token: it rises on every grant of the
 * snapshot to a claimant that did not hold it live, and is never reused.
 */
export interface CleanupClaim {
  readonly snapshotId: string;
  readonly claimant: string;
  readonly expiresAt: number;
  /** 1 for the first claim of the snapshot, 2 for the first retry, … */
  readonly attempt: number;
  readonly target: CleanupTarget;
  /** The claim as a lease: `resource` = the snapshot id, `holder` = the claimant, `token` = `attempt`. */
  readonly lease: Lease<'cleanup_claim'>;
}

export type DetachResult =
  | { readonly outcome: 'already_root'; readonly taskId: string }
  | {
      readonly outcome: 'detached';
      readonly taskId: string;
      readonly formerParentId: string;
      /** The shared group whose stewardship moved to the task, with its new generation; null for a non-shared task. */
      readonly group: { readonly id: string; readonly formerStewardTaskId: string; readonly generation: number } | null;
      /** The group's environments that moved to the task, with their new generations. */
      readonly environments: readonly { readonly id: string; readonly generation: number }[];
    };

/** Ownership generations, cleanup claims, the cleanup barrier and subtask detachment (SPEC §6). */
export interface OwnershipRepository {
  /**
   * Creates an environment owned by `ownerTaskId` at generation 1, optionally inside a shared
   * group. Refused with `CleanupBarrierError` if cleanup was admitted for the owner: a task under
   * cleanup never gains resources its fixed inventory would miss.
   *
   * @example
   * const env = await store.ownership.createEnvironment({ ownerTaskId: task.id, rootPath: '/work/t1' });
   */
  createEnvironment(input: {
    id?: string;
    ownerTaskId: string;
    rootPath: string;
    groupId?: string | null;
  }): Promise<TaskEnvironment>;

  /**
   * Creates a shared workspace group stewarded by `stewardTaskId` at generation 1 together with
   * the steward's `steward` membership, in one transaction. Refused with `CleanupBarrierError` if
   * cleanup was admitted for the steward, and with `InvalidArgumentError` if it already belongs to
   * an active group.
   */
  createWorkspaceGroup(input: { id?: string; stewardTaskId: string }): Promise<WorkspaceGroup>;

  /** The environment as committed (owner, generation, claim columns), or null. A plain read: decide with a transfer's CAS, not on this. */
  getEnvironment(id: string): Promise<TaskEnvironment | null>;
  /** The group with its members as committed, or null. A plain read, like `getEnvironment`. */
  getWorkspaceGroup(id: string): Promise<WorkspaceGroup | null>;

  /**
   * Moves an environment to `newOwnerTaskId` if it is still owned by `expectedOwnerTaskId` at
   * `expectedGeneration`: one compare-and-swap that increments the generation. Of concurrent
   * transfers with the same expectation exactly one succeeds; the others get
   * `OwnershipChangedError` with the current owner and generation. An active cleanup claim
   * refuses it (`CleanupInProgressError`), so does admitted cleanup of the new owner
   * (`CleanupBarrierError`). Transferring to the current owner is a no-op without a bump.
   *
   * @example
   * const { generation } = await store.ownership.transferEnvironmentOwnership({
   *   environmentId: env.id, expectedOwnerTaskId: env.ownerTaskId, expectedGeneration: env.generation, newOwnerTaskId: child.id });
   */
  transferEnvironmentOwnership(input: TransferEnvironmentInput): Promise<OwnershipTransfer>;

  /**
   * Moves a workspace group's stewardship with the same compare-and-swap, errors and no-op rule
   * as `transferEnvironmentOwnership`; in the same transaction the former steward becomes a
   * `member` and the new steward the group's `steward` member (joining it if needed). The group's
   * environments keep their owners: transfer them separately, or use `detachSubtask`.
   */
  transferGroupStewardship(input: TransferStewardshipInput): Promise<OwnershipTransfer>;

  /**
   * The cleanup barrier for archive/delete: records the admission and, in the same transaction,
   * persists the task's inventory (active environments it owns, active groups it stewards) as
   * snapshots of (resource, owner, generation). Detachment and transfers to the task serialize
   * with it. Idempotent: admitting again returns the first admission's snapshots (and its kind;
   * `kind` defaults to `archive`).
   *
   * @example
   * const { snapshots } = await store.ownership.admitTaskCleanup(task.id, 'delete');
   * for (const s of snapshots) {
   *   const claim = await store.ownership.claimCleanup(s.id, workerHandle);
   *   await removeFromDisk(claim.target);            // external teardown, under the claim
   *   await store.ownership.completeCleanup(claim);  // fenced on (resource, owner, generation)
   * }
   */
  admitTaskCleanup(taskId: string, kind?: CleanupKind, options?: IdempotencyOptions): Promise<CleanupAdmission>;

  /** The snapshots of a task's admitted cleanup, in inventory order (empty if none was admitted); they persist across restarts. */
  listCleanupSnapshots(taskId: string): Promise<CleanupSnapshot[]>;
  /** One snapshot as committed, or null. */
  getCleanupSnapshot(id: string): Promise<CleanupSnapshot | null>;

  /**
   * Snapshots waiting for a cleanup worker, oldest first: `pending`, `failed` (retry), and
   * `claimed` ones whose claim has expired (a worker died). Survives restarts: this is how a new
   * process picks up teardown where a killed one stopped.
   */
  listPendingCleanups(options?: { limit?: number; taskId?: string }): Promise<CleanupSnapshot[]>;

  /**
   * Claims the snapshot's resource at the snapshot's generation for `ttlMs` (default 10 min), for
   * the whole external teardown: while the claim is active transfers are refused. Of concurrent
   * claimants one wins, the others get `CleanupInProgressError`. If the owner or generation moved
   * since the snapshot, the snapshot is marked `stale` and `StaleOwnershipError` is thrown; the
   * resource is untouched. A completed snapshot throws `CleanupAlreadyCompletedError`.
   */
  claimCleanup(
    snapshotId: string,
    claimant: string,
    options?: { ttlMs?: number } & IdempotencyOptions,
  ): Promise<CleanupClaim>;

  /**
   * `claimCleanup` with losing the race returned, not thrown (issue 21): `{ status: 'acquired',
   * claim }`, or `{ status: 'busy', heldBy }` naming the live claimant, where `claimCleanup` throws
   * `CleanupInProgressError`. Every other refusal (stale, completed, not found) still throws.
   *
   * @example
   * const r = await store.ownership.tryClaimCleanup(s.id, workerHandle);
   * if (r.status === 'busy') return; // r.heldBy.holder is cleaning it up until r.heldBy.expiresAt
   */
  tryClaimCleanup(
    snapshotId: string,
    claimant: string,
    options?: { ttlMs?: number } & IdempotencyOptions,
  ): Promise<CleanupClaimResult>;

  /**
   * Extends a held claim to `now + ttlMs` (default 10 min) and returns it with its renewed
   * `lease`. Fenced like `completeCleanup`, and never revives a lapsed claim
   * (`CleanupClaimLostError`, `expired`).
   */
  renewCleanupClaim(claim: CleanupClaim, options?: { ttlMs?: number } & IdempotencyOptions): Promise<CleanupClaim>;

  /**
   * Records that the teardown finished: the resource becomes `removed` and the snapshot
   * `completed`, in one transaction, only if the resource still has the snapshot's owner and
   * generation and the caller's claim. Otherwise: `StaleOwnershipError` (snapshot marked stale,
   * resource untouched) or `CleanupClaimLostError`. Repeating a successful completion is a no-op.
   */
  completeCleanup(claim: CleanupClaim, options?: IdempotencyOptions): Promise<CleanupSnapshot>;

  /**
   * Records a failed teardown for a later retry: drops the claim, marks the snapshot `failed`
   * with `error`. Fenced like `completeCleanup`.
   */
  failCleanup(claim: CleanupClaim, error: string, options?: IdempotencyOptions): Promise<CleanupSnapshot>;

  /**
   * Gives the claim back without an attempt result: the snapshot is `pending` again. Fenced like
   * `completeCleanup`, with the release rule of every lease (README, Leases): a repeat release is
   * a no-op returning the snapshot while nobody claimed it after this claim, or while this
   * claim's own `expiresAt` has not passed; once it lapsed and someone claimed after it,
   * `CleanupClaimLostError` (`superseded`).
   */
  releaseCleanupClaim(claim: CleanupClaim, options?: IdempotencyOptions): Promise<CleanupSnapshot>;

  /**
   * Detaches a subtask from its parent in one transaction: clears the parent link and, for a task
   * in a shared workspace group, makes it the group's steward (the former steward becomes a
   * member) and the owner of the group's environments the former steward owned, bumping each
   * generation. Behind the cleanup barrier: if cleanup was admitted first for the task, its parent
   * or the former steward, it is refused with `CleanupBarrierError`; if it commits first, a later
   * admission's inventory no longer contains what moved. A root task is a no-op. Also refused by
   * an active cleanup claim (`CleanupInProgressError`) and a different parent (`ParentChangedError`).
   */
  detachSubtask(input: { taskId: string; expectedParentId: string }): Promise<DetachResult>;
}

/** Each call's declared outcome (see shared/outcomes.ts): a cleanup claim is a lease, settled by complete, fail or release. */
export const OWNERSHIP_OUTCOMES: OutcomeDeclarations<OwnershipRepository> = {
  createEnvironment: committed,
  createWorkspaceGroup: committed,
  getEnvironment: committed,
  getWorkspaceGroup: committed,
  transferEnvironmentOwnership: committed,
  transferGroupStewardship: committed,
  admitTaskCleanup: committed,
  listCleanupSnapshots: committed,
  getCleanupSnapshot: committed,
  listPendingCleanups: committed,
  claimCleanup: grant,
  tryClaimCleanup: claim,
  renewCleanupClaim: renewal,
  completeCleanup: release,
  failCleanup: release,
  releaseCleanupClaim: release,
  detachSubtask: committed,
};
