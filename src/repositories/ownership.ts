import { sql, type Kysely, type RawBuilder, type Transaction } from 'kysely';
import { InvalidArgumentError, NotFoundError, TaskfenceError } from '../errors.js';
import type {
  CleanupKind,
  CleanupResourceKind,
  CleanupSnapshotRow,
  CleanupSnapshotState,
  Database,
  GroupMemberRole,
} from '../schema/database.js';
import type { StoreContext } from './context.js';
import { createOnce, requireSameCreate } from './idempotent.js';
import { elements, prepared } from '../query/prepared.js';
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
} from './validate.js';
import { tableIn } from '../dialects/schema.js';

/*
 * Ownership generations (SPEC §6, seed 004).
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
 * - the task cleanup barrier (`task_cleanup_admissions`) serializes cleanup admission with
 *   detachment and with ownership arriving at a task.
 *
 * Locking, identical in intent on both dialects (SQLite's BEGIN IMMEDIATE already serializes every
 * writer; on PostgreSQL READ COMMITTED `lockKey` takes transaction-scoped advisory locks):
 *   barrier:<task>  taken by admission, detachment, and anything that gives a task a resource;
 *   snapshot:<id>   taken by claim / complete / fail / release / renew;
 *   <kind>:<id>     taken by every writer of an environment or group row, after the keys above.
 * The CAS statements stay correct on their own (they re-check owner and generation on the row's
 * latest version); the key locks make the diagnosis after a failed CAS consistent.
 */

// ---------------------------------------------------------------------------------------------
// Errors

export type OwnedResourceKind = CleanupResourceKind;

const RESOURCE_LABEL: Record<OwnedResourceKind, string> = { environment: 'environment', group: 'workspace group' };

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

/** Cleanup (archive/delete) was already admitted for a task the operation involves, so it is refused. */
export class CleanupBarrierError extends TaskfenceError {
  readonly code = 'CLEANUP_BARRIER';
  constructor(
    readonly operation: 'detach' | 'transfer' | 'create',
    readonly taskId: string,
    readonly admittedTaskId: string,
    readonly admittedKind: CleanupKind,
  ) {
    super(
      `Cannot ${operation === 'detach' ? 'detach' : operation === 'transfer' ? 'transfer ownership for' : 'create a resource for'} ` +
        `task ${taskId}: ${admittedKind} cleanup was already admitted for task ${admittedTaskId}, and its inventory is fixed. ` +
        'Let that cleanup finish, or do this before admitting it.',
    );
  }
}

