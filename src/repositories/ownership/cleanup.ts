/**
 * Cleanup: admission (the barrier and the inventory), claims, and the fence every claim holder's
 * write passes (complete / fail / release / renew). Snapshot writes take the snapshot's key, then
 * the resource's (protocol.ts, levels 4 and 5).
 */
import type { Transaction } from 'kysely';
import { InvalidArgumentError, NotFoundError, type TaskfenceError } from '../../errors.js';
import type { CleanupKind, CleanupSnapshotState, Database } from '../../schema/database.js';
import type { StoreContext } from '../context.js';
import { CleanupBarrierError, lockBarriers } from '../shared/barrier.js';
import { keyedWrite, RefusalAfterWrites, type IdempotentCall } from '../idempotent.js';
import { ownedResourceLockKey, snapshotLockKey } from '../../protocol.js';
import {
  CleanupAlreadyCompletedError,
  CleanupClaimLostError,
  CleanupInProgressError,
  StaleOwnershipError as StaleOwnership,
  staleOwnershipError,
  type StaleOwnershipError,
} from './errors.js';
import { readLeaseRowLocked, isLiveGrant, type LeaseFence } from '../shared/fence.js';
import { lostReason } from '../shared/lease.js';
import { auditLeaseActs, type LeaseActRecord } from '../shared/audit.js';
import { loadSnapshot, requireTaskExists, snapshotsOf } from './rows.js';
import { activeClaim, claimResource, readResource, type ResourceState } from './statements.js';
import type { CleanupAdmission, CleanupClaim, CleanupSnapshot, CleanupTarget } from './types.js';
import { extend } from '../../objects.js';

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
    if (!(await claimResource(trx, kind, extend(fence, { claimant, expiresAt, now })))) {
      const claim = activeClaim(state!, now);
      if (claim) {
        const error = new CleanupInProgressError(kind, snapshot.resourceId, claim.claimant, claim.expiresAt);
        return { ok: false, error };
      }
      throw new CleanupClaimLostError(snapshot.id, claimant, state!.claimedBy);
    }
    // Every grant takes the next attempt, a claimant's own live re-claim too: `attempt` is the
    // claim's fencing token, so no two grants of a snapshot ever share one.
    await trx
      .updateTable('cleanup_snapshots')
      .set((eb) => ({
        state: 'claimed',
        claimed_by: claimant,
        claim_expires_at: expiresAt,
        attempts: eb('attempts', '+', 1),
        updated_at: now,
      }))
      .where('id', '=', snapshot.id)
      .execute();
    const attempt = snapshot.attempts + 1;
    // The grant, and the loss of the claim it took over (one that lapsed unsettled, or the
    // claimant's own live claim it re-claimed).
    const acts: LeaseActRecord[] = [cleanupAct('granted', snapshot.id, claimant, attempt, { expiresAt })];
    if (snapshot.state === 'claimed' && snapshot.claimedBy !== null)
      acts.push(
        cleanupAct('lost', snapshot.id, snapshot.claimedBy, snapshot.attempts, {
          reason: 'superseded',
          expiresAt: snapshot.claimExpiresAt,
          by: { holder: claimant, token: attempt },
        }),
      );
    await auditLeaseActs(ctx, trx, now, acts);
    const { resourceId: id, ownerTaskId, generation } = snapshot;
    const target: CleanupTarget =
      kind === 'environment'
        ? { kind, id, ownerTaskId, generation, rootPath: state!.rootPath! }
        : { kind, id, ownerTaskId, generation };
    return { ok: true, value: cleanupClaim(snapshot.id, claimant, attempt, expiresAt, target) };
  });
}

/** The trail's row of an act on a cleanup claim (resource = the snapshot, token = the attempt). */
export function cleanupAct(
  act: LeaseActRecord['act'],
  snapshotId: string,
  holder: string,
  token: number,
  detail: Record<string, unknown>,
): LeaseActRecord {
  return { act, kind: 'cleanup_claim', resource: snapshotId, holder, token, detail };
}

/** A claim with its lease (`token` = `attempt`), as claim and renew return it. */
export function cleanupClaim(
  snapshotId: string,
  claimant: string,
  attempt: number,
  expiresAt: number,
  target: CleanupTarget,
): CleanupClaim {
  const lease = Object.freeze({
    kind: 'cleanup_claim' as const,
    resource: snapshotId,
    holder: claimant,
    token: attempt,
    expiresAt,
  });
  return { snapshotId, claimant, expiresAt, attempt, target, lease };
}

/** The claim state of a snapshot row as the lease protocol reads it: the latest token and its live holder. */
const claimState = (row: { state: CleanupSnapshotState; attempts: number; claimedBy: string | null }) => ({
  token: row.attempts,
  holder: row.state === 'claimed' ? row.claimedBy : null,
});

