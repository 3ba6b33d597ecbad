/**
 * The one lease vocabulary (issue 21): every claim in taskfence, whatever it guards, grants a
 * `Lease`, reports contention as `{ status: 'busy', heldBy }`, and reports a lost lease with a
 * `LeaseLostError` subclass. Areas keep their own error codes (`STALE_WORKSPACE_LOCK`, …) as
 * subclasses, so callers can catch the family or one kind.
 */
import { TaskfenceError } from '../../errors.js';

/** Every kind of lease taskfence grants. */
export type LeaseKind =
  | 'workspace_lock'
  | 'task_lease'
  | 'path_lease'
  | 'cleanup_claim'
  | 'coordinator_run'
  | 'dispatch'
  | 'semaphore';

/**
 * A grant: what is held (`kind`, `resource`), by whom, the fencing token (rises on every grant of
 * that resource, never reused) and when it lapses unless renewed (epoch ms). Pass it back to
 * renew, release and `tx.assertLease` unchanged.
 */
export interface Lease<K extends LeaseKind = LeaseKind> {
  readonly kind: K;
  /** The id of what is held: a workspace id, task id, dispatch id, semaphore name, … */
  readonly resource: string;
  readonly holder: string;
  readonly token: number;
  readonly expiresAt: number;
}

/** Who holds a contended resource right now (area-specific fields may be added). */
export interface LeaseHolderInfo {
  readonly holder: string;
  readonly expiresAt: number;
}

/** The result of every non-blocking claim: a grant, or the live holder it lost to. */
export type LeaseClaim<K extends LeaseKind, H extends LeaseHolderInfo = LeaseHolderInfo> =
  | { readonly status: 'acquired'; readonly lease: Lease<K> }
  | { readonly status: 'busy'; readonly heldBy: H };

/**
 * Why a lease is no longer the caller's:
 * - `superseded`: someone was granted the resource after this token;
 * - `expired`: the token is the latest, but its lease lapsed (claim again for a new token);
 * - `released`: the token's lease was released;
 * - `never_granted`: no such grant exists here.
 */
export type LeaseLostReason = 'superseded' | 'expired' | 'released' | 'never_granted';

/**
 * The base of every lost-lease error. The caller no longer holds the lease and must stop acting
 * under it. Subclasses keep their area's code (`STALE_WORKSPACE_LOCK`, `STALE_TASK_LEASE`,
 * `CLEANUP_CLAIM_LOST`, …).
 */
export abstract class LeaseLostError extends TaskfenceError {
  abstract readonly kind: LeaseKind;
  abstract readonly reason: LeaseLostReason;
}