/** The caller's cleanup claim is no longer the active one (it was released, or expired and taken by another claimant). */
export class CleanupClaimLostError extends TaskfenceError {
  readonly code = 'CLEANUP_CLAIM_LOST';
  constructor(
    readonly snapshotId: string,
    readonly claimant: string,
    readonly currentClaimant: string | null,
  ) {
    super(
      `${claimant} no longer holds the cleanup claim of snapshot ${snapshotId}` +
        (currentClaimant ? ` (${currentClaimant} holds it now)` : '') +
        '. Stop the teardown; claim the snapshot again if it is still pending.',
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

// ---------------------------------------------------------------------------------------------
// Public types

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

export interface TransferEnvironmentInput {
  readonly environmentId: string;
  readonly expectedOwnerTaskId: string;
  readonly expectedGeneration: number;
  readonly newOwnerTaskId: string;
}

export interface TransferStewardshipInput {
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

/** A held cleanup claim: pass it back to complete, fail, release or renew. */
export interface CleanupClaim {
  readonly snapshotId: string;
  readonly claimant: string;
  readonly expiresAt: number;
  /** 1 for the first claim of the snapshot, 2 for the first retry, … */
  readonly attempt: number;
  readonly target: CleanupTarget;
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
  admitTaskCleanup(taskId: string, kind?: CleanupKind): Promise<CleanupAdmission>;

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
  claimCleanup(snapshotId: string, claimant: string, options?: { ttlMs?: number }): Promise<CleanupClaim>;

  /**
   * Extends a held claim to `now + ttlMs` (default 10 min). Fenced like `completeCleanup`.
   */
  renewCleanupClaim(claim: CleanupClaim, options?: { ttlMs?: number }): Promise<CleanupClaim>;

  /**
   * Records that the teardown finished: the resource becomes `removed` and the snapshot
   * `completed`, in one transaction, only if the resource still has the snapshot's owner and
   * generation and the caller's claim. Otherwise: `StaleOwnershipError` (snapshot marked stale,
   * resource untouched) or `CleanupClaimLostError`. Repeating a successful completion is a no-op.
   */
  completeCleanup(claim: CleanupClaim): Promise<CleanupSnapshot>;

  /**
   * Records a failed teardown for a later retry: drops the claim, marks the snapshot `failed`
   * with `error`. Fenced like `completeCleanup`.
   */
  failCleanup(claim: CleanupClaim, error: string): Promise<CleanupSnapshot>;

  /** Gives the claim back without an attempt result: the snapshot is `pending` again. Fenced like `completeCleanup`. */
  releaseCleanupClaim(claim: CleanupClaim): Promise<CleanupSnapshot>;

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

// ---------------------------------------------------------------------------------------------
// Implementation

const DEFAULT_CLAIM_TTL_MS = 10 * 60_000;
/** Upper bound of `listPendingCleanups`' `limit`. */
export const MAX_PENDING_CLEANUPS_LIMIT = 10_000;

const RESOURCE_TABLE = {
  environment: { table: 'task_environments', owner: 'task_id' },
  group: { table: 'workspace_groups', owner: 'steward_task_id' },
} as const satisfies Record<OwnedResourceKind, { table: keyof Database; owner: string }>;

type Trx = Transaction<Database>;

interface ResourceState {
  readonly id: string;
  readonly owner: string;
  readonly generation: number;
  readonly status: 'active' | 'removed';
  readonly claimedBy: string | null;
  readonly claimGeneration: number | null;
  readonly claimExpiresAt: number | null;
  readonly rootPath: string | null;
}

interface RawResource {
  id: string;
  owner: string;
  generation: number;
  status: 'active' | 'removed';
  claimed_by: string | null;
  claim_generation: number | null;
  claim_expires_at: number | null;
  root_path: string | null;
}

/** @internal The lock key of a task's cleanup barrier: admission, detachment, transfers and child creation take it. */
export const barrierKey = (taskId: string) => `ownership:barrier:${taskId}`;
const resourceKey = (kind: OwnedResourceKind, id: string) => `ownership:${kind}:${id}`;
const snapshotKey = (id: string) => `ownership:snapshot:${id}`;

function toResourceState(row: RawResource): ResourceState {
  return {
    id: row.id,
    owner: row.owner,
    generation: Number(row.generation),
    status: row.status,
    claimedBy: row.claimed_by,
    claimGeneration: row.claim_generation === null ? null : Number(row.claim_generation),
    claimExpiresAt: row.claim_expires_at === null ? null : Number(row.claim_expires_at),
    rootPath: row.root_path,
  };
}

const READ_RESOURCE = prepared((db, p: { id: string }, kind: OwnedResourceKind) => {
  const { table, owner } = RESOURCE_TABLE[kind];
  const rootPath = kind === 'environment' ? sql`root_path` : sql`null`;
  return sql<RawResource>`
    select id, ${sql.ref(owner)} as owner, ownership_generation as generation, status,
           cleanup_claimed_by as claimed_by, cleanup_claim_generation as claim_generation,
           cleanup_claim_expires_at as claim_expires_at, ${rootPath} as root_path
      from ${tableIn(db, table)} where id = ${p.id}`;
});

async function readResource(trx: Trx, kind: OwnedResourceKind, id: string): Promise<ResourceState | null> {
  const row = await READ_RESOURCE.first(trx, { id }, kind);
  return row ? toResourceState(row) : null;
}

function activeClaim(state: ResourceState, now: number): ResourceCleanupClaim | null {
  if (state.claimedBy === null || state.claimExpiresAt === null || state.claimExpiresAt <= now) return null;
  return {
    claimant: state.claimedBy,
    generation: state.claimGeneration ?? state.generation,
    expiresAt: state.claimExpiresAt,
  };
}

function storedClaim(row: {
  cleanup_claimed_by: string | null;
  cleanup_claim_generation: number | null;
  cleanup_claim_expires_at: number | null;
}) {
  if (row.cleanup_claimed_by === null) return null;
  return {
    claimant: row.cleanup_claimed_by,
    generation: Number(row.cleanup_claim_generation),
    expiresAt: Number(row.cleanup_claim_expires_at),
  };
}

function toCleanupSnapshot(row: CleanupSnapshotRow): CleanupSnapshot {
  return {
    id: row.id,
    taskId: row.task_id,
    resourceKind: row.resource_kind,
    resourceId: row.resource_id,
    ownerTaskId: row.owner_task_id,
    generation: Number(row.ownership_generation),
    state: row.state,
    attempts: Number(row.attempts),
    claimedBy: row.claimed_by,
    claimExpiresAt: row.claim_expires_at === null ? null : Number(row.claim_expires_at),
    lastError: row.last_error,
    createdAt: Number(row.created_at),
    updatedAt: Number(row.updated_at),
  };
}

interface CasParams {
  readonly id: string;
  readonly expectedOwner: string;
  readonly expectedGeneration: number;
  readonly newOwner: string;
  readonly now: number;
}

/**
 * Owner transfer as one compare-and-swap (both dialects): the WHERE re-checks owner, generation,
 * status and the absence of an active claim on the row's latest version, so of concurrent
 * transfers with one expectation exactly one matches. Success bumps the generation and clears an
 * expired claim. `guards` adds conditions to the WHERE. Returns the new generation, or no row if
 * the row did not match.
 */
function casSql(db: Kysely<Database>, kind: OwnedResourceKind, p: CasParams, guards: RawBuilder<unknown> = sql``) {
  const { table, owner } = RESOURCE_TABLE[kind];
  return sql<{ generation: number }>`
    update ${tableIn(db, table)}
       set ${sql.ref(owner)} = ${p.newOwner}, ownership_generation = ownership_generation + 1,
           cleanup_claimed_by = null, cleanup_claim_generation = null, cleanup_claim_expires_at = null,
           updated_at = ${p.now}
     where id = ${p.id} and ${sql.ref(owner)} = ${p.expectedOwner} and ownership_generation = ${p.expectedGeneration}
       and status = 'active'
       and (cleanup_claimed_by is null or cleanup_claim_expires_at <= ${p.now})${guards}
    returning ownership_generation as generation`;
}

const CAS_TRANSFER = prepared((db, p: CasParams, kind: OwnedResourceKind) => casSql(db, kind, p));

/**
 * `transferEnvironmentOwnership` / `transferGroupStewardship` in one statement when they succeed:
 * the CAS plus every precondition the transfer checks (not a no-op, the new owner exists and has
 * no cleanup admission, and, for a group, belongs to no other active group). When it matches
 * nothing, the transfer re-checks each condition in order to throw the documented error.
 */
const GUARDED_TRANSFER = prepared((db, p: CasParams, kind: OwnedResourceKind) =>
  casSql(
    db,
    kind,
    p,
    sql`
       and ${sql.ref(RESOURCE_TABLE[kind].owner)} <> ${p.newOwner}
       and exists (select 1 from ${tableIn(db, 'tasks')} t where t.id = ${p.newOwner})
       and not exists (select 1 from ${tableIn(db, 'task_cleanup_admissions')} a where a.task_id = ${p.newOwner})${
         kind === 'group'
           ? sql`
       and coalesce((select min(g.id) from ${tableIn(db, 'workspace_group_members')} m join ${tableIn(db, 'workspace_groups')} g on g.id = m.group_id
                      where m.task_id = ${p.newOwner} and g.status = 'active'), ${p.id}) = ${p.id}`
           : sql``
       }`,
  ),
);

async function casTransfer(
  trx: Trx,
  kind: OwnedResourceKind,
  id: string,
  expectedOwner: string,
  expectedGeneration: number,
  newOwner: string,
  now: number,
): Promise<number | null> {
  const row = await CAS_TRANSFER.first(trx, { id, expectedOwner, expectedGeneration, newOwner, now }, kind);
  return row ? Number(row.generation) : null;
}

/** Why a transfer CAS did not match; throws the matching typed error (called under the resource key). */
async function explainTransferMiss(
  trx: Trx,
  kind: OwnedResourceKind,
  id: string,
  expectedOwner: string,
  expectedGeneration: number,
  now: number,
): Promise<never> {
  const state = await readResource(trx, kind, id);
  if (!state || state.status !== 'active') throw new NotFoundError(`active ${RESOURCE_LABEL[kind]}`, id);
  if (state.owner !== expectedOwner || state.generation !== expectedGeneration) {
    throw new OwnershipChangedError(kind, id, expectedOwner, expectedGeneration, state.owner, state.generation);
  }
  const claim = activeClaim(state, now);
  if (claim) throw new CleanupInProgressError(kind, id, claim.claimant, claim.expiresAt);
  // Unreachable while every writer takes the resource key; fail closed rather than guess.
  throw new OwnershipChangedError(kind, id, expectedOwner, expectedGeneration, state.owner, state.generation);
}

/** The active workspace group `taskId` is a member (or steward) of, if any. */
async function activeGroupOf(trx: Trx, taskId: string): Promise<string | undefined> {
  const row = await trx
    .selectFrom('workspace_group_members as m')
    .innerJoin('workspace_groups as g', 'g.id', 'm.group_id')
    .select('g.id')
    .where('m.task_id', '=', taskId)
    .where('g.status', '=', 'active')
    .orderBy('g.id')
    .executeTakeFirst();
  return row?.id;
}

const SELECT_TASK_ID = prepared((db, p: { id: string }) => db.selectFrom('tasks').select('id').where('id', '=', p.id));

async function requireTaskExists(trx: Trx, taskId: string): Promise<void> {
  if (!(await SELECT_TASK_ID.first(trx, { id: taskId }))) throw new NotFoundError('task', taskId);
}

const FIND_ADMISSION = prepared((db, p: { ids: readonly string[] }, n: number) =>
  db
    .selectFrom('task_cleanup_admissions')
    .select(['task_id', 'kind'])
    .where('task_id', 'in', elements(p.ids, n))
    .orderBy('task_id'),
);

/** @internal The first admitted cleanup among `taskIds`, if any (call with their barrier keys held). */
export async function findAdmission(trx: Trx, taskIds: readonly string[]) {
  if (taskIds.length === 0) return undefined;
  return FIND_ADMISSION.first(trx, { ids: taskIds }, taskIds.length);
}

/** @internal Takes the cleanup barriers of `taskIds` (see `barrierKey`), in sorted order. */
export async function lockBarriers(ctx: StoreContext, trx: Trx, taskIds: Iterable<string>): Promise<void> {
  // Sorted, so two transactions locking overlapping sets cannot deadlock on each other.
  for (const id of [...new Set(taskIds)].sort()) await ctx.dialect.lockKey(trx, barrierKey(id));
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

type FencedOutcome<T> =
  | { readonly ok: true; readonly value: T }
  | { readonly ok: false; readonly error: TaskfenceError };

/** Builds `store.ownership` on a store's context; every guarantee is stated on `OwnershipRepository`. */
export function createOwnershipRepository(ctx: StoreContext): OwnershipRepository {
  const { dialect } = ctx;
  const { db } = dialect;

  async function loadEnvironment(executor: Trx | typeof db, id: string): Promise<TaskEnvironment | null> {
    const row = await executor.selectFrom('task_environments').selectAll().where('id', '=', id).executeTakeFirst();
    if (!row) return null;
    return {
      id: row.id,
      ownerTaskId: row.task_id,
      groupId: row.group_id,
      rootPath: row.root_path,
      status: row.status,
      generation: Number(row.ownership_generation),
      cleanupClaim: storedClaim(row),
    };
  }

  async function loadGroup(executor: Trx | typeof db, id: string): Promise<WorkspaceGroup | null> {
    const row = await executor.selectFrom('workspace_groups').selectAll().where('id', '=', id).executeTakeFirst();
    if (!row) return null;
    const members = await executor
      .selectFrom('workspace_group_members')
      .select(['task_id', 'role'])
      .where('group_id', '=', id)
      .orderBy('task_id')
      .execute();
    return {
      id: row.id,
      stewardTaskId: row.steward_task_id,
      status: row.status,
      generation: Number(row.ownership_generation),
      cleanupClaim: storedClaim(row),
      members: members.map((m) => ({ taskId: m.task_id, role: m.role })),
    };
  }

  async function loadSnapshot(executor: Trx | typeof db, id: string): Promise<CleanupSnapshot | null> {
    const row = await executor.selectFrom('cleanup_snapshots').selectAll().where('id', '=', id).executeTakeFirst();
    return row ? toCleanupSnapshot(row) : null;
  }

  /** Marks a snapshot stale (never a completed one) and builds the error to throw after commit. */
  async function markStale(
    trx: Trx,
    snapshot: CleanupSnapshot,
    current: ResourceState | null,
    now: number,
  ): Promise<StaleOwnershipError> {
    const error = new StaleOwnershipError(
      snapshot.id,
      snapshot.resourceKind,
      snapshot.resourceId,
      snapshot.ownerTaskId,
      snapshot.generation,
      current?.owner ?? null,
      current?.generation ?? null,
    );
    await trx
      .updateTable('cleanup_snapshots')
      .set({ state: 'stale', claimed_by: null, claim_expires_at: null, last_error: error.message, updated_at: now })
      .where('id', '=', snapshot.id)
      .where('state', '<>', 'completed')
      .execute();
    return error;
  }

  const movedSince = (snapshot: CleanupSnapshot, state: ResourceState | null) =>
    !state ||
    state.status !== 'active' ||
    state.owner !== snapshot.ownerTaskId ||
    state.generation !== snapshot.generation;

  /**
   * The common fence of complete / fail / release / renew: under the snapshot and resource keys,
   * checks the snapshot is claimed by `claim.claimant` and the resource still has the snapshot's
   * owner, generation and the claimant's claim, then runs the CAS `update` (which re-checks the
   * same on the row). A moved resource marks the snapshot stale (committed) and yields the error.
   */
  async function fenced<T>(
    claim: CleanupClaim,
    onCompleted: (snapshot: CleanupSnapshot) => FencedOutcome<T> | null,
    apply: (trx: Trx, snapshot: CleanupSnapshot, now: number) => Promise<T | null>,
  ): Promise<T> {
    requireClaim(claim);
    const outcome = await dialect.writeTransaction<FencedOutcome<T>>(async (trx) => {
      const now = ctx.clock.now();
      await dialect.lockKey(trx, snapshotKey(claim.snapshotId));
      const snapshot = await loadSnapshot(trx, claim.snapshotId);
      if (!snapshot) throw new NotFoundError('cleanup snapshot', claim.snapshotId);
      if (snapshot.generation !== claim.target.generation || snapshot.resourceId !== claim.target.id) {
        throw new InvalidArgumentError('claim', `does not belong to snapshot ${snapshot.id}`);
      }
      await dialect.lockKey(trx, resourceKey(snapshot.resourceKind, snapshot.resourceId));
      if (snapshot.state === 'stale') {
        const state = await readResource(trx, snapshot.resourceKind, snapshot.resourceId);
        return { ok: false, error: staleError(snapshot, state) };
      }
      if (snapshot.state === 'completed') {
        const handled = onCompleted(snapshot);
        if (handled) return handled;
        return { ok: false, error: new CleanupAlreadyCompletedError(snapshot.id, snapshot.claimedBy) };
      }
      const state = await readResource(trx, snapshot.resourceKind, snapshot.resourceId);
      if (movedSince(snapshot, state)) return { ok: false, error: await markStale(trx, snapshot, state, now) };
      if (
        snapshot.state !== 'claimed' ||
        snapshot.claimedBy !== claim.claimant ||
        state!.claimedBy !== claim.claimant
      ) {
        return { ok: false, error: new CleanupClaimLostError(snapshot.id, claim.claimant, state!.claimedBy) };
      }
      const value = await apply(trx, snapshot, now);
      if (value === null) {
        // The CAS found the row changed under us: fail closed, keep nothing of this attempt.
        throw new CleanupClaimLostError(snapshot.id, claim.claimant, null);
      }
      return { ok: true, value };
    });
    if (!outcome.ok) throw outcome.error;
    return outcome.value;
  }

  function staleError(snapshot: CleanupSnapshot, state: ResourceState | null) {
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

  /**
   * Ends the caller's claim on the resource, fenced on (owner, generation, claimant); with
   * `remove` the resource becomes `removed`. Returns false if the row did not match.
   */
  async function endResourceClaim(
    trx: Trx,
    snapshot: CleanupSnapshot,
    claimant: string,
    now: number,
    remove: boolean,
  ): Promise<boolean> {
    const { table, owner } = RESOURCE_TABLE[snapshot.resourceKind];
    const status = remove ? sql`'removed'` : sql`status`;
    const { rows } = await sql<{ id: string }>`
      update ${tableIn(trx, table)}
         set status = ${status}, cleanup_claimed_by = null, cleanup_claim_generation = null,
             cleanup_claim_expires_at = null, updated_at = ${now}
       where id = ${snapshot.resourceId} and ${sql.ref(owner)} = ${snapshot.ownerTaskId}
         and ownership_generation = ${snapshot.generation} and status = 'active'
         and cleanup_claimed_by = ${claimant} and cleanup_claim_generation = ${snapshot.generation}
      returning id`.execute(trx);
    return rows.length === 1;
  }

  async function settleSnapshot(
    trx: Trx,
    snapshot: CleanupSnapshot,
    claimant: string,
    now: number,
    set: { state: CleanupSnapshotState; last_error?: string | null; keepClaimant?: boolean },
  ): Promise<CleanupSnapshot> {
    await trx
      .updateTable('cleanup_snapshots')
      .set({
        state: set.state,
        claimed_by: set.keepClaimant ? claimant : null,
        claim_expires_at: null,
        ...(set.last_error !== undefined ? { last_error: set.last_error } : {}),
        updated_at: now,
      })
      .where('id', '=', snapshot.id)
      .where('state', '=', 'claimed')
      .where('claimed_by', '=', claimant)
      .execute();
    return (await loadSnapshot(trx, snapshot.id))!;
  }

  async function transfer(
    kind: OwnedResourceKind,
    id: string,
    expectedOwner: string,
    expectedGeneration: number,
    newOwner: string,
  ): Promise<OwnershipTransfer> {
    return dialect.writeTransaction(async (trx) => {
      const now = ctx.clock.now();
      await lockBarriers(ctx, trx, [newOwner]);
      await dialect.lockKey(trx, resourceKey(kind, id));
      const moved = await GUARDED_TRANSFER.first(trx, { id, expectedOwner, expectedGeneration, newOwner, now }, kind);
      if (moved) {
        if (kind === 'group') await moveStewardRole(trx, id, expectedOwner, newOwner, now);
        return {
          resourceKind: kind,
          resourceId: id,
          ownerTaskId: newOwner,
          generation: Number(moved.generation),
          changed: true,
        };
      }
      // Nothing moved: find out why, checking in the documented order (the keys above are held).
      const current = await readResource(trx, kind, id);
      if (!current || current.status !== 'active') throw new NotFoundError(`active ${RESOURCE_LABEL[kind]}`, id);
      if (current.owner === newOwner && current.owner === expectedOwner && current.generation === expectedGeneration) {
        return {
          resourceKind: kind,
          resourceId: id,
          ownerTaskId: newOwner,
          generation: current.generation,
          changed: false,
        };
      }
      await requireTaskExists(trx, newOwner);
      const admitted = await findAdmission(trx, [newOwner]);
      if (admitted) throw new CleanupBarrierError('transfer', newOwner, admitted.task_id, admitted.kind);
      if (kind === 'group') {
        // A task belongs to at most one active group (task creation joins "the" group of a parent).
        const other = await activeGroupOf(trx, newOwner);
        if (other && other !== id)
          throw new InvalidArgumentError(
            'newStewardTaskId',
            `task ${newOwner} already belongs to workspace group ${other}`,
          );
      }
      return explainTransferMiss(trx, kind, id, expectedOwner, expectedGeneration, now);
    });
  }

  function requireGeneration(field: string, value: unknown): number {
    return requireCounter(field, value, 'generation');
  }

  /** A claim as `claimCleanup` returned it: the fields the fence reads. */
  function requireClaim(claim: CleanupClaim): void {
    requireInput('claim', claim);
    requireId('claim.snapshotId', claim.snapshotId);
    requireId('claim.claimant', claim.claimant);
    requireInput('claim.target', claim.target);
    requireId('claim.target.id', claim.target.id);
    requireGeneration('claim.target.generation', claim.target.generation);
  }

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
          const admitted = await findAdmission(trx, [ownerTaskId]);
          if (admitted) throw new CleanupBarrierError('create', ownerTaskId, admitted.task_id, admitted.kind);
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
          const admitted = await findAdmission(trx, [stewardTaskId]);
          if (admitted) throw new CleanupBarrierError('create', stewardTaskId, admitted.task_id, admitted.kind);
          const existing = await activeGroupOf(trx, stewardTaskId);
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
      return transfer(
        'environment',
        requireId('environmentId', input.environmentId),
        requireId('expectedOwnerTaskId', input.expectedOwnerTaskId),
        requireGeneration('expectedGeneration', input.expectedGeneration),
        requireId('newOwnerTaskId', input.newOwnerTaskId),
      );
    },

    async transferGroupStewardship(input) {
      requireInput('input', input);
      return transfer(
        'group',
        requireId('groupId', input.groupId),
        requireId('expectedStewardTaskId', input.expectedStewardTaskId),
        requireGeneration('expectedGeneration', input.expectedGeneration),
        requireId('newStewardTaskId', input.newStewardTaskId),
      );
    },

    async admitTaskCleanup(taskId, kind = 'archive') {
      requireId('taskId', taskId);
      if (kind !== 'archive' && kind !== 'delete')
        throw new InvalidArgumentError('kind', "must be 'archive' or 'delete'");
      return dialect.writeTransaction(async (trx) => {
        const now = ctx.clock.now();
        await lockBarriers(ctx, trx, [taskId]);
        await requireTaskExists(trx, taskId);
        const inserted = await trx
          .insertInto('task_cleanup_admissions')
          .values({ task_id: taskId, kind, admitted_at: now })
          .onConflict((oc) => oc.column('task_id').doNothing())
          .returning(['kind', 'admitted_at'])
          .executeTakeFirst();
        if (!inserted) {
          const admission = await trx
            .selectFrom('task_cleanup_admissions')
            .selectAll()
            .where('task_id', '=', taskId)
            .executeTakeFirstOrThrow();
          return {
            taskId,
            kind: admission.kind,
            admittedAt: Number(admission.admitted_at),
            alreadyAdmitted: true,
            snapshots: await snapshotsOf(trx, taskId),
          };
        }
        // The inventory: what the task owns now, with the generation it owns it at.
        const environments = await trx
          .selectFrom('task_environments')
          .select(['id', 'ownership_generation'])
          .where('task_id', '=', taskId)
          .where('status', '=', 'active')
          .execute();
        const groups = await trx
          .selectFrom('workspace_groups')
          .select(['id', 'ownership_generation'])
          .where('steward_task_id', '=', taskId)
          .where('status', '=', 'active')
          .execute();
        const rows = [
          ...environments.map((r) => ({ resource_kind: 'environment' as const, ...r })),
          ...groups.map((r) => ({ resource_kind: 'group' as const, ...r })),
        ].map((r) => ({
          id: ctx.newId(),
          task_id: taskId,
          resource_kind: r.resource_kind,
          resource_id: r.id,
          owner_task_id: taskId,
          ownership_generation: Number(r.ownership_generation),
          created_at: now,
          updated_at: now,
        }));
        if (rows.length > 0) await trx.insertInto('cleanup_snapshots').values(rows).execute();
        return { taskId, kind, admittedAt: now, alreadyAdmitted: false, snapshots: await snapshotsOf(trx, taskId) };
      });
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
      const ttlMs = requirePositiveMs('ttlMs', optionalInput('options', options).ttlMs ?? DEFAULT_CLAIM_TTL_MS);
      const outcome = await dialect.writeTransaction<FencedOutcome<CleanupClaim>>(async (trx) => {
        const now = ctx.clock.now();
        await dialect.lockKey(trx, snapshotKey(snapshotId));
        const snapshot = await loadSnapshot(trx, snapshotId);
        if (!snapshot) throw new NotFoundError('cleanup snapshot', snapshotId);
        await dialect.lockKey(trx, resourceKey(snapshot.resourceKind, snapshot.resourceId));
        const state = await readResource(trx, snapshot.resourceKind, snapshot.resourceId);
        if (snapshot.state === 'completed')
          return { ok: false, error: new CleanupAlreadyCompletedError(snapshot.id, snapshot.claimedBy) };
        if (snapshot.state === 'stale') return { ok: false, error: staleError(snapshot, state) };
        if (movedSince(snapshot, state)) return { ok: false, error: await markStale(trx, snapshot, state, now) };
        const expiresAt = now + ttlMs;
        // The claim: fenced on (owner, generation); blocks transfers until completed, failed,
        // released or expired. The same claimant may re-claim (a retried call).
        const { table, owner } = RESOURCE_TABLE[snapshot.resourceKind];
        const { rows } = await sql<{ id: string }>`
          update ${tableIn(trx, table)}
             set cleanup_claimed_by = ${claimant}, cleanup_claim_generation = ownership_generation,
                 cleanup_claim_expires_at = ${expiresAt}, updated_at = ${now}
           where id = ${snapshot.resourceId} and ${sql.ref(owner)} = ${snapshot.ownerTaskId}
             and ownership_generation = ${snapshot.generation} and status = 'active'
             and (cleanup_claimed_by is null or cleanup_claim_expires_at <= ${now} or cleanup_claimed_by = ${claimant})
          returning id`.execute(trx);
        if (rows.length === 0) {
          const claim = activeClaim(state!, now);
          if (claim)
            return {
              ok: false,
              error: new CleanupInProgressError(
                snapshot.resourceKind,
                snapshot.resourceId,
                claim.claimant,
                claim.expiresAt,
              ),
            };
          throw new CleanupClaimLostError(snapshot.id, claimant, state!.claimedBy);
        }
        const reclaim =
          snapshot.state === 'claimed' && snapshot.claimedBy === claimant && (snapshot.claimExpiresAt ?? 0) > now;
        await trx
          .updateTable('cleanup_snapshots')
          .set((eb) => ({
            state: 'claimed',
            claimed_by: claimant,
            claim_expires_at: expiresAt,
            attempts: reclaim ? eb.ref('attempts') : eb('attempts', '+', 1),
            updated_at: now,
          }))
          .where('id', '=', snapshot.id)
          .execute();
        const attempts = reclaim ? snapshot.attempts : snapshot.attempts + 1;
        const target: CleanupTarget =
          snapshot.resourceKind === 'environment'
            ? {
                kind: 'environment',
                id: snapshot.resourceId,
                ownerTaskId: snapshot.ownerTaskId,
                generation: snapshot.generation,
                rootPath: state!.rootPath!,
              }
            : {
                kind: 'group',
                id: snapshot.resourceId,
                ownerTaskId: snapshot.ownerTaskId,
                generation: snapshot.generation,
              };
        return { ok: true, value: { snapshotId: snapshot.id, claimant, expiresAt, attempt: attempts, target } };
      });
      if (!outcome.ok) throw outcome.error;
      return outcome.value;
    },

    async renewCleanupClaim(claim, options) {
      requireClaim(claim);
      const ttlMs = requirePositiveMs('ttlMs', optionalInput('options', options).ttlMs ?? DEFAULT_CLAIM_TTL_MS);
      return fenced(
        claim,
        () => null,
        async (trx, snapshot, now) => {
          const { table, owner } = RESOURCE_TABLE[snapshot.resourceKind];
          const expiresAt = now + ttlMs;
          const { rows } = await sql<{ id: string }>`
            update ${tableIn(trx, table)} set cleanup_claim_expires_at = ${expiresAt}, updated_at = ${now}
             where id = ${snapshot.resourceId} and ${sql.ref(owner)} = ${snapshot.ownerTaskId}
               and ownership_generation = ${snapshot.generation} and status = 'active'
               and cleanup_claimed_by = ${claim.claimant}
            returning id`.execute(trx);
          if (rows.length === 0) return null;
          await trx
            .updateTable('cleanup_snapshots')
            .set({ claim_expires_at: expiresAt, updated_at: now })
            .where('id', '=', snapshot.id)
            .execute();
          return { ...claim, expiresAt };
        },
      );
    },

    async completeCleanup(claim) {
      return fenced(
        claim,
        (snapshot) => (snapshot.claimedBy === claim.claimant ? { ok: true, value: snapshot } : null),
        async (trx, snapshot, now) => {
          if (!(await endResourceClaim(trx, snapshot, claim.claimant, now, true))) return null;
          return settleSnapshot(trx, snapshot, claim.claimant, now, {
            state: 'completed',
            last_error: null,
            keepClaimant: true,
          });
        },
      );
    },

    async failCleanup(claim, error) {
      requireClaim(claim);
      const message = requireText('error', error);
      return fenced(
        claim,
        () => null,
        async (trx, snapshot, now) => {
          if (!(await endResourceClaim(trx, snapshot, claim.claimant, now, false))) return null;
          return settleSnapshot(trx, snapshot, claim.claimant, now, { state: 'failed', last_error: message });
        },
      );
    },

    async releaseCleanupClaim(claim) {
      return fenced(
        claim,
        () => null,
        async (trx, snapshot, now) => {
          if (!(await endResourceClaim(trx, snapshot, claim.claimant, now, false))) return null;
          return settleSnapshot(trx, snapshot, claim.claimant, now, { state: 'pending' });
        },
      );
    },

    async detachSubtask(input) {
      requireInput('input', input);
      const taskId = requireId('taskId', input.taskId);
      const expectedParentId = requireId('expectedParentId', input.expectedParentId);
      return dialect.writeTransaction<DetachResult>(async (trx) => {
        const now = ctx.clock.now();
        await lockBarriers(ctx, trx, [taskId, expectedParentId]);
        const task = await trx
          .selectFrom('tasks')
          .select(['id', 'parent_id'])
          .where('id', '=', taskId)
          .executeTakeFirst();
        if (!task) throw new NotFoundError('task', taskId);
        if (task.parent_id === null) return { outcome: 'already_root', taskId };
        if (task.parent_id !== expectedParentId) throw new ParentChangedError(taskId, expectedParentId, task.parent_id);
        const admitted = await findAdmission(trx, [taskId, expectedParentId]);
        if (admitted) throw new CleanupBarrierError('detach', taskId, admitted.task_id, admitted.kind);

        let group: { id: string; formerStewardTaskId: string; generation: number } | null = null;
        const environments: { id: string; generation: number }[] = [];
        const membership = await trx
          .selectFrom('workspace_group_members as m')
          .innerJoin('workspace_groups as g', 'g.id', 'm.group_id')
          .select(['g.id', 'm.role'])
          .where('m.task_id', '=', taskId)
          .where('g.status', '=', 'active')
          .executeTakeFirst();
        if (membership && membership.role === 'member') {
          // The steward may be the parent or a further ancestor; its barrier is taken too, so a
          // cleanup admitted for it either saw the group before or sees it moved.
          let steward: ResourceState;
          for (;;) {
            const seen = await readResource(trx, 'group', membership.id);
            await lockBarriers(ctx, trx, [seen!.owner]);
            await dialect.lockKey(trx, resourceKey('group', membership.id));
            steward = (await readResource(trx, 'group', membership.id))!;
            if (steward.owner === seen!.owner) break;
          }
          const stewardAdmitted = await findAdmission(trx, [steward.owner]);
          if (stewardAdmitted)
            throw new CleanupBarrierError('detach', taskId, stewardAdmitted.task_id, stewardAdmitted.kind);
          const generation = await casTransfer(
            trx,
            'group',
            membership.id,
            steward.owner,
            steward.generation,
            taskId,
            now,
          );
          if (generation === null)
            await explainTransferMiss(trx, 'group', membership.id, steward.owner, steward.generation, now);
          await moveStewardRole(trx, membership.id, steward.owner, taskId, now);
          group = { id: membership.id, formerStewardTaskId: steward.owner, generation: generation! };

          const owned = await trx
            .selectFrom('task_environments')
            .select('id')
            .where('group_id', '=', membership.id)
            .where('task_id', '=', steward.owner)
            .where('status', '=', 'active')
            .orderBy('id')
            .execute();
          for (const { id } of owned) {
            await dialect.lockKey(trx, resourceKey('environment', id));
            const env = (await readResource(trx, 'environment', id))!;
            const envGeneration = await casTransfer(trx, 'environment', id, steward.owner, env.generation, taskId, now);
            if (envGeneration === null)
              await explainTransferMiss(trx, 'environment', id, steward.owner, env.generation, now);
            environments.push({ id, generation: envGeneration! });
          }
        }
        await trx.updateTable('tasks').set({ parent_id: null, updated_at: now }).where('id', '=', taskId).execute();
        return { outcome: 'detached', taskId, formerParentId: expectedParentId, group, environments };
      });
    },
  };

  async function snapshotsOf(executor: Trx | typeof db, taskId: string): Promise<CleanupSnapshot[]> {
    const rows = await executor
      .selectFrom('cleanup_snapshots')
      .selectAll()
      .where('task_id', '=', taskId)
      .orderBy(sql`case resource_kind when 'environment' then 0 else 1 end`)
      .orderBy('resource_id')
      .execute();
    return rows.map(toCleanupSnapshot);
  }

  return repo;
}
