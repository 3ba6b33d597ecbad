/**
 * Cleanup: admission (the barrier and the inventory), claims, and the fence every claim holder's
 * write passes (complete / fail / release / renew). Snapshot writes take the snapshot's key, then
 * the resource's (lock-keys.ts, levels 4 and 5).
 */
import type { Transaction } from 'kysely';
import { InvalidArgumentError, NotFoundError, type TaskfenceError } from '../../errors.js';
import type { CleanupKind, CleanupSnapshotState, Database } from '../../schema/database.js';
import type { StoreContext } from '../context.js';
import { CleanupBarrierError, lockBarriers } from '../shared/barrier.js';
import { keyedWrite, RefusalAfterWrites, type IdempotentCall } from '../idempotent.js';
import { ownedResourceLockKey, snapshotLockKey } from '../shared/lock-keys.js';
import {
  CleanupAlreadyCompletedError,
  CleanupClaimLostError,
  CleanupInProgressError,
  StaleOwnershipError as StaleOwnership,
  staleOwnershipError,
  type StaleOwnershipError,
} from './errors.js';
import { loadSnapshot, requireTaskExists, snapshotsOf } from './rows.js';
import { activeClaim, claimResource, readResource, type ResourceState } from './statements.js';
import type { CleanupAdmission, CleanupClaim, CleanupSnapshot, CleanupTarget } from './types.js';

type Trx = Transaction<Database>;

/** A fenced transaction's result: the value, or the refusal to throw after its writes commit. */
type FencedOutcome<T> =
  | { readonly ok: true; readonly value: T }
  | { readonly ok: false; readonly error: TaskfenceError };

/** The typed refusals a keyed cleanup step stores (a stale snapshot's mark is kept with it). */
export const CLEANUP_REFUSALS = [
  NotFoundError,
  CleanupAlreadyCompletedError,
  CleanupClaimLostError,
  CleanupInProgressError,
  StaleOwnership,
];
export const ADMIT_REFUSALS = [NotFoundError, CleanupBarrierError];

/**
 * Runs `fn` in a write transaction and throws the refusal it returned only after the commit;
 * keyed, the refusal is stored with the writes (`RefusalAfterWrites`).
 */
async function commitThenThrow<T>(
  ctx: StoreContext,
  call: IdempotentCall | null,
  fn: (trx: Trx) => Promise<FencedOutcome<T>>,
): Promise<T> {
  if (call !== null) {
    return keyedWrite(ctx, call, async (trx) => {
      const outcome = await fn(trx);
      return outcome.ok ? outcome.value : (new RefusalAfterWrites(outcome.error) as unknown as T);
    });
  }
  const outcome = await ctx.dialect.writeTransaction(fn);
  if (!outcome.ok) throw outcome.error;
  return outcome.value;
}

