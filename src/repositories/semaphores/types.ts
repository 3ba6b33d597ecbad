/**
 * The public types of `store.semaphores` (issue 21): counting semaphores in the one lease
 * vocabulary, their errors and the guarantee each method gives.
 */
import type { Lease, LeaseLostReason } from '../shared/lease.js';
import { LeaseLostError, LeaseWaitTimeoutError } from '../shared/lease.js';
import type { IdempotencyOptions } from '../idempotent.js';
import { claim, committed, grant, release, renewal, type OutcomeDeclarations } from '../shared/outcomes.js';

/** TTL of a semaphore slot when the call gives none. */
export const DEFAULT_SEMAPHORE_TTL_MS = 60_000;
/** Largest `limit` a semaphore may have. */
export const MAX_SEMAPHORE_LIMIT = 10_000;
/** How many of the holders `busy` reports (the ones whose slots free first). */
export const SEMAPHORE_HOLDER_REPORT_LIMIT = 16;

/** One slot of a semaphore: `resource` is the semaphore's name. */
export type SemaphoreLease = Lease<'semaphore'> & { readonly limit: number };

/** One live holder of a semaphore's slots. */
export interface SemaphoreHolder {
  readonly holder: string;
  readonly token: number;
  readonly expiresAt: number;
}

/** Who fills a full semaphore: the holder whose slot frees first, and the first few holders. */
export interface SemaphoreBusy {
  /** The holder whose slot expires first (the earliest a slot can free without a release). */
  readonly holder: string;
  readonly expiresAt: number;
  readonly limit: number;
  /** Live slots counted: at least `limit` (counting stops at the larger of `limit` and `SEMAPHORE_HOLDER_REPORT_LIMIT`). */
  readonly count: number;
  /** Up to `SEMAPHORE_HOLDER_REPORT_LIMIT` live holders, soonest-expiring first. */
  readonly holders: readonly SemaphoreHolder[];
}

/** The result of `acquire`: `{ status: 'acquired', lease }`, or `{ status: 'busy', heldBy }`. */
export type SemaphoreClaim =
  | { readonly status: 'acquired'; readonly lease: SemaphoreLease }
  | { readonly status: 'busy'; readonly heldBy: SemaphoreBusy };

export interface AcquireSemaphoreInput extends IdempotencyOptions {
  /** Who holds the slot; shown to the callers it blocks. One holder may hold several slots. */
  readonly holder: string;
  /** How many slots the semaphore has (1..`MAX_SEMAPHORE_LIMIT`). Callers of one name should agree; each call is judged by its own. */
  readonly limit: number;
  /** How long the slot lives unless renewed (default `DEFAULT_SEMAPHORE_TTL_MS`). */
  readonly ttlMs?: number;
}

export interface AcquireSemaphoreWaitOptions {
  /** Give up after waiting this long (real time, not the store clock). */
  readonly timeoutMs: number;
  /** Longest wait between two checks when no release wakes the waiter (default: the store's `wakeFallbackMs`). */
  readonly maxPollMs?: number;
}

/** A semaphore slot token is not (or no longer) a live slot: renew, release and `tx.assertLease` refuse it. */
export class SemaphoreLeaseLostError extends LeaseLostError {
  readonly code = 'SEMAPHORE_LEASE_LOST';
  readonly kind = 'semaphore';
  constructor(
    readonly semaphore: string,
    readonly token: number,
    readonly reason: LeaseLostReason,
  ) {
    super(
      `Semaphore ${JSON.stringify(semaphore)} slot ${token} is not held (${reason}). ` +
        'This holder lost its slot: stop the work it guards and acquire again.',
    );
  }
}

/** `acquireWait` waited `timeoutMs` and every slot was still taken; `blockers` are the holders seen last. */
export class SemaphoreTimeoutError extends LeaseWaitTimeoutError {
  readonly code = 'SEMAPHORE_TIMEOUT';
  readonly kind = 'semaphore';
  constructor(
    readonly resource: string,
    readonly holder: string,
    readonly limit: number,
    readonly timeoutMs: number,
    readonly blockers: readonly SemaphoreHolder[],
  ) {
    super(
      `Holder ${JSON.stringify(holder)} could not acquire a slot of semaphore ${JSON.stringify(resource)} (limit ${limit}) ` +
        `within ${timeoutMs} ms; held by ${blockers.map((b) => JSON.stringify(b.holder)).join(', ')}. ` +
        'Wait for a holder to release (or its slot to expire), or raise timeoutMs or the limit.',
    );
  }
}

/**
 * Counting semaphores: at most `limit` live slots per name, across processes. Each slot is a
 * lease of kind `semaphore` and follows the protocol of every lease (README, "Leases").
 */
export interface SemaphoreRepository {
  /**
   * Takes one slot of `name` if fewer than `limit` slots are live, in one write transaction
   * serialized per name: of any number of concurrent callers, never more than `limit` hold a live
   * slot at once; the rest get `busy`. Expired slots do not count (they are reclaimed). Each
   * grant's token is higher than every earlier one of that name.
   *
   * @example
   * const r = await store.semaphores.acquire('builds', { holder: 'worker-1', limit: 4, ttlMs: 60_000 });
   * if (r.status === 'acquired') try { await build(); } finally { await store.semaphores.release(r.lease); }
   */
  acquire(name: string, input: AcquireSemaphoreInput): Promise<SemaphoreClaim>;
  /**
   * Like `acquire`, but waits until a slot frees (a release wakes the waiter at once; an expiry is
   * noticed within `maxPollMs`). Throws `SemaphoreTimeoutError` naming the holders after `timeoutMs`.
   *
   * @example
   * const lease = await store.semaphores.acquireWait('builds', { holder, limit: 4, ttlMs: 60_000 }, { timeoutMs: 30_000 });
   */
  acquireWait(
    name: string,
    input: AcquireSemaphoreInput,
    options: AcquireSemaphoreWaitOptions,
  ): Promise<SemaphoreLease>;
  /**
   * Extends a live slot to now + `ttlMs`. An expired slot is never revived: it throws
   * `SemaphoreLeaseLostError` (`expired`), as does a released one (`released`).
   *
   * @example
   * lease = await store.semaphores.renew(lease, { ttlMs: 60_000 });
   */
  renew(lease: SemaphoreLease, options?: { readonly ttlMs?: number } & IdempotencyOptions): Promise<SemaphoreLease>;
  /**
   * Frees the slot (live or expired) and wakes the waiters of `name`. A repeat release is a no-op
   * success; a slot reclaimed after it lapsed (the name granted since) throws
   * `SemaphoreLeaseLostError` (`superseded`), and a token never granted for `name` (`never_granted`).
   *
   * @example
   * await store.semaphores.release(lease);
   */
  release(lease: SemaphoreLease, options?: IdempotencyOptions): Promise<void>;
  /** The live slots of `name`, soonest-expiring first; for diagnostics and tests. */
  listHolders(name: string): Promise<SemaphoreHolder[]>;
}

/** Each call's declared outcome (see shared/outcomes.ts). */
export const SEMAPHORE_OUTCOMES: OutcomeDeclarations<SemaphoreRepository> = {
  acquire: claim,
  acquireWait: grant,
  renew: renewal,
  release: release,
  listHolders: committed,
};
