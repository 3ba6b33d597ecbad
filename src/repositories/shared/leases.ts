/**
 * Workspace locks and task leases (SPEC §4) in the one lease vocabulary (lease.ts): what
 * `store.locks` returns and throws, shared with `store.scheduler`, which claims its leases
 * through `store.locks`.
 */
import type { Lease, LeaseClaim, LeaseLostReason } from './lease.js';
import { LeaseLostError } from './lease.js';
import type { IdempotencyOptions } from '../idempotent.js';
import { claim, committed, release, renewal, type OutcomeDeclarations } from './outcomes.js';

/** TTL of a workspace lock when the claim gives none (renew at about a third of it). */
export const DEFAULT_WORKSPACE_LOCK_TTL_MS = 5 * 60_000;
/** TTL of a task lease when the claim gives none (renew at about a third of it). */
export const DEFAULT_TASK_LEASE_TTL_MS = 5 * 60_000;

/**
 * A granted lease: the fencing token and when it expires (epoch ms) unless renewed.
 * @deprecated since 0.x: every claim now returns a full `Lease` (which has these two fields); kept for one release.
 */
export interface LeaseGrant {
  readonly token: number;
  readonly expiresAt: number;
}

/** A workspace lock grant: `resource` is the workspace id, `holder` the claim's holder. */
export type WorkspaceLock = Lease<'workspace_lock'> & { readonly runId: string };
/** A task lease grant: `resource` is the task id. */
export type TaskLease = Lease<'task_lease'>;

/** Who holds a workspace lock right now. */
export interface WorkspaceLockHolder {
  readonly holder: string;
  readonly runId: string | null;
  readonly token: number;
  readonly expiresAt: number;
  /**
   * Set when what blocks the lock is a live path lease in the workspace (one exclusion rule: the
   * lock is the whole-workspace key): the lease's key; `token` is then its grant's token (0 for
   * a lease written before schema 0095) and `runId` null.
   */
  readonly pathKey?: string;
}

/** Who holds a task lease right now. */
export interface TaskLeaseHolder {
  readonly holder: string;
  readonly token: number;
  readonly expiresAt: number;
}

/** The result of `claimWorkspaceLock`: `{ status: 'acquired', lease }`, or the live holder it lost to. */
export type WorkspaceLockClaim =
  | { readonly status: 'acquired'; readonly lease: WorkspaceLock }
  | Extract<LeaseClaim<'workspace_lock', WorkspaceLockHolder>, { status: 'busy' }>;

/** The result of `claimTaskLease`: `{ status: 'acquired', lease }`, or the live holder it lost to. */
export type TaskLeaseClaim = LeaseClaim<'task_lease', TaskLeaseHolder>;

export interface ClaimWorkspaceLockInput extends IdempotencyOptions {
  /** Who holds it (a process or run handle); shown to the losers. */
  readonly holder: string;
  /** The run the lock is held for. */
  readonly runId: string;
  /** How long the lock lives unless renewed (default `DEFAULT_WORKSPACE_LOCK_TTL_MS`). */
  readonly ttlMs?: number;
}

export interface ClaimTaskLeaseInput extends IdempotencyOptions {
  /** Who holds it (a run or process handle); shown to the losers. */
  readonly holder: string;
  /** How long the lease lives unless renewed (default `DEFAULT_TASK_LEASE_TTL_MS`). */
  readonly ttlMs?: number;
}

/** How long a renewal extends a lease: from now, `ttlMs` (default: the kind's default TTL). */
export interface RenewLeaseOptions extends IdempotencyOptions {
  readonly ttlMs?: number;
}

/**
 * Why a token was refused.
 * @deprecated since 0.x: use `LeaseLostReason` (`'unknown'` is now `'never_granted'`, and a released token says `'released'`).
 */
export type StaleTokenReason = LeaseLostReason;

/** The state of the row a stale token was checked against. */
export interface CurrentLeaseState {
  readonly token: number;
  readonly holder: string | null;
  readonly expiresAt: number | null;
}

/**
 * A workspace lock token is no longer current: renew, release and `tx.assertLease` refuse it.
 * The caller has lost the lock and must stop writing to the workspace.
 */
export class StaleWorkspaceLockError extends LeaseLostError {
  readonly code = 'STALE_WORKSPACE_LOCK';
  readonly kind = 'workspace_lock';
  constructor(
    readonly workspaceId: string,
    readonly token: number,
    readonly reason: LeaseLostReason,
    readonly current: CurrentLeaseState | null,
  ) {
    super(
      `Workspace lock token ${token} on workspace ${workspaceId} is stale (${reason}` +
        (current ? `; the current token is ${current.token}, held by ${current.holder ?? 'nobody'}` : '') +
        '). This holder lost the lock: stop writing to the workspace and claim it again on a later beat.',
    );
  }
}