/** Marks a snapshot stale (never a completed one) and returns the error to throw after commit. */
async function markStale(
  trx: Trx,
  snapshot: CleanupSnapshot,
  current: ResourceState | null,
  now: number,
): Promise<StaleOwnershipError> {
  const error = staleOwnershipError(snapshot, current);
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

/** `admitTaskCleanup` (validated input); its guarantee is stated on `OwnershipRepository`. */
export async function admitTaskCleanup(
  ctx: StoreContext,
  taskId: string,
  kind: CleanupKind,
  call: IdempotentCall | null = null,
): Promise<CleanupAdmission> {
  return keyedWrite(ctx, call, async (trx) => {
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
    const owned = (table: 'task_environments' | 'workspace_groups', owner: 'task_id' | 'steward_task_id') =>
      trx
        .selectFrom(table)
        .select(['id', 'ownership_generation'])
        .where(owner, '=', taskId)
        .where('status', '=', 'active')
        .execute();
    const environments = await owned('task_environments', 'task_id');
    const groups = await owned('workspace_groups', 'steward_task_id');
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
}

/** `claimCleanup` (validated input); its guarantee is stated on `OwnershipRepository`. */
export async function claimCleanup(
  ctx: StoreContext,
  snapshotId: string,
  claimant: string,
  ttlMs: number,
  call: IdempotentCall | null = null,
): Promise<CleanupClaim> {
  const { dialect } = ctx;
  return commitThenThrow<CleanupClaim>(ctx, call, async (trx) => {
    const now = ctx.clock.now();
    await dialect.lockKey(trx, snapshotLockKey(snapshotId));
    const snapshot = await loadSnapshot(trx, snapshotId);
    if (!snapshot) throw new NotFoundError('cleanup snapshot', snapshotId);
    const kind = snapshot.resourceKind;
    await dialect.lockKey(trx, ownedResourceLockKey(kind, snapshot.resourceId));
    const state = await readResource(trx, kind, snapshot.resourceId);
    if (snapshot.state === 'completed')
      return { ok: false, error: new CleanupAlreadyCompletedError(snapshot.id, snapshot.claimedBy) };
    if (snapshot.state === 'stale') return { ok: false, error: staleOwnershipError(snapshot, state) };
    if (movedSince(snapshot, state)) return { ok: false, error: await markStale(trx, snapshot, state, now) };
    const expiresAt = now + ttlMs;
    const fence = { id: snapshot.resourceId, owner: snapshot.ownerTaskId, generation: snapshot.generation };
    if (!(await claimResource(trx, kind, { ...fence, claimant, expiresAt, now }))) {
      const claim = activeClaim(state!, now);
      if (claim) {
        const error = new CleanupInProgressError(kind, snapshot.resourceId, claim.claimant, claim.expiresAt);
        return { ok: false, error };
      }
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
    const attempt = reclaim ? snapshot.attempts : snapshot.attempts + 1;
    const { resourceId: id, ownerTaskId, generation } = snapshot;
    const target: CleanupTarget =
      kind === 'environment'
        ? { kind, id, ownerTaskId, generation, rootPath: state!.rootPath! }
        : { kind, id, ownerTaskId, generation };
    return { ok: true, value: { snapshotId: snapshot.id, claimant, expiresAt, attempt, target } };
  });
}

/**
 * The common fence of complete / fail / release / renew: under the snapshot and resource keys,
 * checks the snapshot is claimed by `claim.claimant` and the resource still has the snapshot's
 * owner, generation and the claimant's claim, then runs `apply` (whose fenced UPDATE re-checks
 * the same on the row; null = it matched nothing). A moved resource marks the snapshot stale
 * (committed) and throws the error. `onCompleted` may accept an already completed snapshot.
 */
export async function fenced<T>(
  ctx: StoreContext,
  claim: CleanupClaim,
  onCompleted: (snapshot: CleanupSnapshot) => FencedOutcome<T> | null,
  apply: (trx: Trx, snapshot: CleanupSnapshot, now: number) => Promise<T | null>,
  call: IdempotentCall | null = null,
): Promise<T> {
  const { dialect } = ctx;
  return commitThenThrow<T>(ctx, call, async (trx) => {
    const now = ctx.clock.now();
    await dialect.lockKey(trx, snapshotLockKey(claim.snapshotId));
    const snapshot = await loadSnapshot(trx, claim.snapshotId);
    if (!snapshot) throw new NotFoundError('cleanup snapshot', claim.snapshotId);
    if (snapshot.generation !== claim.target.generation || snapshot.resourceId !== claim.target.id) {
      throw new InvalidArgumentError('claim', `does not belong to snapshot ${snapshot.id}`);
    }
    await dialect.lockKey(trx, ownedResourceLockKey(snapshot.resourceKind, snapshot.resourceId));
    if (snapshot.state === 'stale') {
      const state = await readResource(trx, snapshot.resourceKind, snapshot.resourceId);
      return { ok: false, error: staleOwnershipError(snapshot, state) };
    }
    if (snapshot.state === 'completed') {
      const handled = onCompleted(snapshot);
      if (handled) return handled;
      return { ok: false, error: new CleanupAlreadyCompletedError(snapshot.id, snapshot.claimedBy) };
    }
    const state = await readResource(trx, snapshot.resourceKind, snapshot.resourceId);
    if (movedSince(snapshot, state)) return { ok: false, error: await markStale(trx, snapshot, state, now) };
    if (snapshot.state !== 'claimed' || snapshot.claimedBy !== claim.claimant || state!.claimedBy !== claim.claimant) {
      return { ok: false, error: new CleanupClaimLostError(snapshot.id, claim.claimant, state!.claimedBy) };
    }
    const value = await apply(trx, snapshot, now);
    if (value === null) {
      // The CAS found the row changed under us: fail closed, keep nothing of this attempt.
      throw new CleanupClaimLostError(snapshot.id, claim.claimant, null);
    }
    return { ok: true, value };
  });
}

/** Settles a claimed snapshot (only while `claimant` still holds it) and returns it as committed. */
export async function settleSnapshot(
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
