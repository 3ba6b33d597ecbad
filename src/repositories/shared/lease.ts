/**
 * The one lease vocabulary (issue 21): every claim in taskfence, whatever it guards, grants a
 * `Lease`, reports contention as `{ status: 'busy', heldBy }`, and reports a lost lease with a
 * `LeaseLostError` subclass. Areas keep their own error codes (`STALE_WORKSPACE_LOCK`, …) as
 * subclasses, so callers can catch the family or one kind.
 */
import { InvalidArgumentError, TaskfenceError } from '../../errors.js';
import { requireCounter, requireId, requireInput } from '../validate.js';

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

/**
 * Why `token` is not (or no longer) the live grant of a fenced row that holds the latest token
 * granted for its resource (`current`, or null when nothing was ever granted there). A row whose
 * token is `token` but whose holder is gone was released; one whose lease lapsed, expired.
 */
export function lostReason(
  current: { readonly token: number; readonly holder: string | null } | null | undefined,
  token: number,
): LeaseLostReason {
  if (!current || token > current.token) return 'never_granted';
  if (token < current.token) return 'superseded';
  return current.holder === null ? 'released' : 'expired';
}

/**
 * Checks that `value` is a grant of `kind` as a claim returned it (the fields renew, release and
 * `tx.assertLease` read), before any statement runs.
 */
export function requireLease<K extends LeaseKind>(kind: K, value: unknown, field = 'lease'): Lease<K> {
  const lease = requireInput(field, value) as Partial<Lease>;
  if (lease.kind !== kind)
    throw new InvalidArgumentError(`${field}.kind`, `must be '${kind}' (pass the lease the claim returned)`);
  return Object.freeze({
    kind,
    resource: requireId(`${field}.resource`, lease.resource),
    holder: requireId(`${field}.holder`, lease.holder),
    token: requireCounter(`${field}.token`, lease.token, 'token a claim returned'),
    expiresAt: requireExpiresAt(`${field}.expiresAt`, lease.expiresAt),
  });
}

/** A lease's `expiresAt` as the claim returned it: epoch milliseconds, a finite number. */
function requireExpiresAt(field: string, value: unknown): number {
  if (typeof value !== 'number' || !Number.isFinite(value))
    throw new InvalidArgumentError(field, 'must be the expiresAt (epoch ms) the claim returned');
  return value;
}

/** The lease kinds `requireLease` can tell apart by their `kind` field. */
export function requireLeaseKind(value: unknown, field = 'lease'): LeaseKind {
  const lease = requireInput(field, value) as Partial<Lease>;
  if (typeof lease.kind !== 'string' || !(LEASE_KINDS as readonly string[]).includes(lease.kind))
    throw new InvalidArgumentError(`${field}.kind`, `must be one of ${LEASE_KINDS.join(', ')}`);
  return lease.kind;
}

const LEASE_KINDS: readonly LeaseKind[] = [
  'workspace_lock',
  'task_lease',
  'path_lease',
  'cleanup_claim',
  'coordinator_run',
  'dispatch',
  'semaphore',
];

/**
 * The base of every blocking wait that gave up (`acquirePaths`, `semaphores.acquireWait`): what
 * was asked for, how long it waited, and the holders that still blocked it when it gave up.
 */
export abstract class LeaseWaitTimeoutError extends TaskfenceError {
  abstract readonly kind: LeaseKind;
  abstract readonly resource: string;
  abstract readonly holder: string;
  abstract readonly timeoutMs: number;
  abstract readonly blockers: readonly LeaseHolderInfo[];
}
