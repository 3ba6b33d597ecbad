import type { CompiledQuery, Kysely, QueryResult, Transaction } from 'kysely';
import { elements, prepared, runBound } from '../../query/prepared.js';
import { InvalidArgumentError } from '../../errors.js';
import type { Database } from '../../schema/database.js';
import { requireId } from '../validate.js';
import type { AckResult, ReceiptRefusal, ReceiptRefusalReason, ReleaseResult } from './types.js';
import { MAX_DELIVERY_LIMIT } from './types.js';

/*
 * Acks and releases by receipt. A receipt is `<attempt>.<nonce>.<message id>`: opaque to callers,
 * but it names its row, so a batch is one update by primary key whose WHERE also requires the
 * receipt to be the row's current one and its lease to hold. Receipts that miss are explained in
 * the same transaction, one reason each (see `explainMisses`), never by throwing for the batch.
 */

/** A batch of receipts: an array of 1 to `MAX_DELIVERY_LIMIT` strings, duplicates dropped. */
export function requireReceipts(value: unknown): string[] {
  if (!Array.isArray(value) || value.length > MAX_DELIVERY_LIMIT) {
    throw new InvalidArgumentError('receipts', `must be an array of at most ${MAX_DELIVERY_LIMIT} receipts`);
  }
  return [...new Set(value.map((r, i) => requireId(`receipts[${i}]`, r)))];
}

interface ParsedReceipt {
  readonly attempt: number;
  readonly id: string;
}

function parseReceipt(receipt: string): ParsedReceipt | null {
  const first = receipt.indexOf('.');
  const second = first < 0 ? -1 : receipt.indexOf('.', first + 1);
  if (second < 0) return null;
  const attempt = Number(receipt.slice(0, first));
  if (!Number.isSafeInteger(attempt) || attempt < 1) return null;
  return { attempt, id: receipt.slice(second + 1) };
}

/** Receipts and the ids they name (malformed receipts name nothing). */
function idsOf(receipts: readonly string[]): string[] {
  return [...new Set(receipts.map(parseReceipt).flatMap((p) => (p === null ? [] : [p.id])))];
}

/** The ack of a batch, prepared per shape: `<ids>.<receipts>` (see `ackStatement`). */
const ACK = prepared(
  (db, p: { ids: readonly string[]; receipts: readonly string[]; handle: string; now: number }, shape: string) => {
    const [ids, receipts] = shape.split('.').map(Number) as [number, number];
    return db
      .updateTable('messages')
      .set({ status: 'delivered', delivered_at: p.now, visible_at: null })
      .where('id', 'in', elements(p.ids, ids))
      .where('receipt', 'in', elements(p.receipts, receipts))
      .where('to_handle', '=', p.handle)
      .where('status', '=', 'pending')
      .where('dead_at', 'is', null)
      .where('visible_at', '>', p.now)
      .returning('receipt');
  },
);

/**
 * The one statement that acks `receipts` of `handle`'s inbox at `now`, bound (to send with BEGIN:
 * `WriteTransactionOptions.first`), or null when no receipt names a message.
 */
export function ackStatement(
  db: Kysely<Database>,
  handle: string,
  receipts: readonly string[],
  now: number,
): CompiledQuery<{ receipt: string | null }> | null {
  const ids = idsOf(receipts);
  if (ids.length === 0) return null;
  return ACK.bind(db, { ids, receipts, handle, now }, `${ids.length}.${receipts.length}`);
}

/**
 * Acks `receipts` of `handle`'s inbox at `now`, in the caller's transaction: `statement` is
 * `ackStatement`'s, and `sent` its result when BEGIN sent it.
 */
export async function ackReceipts(
  trx: Transaction<Database>,
  handle: string,
  receipts: readonly string[],
  now: number,
  statement: CompiledQuery<{ receipt: string | null }> | null,
  sent?: QueryResult<{ receipt: string | null }>,
): Promise<AckResult> {
  if (statement === null)
    return { acked: [], refused: receipts.map((receipt) => ({ receipt, reason: 'never_granted' })) };
  const rows = (sent ?? (await runBound(trx, statement))).rows;
  const done = new Set(rows.map((r) => r.receipt!));
  const { settled, refused } = await explainMisses(
    trx,
    handle,
    receipts.filter((r) => !done.has(r)),
    now,
    'ack',
  );
  return { acked: receipts.filter((r) => done.has(r) || settled.has(r)), refused };
}