/** A task lease token is no longer current: renew, release and `tx.assertLease` refuse it. The caller must stop working on the task. */
export class StaleTaskLeaseError extends LeaseLostError {
  readonly code = 'STALE_TASK_LEASE';
  readonly kind = 'task_lease';
  constructor(
    readonly taskId: string,
    readonly token: number,
    readonly reason: LeaseLostReason,
    readonly current: CurrentLeaseState | null,
  ) {
    super(
      `Task lease token ${token} on task ${taskId} is stale (${reason}` +
        (current ? `; the current token is ${current.token}, held by ${current.holder ?? 'nobody'}` : '') +
        '). This holder lost the task: stop working on it; the current holder owns it.',
    );
  }
}

/**
 * Workspace locks and task leases (SPEC §4). Both follow the lease protocol of every kind
 * (README, "Leases"): claim → `{ status: 'acquired', lease }` or `{ status: 'busy', heldBy }`;
 * `renew(lease)` extends a live lease or throws the kind's `LeaseLostError`; `release(lease)`
 * frees it, a repeat release of the same token is a no-op success, and a superseded or never
 * granted token throws.
 */
export interface LockRepository {
  /**
   * Claims the workspace's exclusive lock if it is free or expired, in one atomic upsert: exactly
   * one of any number of concurrent claimers gets `acquired` with a token higher than every earlier
   * one; the others get `busy` with the holder they lost to. Not re-entrant: the holder itself
   * gets `busy` while its own lock is live.
   *
   * @example
   * const claim = await store.locks.claimWorkspaceLock(ws.id, { holder: 'worker-1', runId, ttlMs: 60_000 });
   * if (claim.status === 'acquired') await store.locks.releaseWorkspaceLock(claim.lease);
   */
  claimWorkspaceLock(workspaceId: string, input: ClaimWorkspaceLockInput): Promise<WorkspaceLockClaim>;
  /**
   * Extends a lock the lease still holds to now + `ttlMs`. Throws `StaleWorkspaceLockError` if the
   * token was superseded, released or its lease already expired: an expired lock is never
   * silently revived. The old form `(workspaceId, { token, ttlMs })` is kept for one release.
   *
   * @example
   * lease = await store.locks.renewWorkspaceLock(lease, { ttlMs: 60_000 });
   */
  renewWorkspaceLock(lease: WorkspaceLock, options?: RenewLeaseOptions): Promise<WorkspaceLock>;
  /** @deprecated since 0.x: pass the lease, `renewWorkspaceLock(lease, { ttlMs })`. */
  renewWorkspaceLock(workspaceId: string, input: { token: number; ttlMs: number }): Promise<WorkspaceLock>;
  /**
   * Frees the lock if the lease's token is still the latest grant, even after expiry. Repeating
   * the release of the same token is a no-op success; a token someone else claimed after (or one
   * never granted) throws `StaleWorkspaceLockError`. The old form `(workspaceId, { token })` is
   * kept for one release.
   *
   * @example
   * await store.locks.releaseWorkspaceLock(lease);
   */
  releaseWorkspaceLock(lease: WorkspaceLock, options?: IdempotencyOptions): Promise<void>;
  /** @deprecated since 0.x: pass the lease, `releaseWorkspaceLock(lease)`. */
  releaseWorkspaceLock(workspaceId: string, input: { token: number }): Promise<void>;
  /** The current holder of a workspace lock, or null if it is free or expired. */
  getWorkspaceLock(workspaceId: string): Promise<WorkspaceLockHolder | null>;

  /** Claims a task's lease, with the same atomicity and fencing as `claimWorkspaceLock`. */
  claimTaskLease(taskId: string, input: ClaimTaskLeaseInput): Promise<TaskLeaseClaim>;
  /** Extends a task lease the lease still holds; throws `StaleTaskLeaseError` if it was superseded, released or expired. */
  renewTaskLease(lease: TaskLease, options?: RenewLeaseOptions): Promise<TaskLease>;
  /** @deprecated since 0.x: pass the lease, `renewTaskLease(lease, { ttlMs })`. */
  renewTaskLease(taskId: string, input: { token: number; ttlMs: number }): Promise<TaskLease>;
  /** Frees a task lease (same semantics as `releaseWorkspaceLock`); throws `StaleTaskLeaseError` for a superseded or never granted token. */
  releaseTaskLease(lease: TaskLease, options?: IdempotencyOptions): Promise<void>;
  /** @deprecated since 0.x: pass the lease, `releaseTaskLease(lease)`. */
  releaseTaskLease(taskId: string, input: { token: number }): Promise<void>;
  /** The current holder of a task lease, or null if it is free or expired. */
  getTaskLease(taskId: string): Promise<TaskLeaseHolder | null>;
}

/** Each call's declared outcome (see outcomes.ts). */
export const LOCK_OUTCOMES: OutcomeDeclarations<LockRepository> = {
  claimWorkspaceLock: claim,
  renewWorkspaceLock: renewal,
  releaseWorkspaceLock: release,
  getWorkspaceLock: committed,
  claimTaskLease: claim,
  renewTaskLease: renewal,
  releaseTaskLease: release,
  getTaskLease: committed,
};
