/**
 * The lease vocabulary of workspace locks and task leases (SPEC §4): what `store.locks` returns
 * and throws, shared with `store.scheduler`, which claims its leases through `store.locks`.
 */
import { TaskfenceError } from '../../errors.js';

/** A granted lease: the fencing token and when it expires (epoch ms) unless renewed. */
export interface LeaseGrant {
  readonly token: number;
  readonly expiresAt: number;
}

/** Who holds a workspace lock right now. */
export interface WorkspaceLockHolder {
  readonly holder: string;
  readonly runId: string | null;
  readonly token: number;
  readonly expiresAt: number;
}

/** Who holds a task lease right now. */
export interface TaskLeaseHolder {
  readonly holder: string;
  readonly token: number;
  readonly expiresAt: number;
}

/** The result of `claimWorkspaceLock`: a grant, or the live holder it lost to. */
export type WorkspaceLockClaim =
  | ({ readonly status: 'claimed' } & LeaseGrant)
  | { readonly status: 'busy'; readonly heldBy: WorkspaceLockHolder };

/** The result of `claimTaskLease`: a grant, or the live holder it lost to. */
export type TaskLeaseClaim =
  | ({ readonly status: 'claimed' } & LeaseGrant)
  | { readonly status: 'busy'; readonly heldBy: TaskLeaseHolder };

export interface ClaimWorkspaceLockInput {
  /** Who holds it (a process or run handle); shown to the losers. */
  readonly holder: string;
  /** The run the lock is held for. */
  readonly runId: string;
  /** How long the lock lives unless renewed. */
  readonly ttlMs: number;
}

export interface ClaimTaskLeaseInput {
  /** Who holds it (a run or process handle); shown to the losers. */
  readonly holder: string;
  /** How long the lease lives unless renewed. */
  readonly ttlMs: number;
}

/** Why a token was refused. */
export type StaleTokenReason =
  /** Someone claimed after this token: the lease is theirs now. */
  | 'superseded'
  /** The token is the latest, but its lease expired (renew only; claim again for a new token). */
  | 'expired'
  /** The token was never granted here (or the row does not exist). */
  | 'unknown';

/** The state of the row a stale token was checked against. */
export interface CurrentLeaseState {
  readonly token: number;
  readonly holder: string | null;
  readonly expiresAt: number | null;
}

/**
 * A workspace lock token is no longer current: renew and release refuse it. The caller has lost
 * the lock and must stop writing to the workspace.
 */
export class StaleWorkspaceLockError extends TaskfenceError {
  readonly code = 'STALE_WORKSPACE_LOCK';
  constructor(
    readonly workspaceId: string,
    readonly token: number,
    readonly reason: StaleTokenReason,
    readonly current: CurrentLeaseState | null,
  ) {
    super(
      `Workspace lock token ${token} on workspace ${workspaceId} is stale (${reason}` +
        (current ? `; the current token is ${current.token}, held by ${current.holder ?? 'nobody'}` : '') +
        '). This holder lost the lock: stop writing to the workspace and claim it again on a later beat.',
    );
  }
}

/** A task lease token is no longer current: renew and release refuse it. The caller must stop working on the task. */
export class StaleTaskLeaseError extends TaskfenceError {
  readonly code = 'STALE_TASK_LEASE';
  constructor(
    readonly taskId: string,
    readonly token: number,
    readonly reason: StaleTokenReason,
    readonly current: CurrentLeaseState | null,
  ) {
    super(
      `Task lease token ${token} on task ${taskId} is stale (${reason}` +
        (current ? `; the current token is ${current.token}, held by ${current.holder ?? 'nobody'}` : '') +
        '). This holder lost the task: stop working on it; the current holder owns it.',
    );
  }
}

/** Workspace locks and task leases (SPEC §4). */
export interface LockRepository {
  /**
   * Claims the workspace's exclusive lock if it is free or expired, in one atomic upsert: exactly
   * one of any number of concurrent claimers gets `claimed` with a token higher than every earlier
   * one; the others get `busy` with the holder they lost to. Not re-entrant: the holder itself
   * gets `busy` while its own lock is live.
   *
   * @example
   * const claim = await store.locks.claimWorkspaceLock(ws.id, { holder: 'worker-1', runId, ttlMs: 60_000 });
   * if (claim.status === 'claimed') await store.locks.releaseWorkspaceLock(ws.id, { token: claim.token });
   */
  claimWorkspaceLock(workspaceId: string, input: ClaimWorkspaceLockInput): Promise<WorkspaceLockClaim>;
  /**
   * Extends a lock the token still holds to now + `ttlMs`. Throws `StaleWorkspaceLockError` if the
   * token was superseded or its lease already expired: an expired lock is never silently revived.
   */
  renewWorkspaceLock(workspaceId: string, input: { token: number; ttlMs: number }): Promise<LeaseGrant>;
  /**
   * Frees the lock if `token` is still the latest grant (idempotent for that token, even after
   * expiry); throws `StaleWorkspaceLockError` once anyone else has claimed since.
   */
  releaseWorkspaceLock(workspaceId: string, input: { token: number }): Promise<void>;
  /** The current holder of a workspace lock, or null if it is free or expired. */
  getWorkspaceLock(workspaceId: string): Promise<WorkspaceLockHolder | null>;

  /** Claims a task's lease, with the same atomicity and fencing as `claimWorkspaceLock`. */
  claimTaskLease(taskId: string, input: ClaimTaskLeaseInput): Promise<TaskLeaseClaim>;
  /** Extends a task lease the token still holds; throws `StaleTaskLeaseError` if it was superseded or expired. */
  renewTaskLease(taskId: string, input: { token: number; ttlMs: number }): Promise<LeaseGrant>;
  /** Frees a task lease if `token` is still the latest grant; throws `StaleTaskLeaseError` otherwise. */
  releaseTaskLease(taskId: string, input: { token: number }): Promise<void>;
  /** The current holder of a task lease, or null if it is free or expired. */
  getTaskLease(taskId: string): Promise<TaskLeaseHolder | null>;
}