/** Releases `receipts` (visible again after `delayMs`), dead-lettering those on their last attempt. */
export async function releaseReceipts(
  trx: Transaction<Database>,
  handle: string,
  receipts: readonly string[],
  options: { now: number; delayMs: number; error: string | null; maxAttempts: number },
): Promise<ReleaseResult> {
  const { now, delayMs, error, maxAttempts } = options;
  const ids = idsOf(receipts);
  if (ids.length === 0) {
    return {
      released: [],
      deadLettered: [],
      refused: receipts.map((receipt) => ({ receipt, reason: 'never_granted' })),
    };
  }
  const held = (q: ReturnType<typeof base>) =>
    q
      .where('id', 'in', ids)
      .where('receipt', 'in', receipts)
      .where('to_handle', '=', handle)
      .where('status', '=', 'pending')
      .where('dead_at', 'is', null)
      .where('visible_at', '>', now);
  const base = () => trx.updateTable('messages');
  const dead = await held(base())
    .set((eb) => ({
      dead_at: now,
      last_error: error ?? eb.fn.coalesce('last_error', eb.val('released on its last attempt')),
    }))
    .where('attempts', '>=', maxAttempts)
    .returning('receipt')
    .execute();
  await held(base())
    .set((eb) => ({
      receipt: null,
      visible_at: delayMs === 0 ? null : now + delayMs,
      last_error: error ?? eb.ref('last_error'),
    }))
    .where('attempts', '<', maxAttempts)
    .execute();
  // The released rows' receipt is now null: explainMisses reports them settled.
  const deadSet = new Set(dead.map((r) => r.receipt!));
  const missed = await explainMisses(
    trx,
    handle,
    receipts.filter((r) => !deadSet.has(r)),
    now,
    'release',
  );
  return {
    released: receipts.filter((r) => missed.settled.has(r)),
    deadLettered: receipts.filter((r) => deadSet.has(r)),
    refused: missed.refused,
  };
}

/**
 * Why each receipt in `receipts` was not acked (or released) just now, read in the same
 * transaction. `settled` holds receipts whose effect already holds: for an ack, the message was
 * acked under that very receipt (a retry); for a release, the hand-out is released.
 */
async function explainMisses(
  trx: Transaction<Database>,
  handle: string,
  receipts: readonly string[],
  now: number,
  call: 'ack' | 'release',
): Promise<{ settled: Set<string>; refused: ReceiptRefusal[] }> {
  const settled = new Set<string>();
  const refused: ReceiptRefusal[] = [];
  if (receipts.length === 0) return { settled, refused };
  const ids = idsOf(receipts);
  const rows =
    ids.length === 0
      ? []
      : await trx
          .selectFrom('messages')
          .select(['id', 'to_handle', 'status', 'receipt', 'attempts', 'visible_at', 'dead_at'])
          .where('id', 'in', ids)
          .execute();
  const byId = new Map(rows.map((r) => [r.id, r]));
  for (const receipt of receipts) {
    const parsed = parseReceipt(receipt);
    const row = parsed === null ? undefined : byId.get(parsed.id);
    const reason = ((): ReceiptRefusalReason | 'settled' => {
      if (!row || !parsed || row.to_handle !== handle || Number(row.attempts) < parsed.attempt) return 'never_granted';
      if (row.receipt === receipt) {
        if (row.status === 'delivered') return call === 'ack' ? 'settled' : 'superseded';
        if (row.dead_at !== null) return 'dead';
        return 'expired';
      }
      if (Number(row.attempts) > parsed.attempt || row.status === 'delivered') return 'superseded';
      if (row.receipt === null) {
        if (row.dead_at !== null) return 'dead';
        // Released (by this receipt: the attempt is the row's), or its lease lapsed after a release.
        return call === 'release' && (row.visible_at === null || row.visible_at > now) ? 'settled' : 'released';
      }
      return 'never_granted';
    })();
    if (reason === 'settled') settled.add(receipt);
    else refused.push({ receipt, reason });
  }
  return { settled, refused };
}