/**
 * `tx.assertLease` for a cleanup claim: the snapshot row (the claim's lease row: every claim,
 * renew, complete, fail and release of it updates the row) is read locked, and the claim is live
 * iff the snapshot is `claimed` at the lease's token and unexpired; otherwise
 * `CleanupClaimLostError`. A transfer of the resource after the claim lapsed does not touch the
 * snapshot row, so it does not wait; it marks the snapshot stale for the claimant's next call.
 */
export const fenceCleanupClaim: LeaseFence = async (ctx, trx, lease) => {
  const row = await readLeaseRowLocked(
    ctx,
    trx
      .selectFrom('cleanup_snapshots')
      .select(['state', 'attempts', 'claimed_by', 'claim_expires_at'])
      .where('id', '=', lease.resource),
  );
  const current = row
    ? claimState({ state: row.state, attempts: Number(row.attempts), claimedBy: row.claimed_by })
    : null;
  const live = {
    token: current?.token ?? 0,
    holder: current?.holder ?? null,
    expires_at: row?.state === 'claimed' && row.claim_expires_at !== null ? Number(row.claim_expires_at) : null,
  };
  if (row && isLiveGrant(live, lease.token, ctx.clock.now())) return;
  throw new CleanupClaimLostError(
    lease.resource,
    lease.holder,
    current?.holder ?? null,
    lostReason(current, lease.token),
    lease.token,
  );
};

/** How one fenced call treats a claim that is not (or no longer) the live one. */
export interface FenceRules<T> {
  /** A completed snapshot this claim completed: a result (a repeat completion), or null to refuse it. */
  readonly onCompleted?: (snapshot: CleanupSnapshot) => FencedOutcome<T> | null;
  /** A claim the snapshot no longer holds: a result (a repeat release), or null to refuse it. */
  readonly onLost?: (snapshot: CleanupSnapshot, now: number) => FencedOutcome<T> | null;
  /** Refuse a lapsed claim even while nobody claimed after it (renew never revives a lapsed lease). */
  readonly unexpired?: boolean;
}

/**
 * The common fence of complete / fail / release / renew: under the snapshot and resource keys,
 * checks the snapshot is claimed at `claim.attempt` (the claim's token) by `claim.claimant` and
 * the resource still has the snapshot's owner, generation and the claimant's claim, then runs
 * `apply` (whose fenced UPDATE re-checks the same on the row; null = it matched nothing). A moved
 * resource marks the snapshot stale (committed) and throws the error.
 */
export async function fenced<T>(
  ctx: StoreContext,
  claim: CleanupClaim,
  rules: FenceRules<T>,
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
      // Only the claim that completed it may see its completion as its own.
      const handled = snapshot.attempts === claim.attempt ? (rules.onCompleted?.(snapshot) ?? null) : null;
      if (handled) return handled;
      return { ok: false, error: new CleanupAlreadyCompletedError(snapshot.id, snapshot.claimedBy) };
    }
    const state = await readResource(trx, snapshot.resourceKind, snapshot.resourceId);
    if (movedSince(snapshot, state)) return { ok: false, error: await markStale(trx, snapshot, state, now) };
    const held =
      snapshot.state === 'claimed' &&
      snapshot.attempts === claim.attempt &&
      snapshot.claimedBy === claim.claimant &&
      state!.claimedBy === claim.claimant;
    if (!held) {
      const handled = rules.onLost?.(snapshot, now) ?? null;
      if (handled) return handled;
      const reason = lostReason(claimState(snapshot), claim.attempt);
      const error = new CleanupClaimLostError(snapshot.id, claim.claimant, state!.claimedBy, reason, claim.attempt);
      return { ok: false, error };
    }
    if (rules.unexpired && (snapshot.claimExpiresAt ?? 0) <= now) {
      const error = new CleanupClaimLostError(snapshot.id, claim.claimant, null, 'expired', claim.attempt);
      return { ok: false, error };
    }
    const value = await apply(trx, snapshot, now);
    if (value === null) {
      // The CAS found the row changed under us: fail closed, keep nothing of this attempt.
      throw new CleanupClaimLostError(snapshot.id, claim.claimant, null, 'superseded', claim.attempt);
    }
    return { ok: true, value };
  });
}

/**
 * The release rule every lease kind follows (README, Leases), as `releaseCleanupClaim`'s
 * `onLost`: a repeat release is a no-op while nobody was granted the snapshot after this claim
 * (it is `pending` or `failed` at the claim's token), or while the claim's own `expiresAt` has
 * not passed (nobody can take over a live claim, so a later grant proves this one was released).
 */
export function repeatRelease(claim: CleanupClaim): FenceRules<CleanupSnapshot>['onLost'] {
  return (snapshot, now) => {
    const releasedByUs = snapshot.state !== 'claimed' && snapshot.attempts === claim.attempt;
    const supersededLive = snapshot.attempts > claim.attempt && now < claim.expiresAt;
    return releasedByUs || supersededLive ? { ok: true, value: snapshot } : null;
  };
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
