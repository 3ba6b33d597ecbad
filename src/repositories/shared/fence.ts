/**
 * Fenced host writes (`tx.assertLease`, issue 21): inside a host transaction, a lease is checked
 * to be the live grant of its resource and then held so until the transaction ends, so a takeover
 * waits for the in-flight fenced write. Each lease kind names its fence here; the row lock is
 * what makes it a fence rather than a check:
 *
 * - PostgreSQL: the lease row is read `FOR SHARE`. Every claim, renew and release of that lease
 *   updates the row (a claim is an upsert on it), so it waits for the fenced transaction to end,
 *   and a fenced transaction that starts after a takeover committed reads the new token.
 * - SQLite: `BEGIN IMMEDIATE` already serializes every writer; the read alone is the fence.
 */
import type { Transaction } from 'kysely';
import type { Database } from '../../schema/database.js';
import type { StoreContext } from '../context.js';
import type { Lease, LeaseKind } from './lease.js';

type Trx = Transaction<Database>;

/** Checks `lease` against its row, locked for the rest of `trx`; throws the kind's `LeaseLostError` if it is not live. */
export type LeaseFence = (ctx: StoreContext, trx: Trx, lease: Lease) => Promise<void>;

/**
 * Reads one lease row, locked against every writer of it until the transaction ends where the
 * dialect has row locks (PostgreSQL `FOR SHARE`; on SQLite the write transaction already holds
 * the database). Dialects with row locks are exactly those with `SKIP LOCKED`.
 */
export async function readLeaseRowLocked<R>(
  ctx: StoreContext,
  query: { forShare(): { executeTakeFirst(): Promise<R | undefined> }; executeTakeFirst(): Promise<R | undefined> },
): Promise<R | undefined> {
  return ctx.dialect.supportsSkipLocked ? query.forShare().executeTakeFirst() : query.executeTakeFirst();
}

/** The fence of a single-row lease (`token`, `holder`, `expires_at`): live iff the token is the row's, held and unexpired. */
export function isLiveGrant(
  row: { token: number; holder: string | null; expires_at: number | null } | undefined,
  token: number,
  now: number,
): boolean {
  return (
    row !== undefined &&
    Number(row.token) === token &&
    row.holder !== null &&
    row.expires_at !== null &&
    Number(row.expires_at) > now
  );
}

/** The fences by kind; a kind without one is refused by `tx.assertLease` with `InvalidArgumentError`. */
export type LeaseFences = Partial<Record<LeaseKind, LeaseFence>>;
