import type { Transaction } from 'kysely';
import { GateNotResolvedError, NotFoundError, ResolutionAlreadyConsumedError } from '../errors.js';
import type { Database, DecisionGateRow } from '../schema/database.js';

/*
 * Exactly-once resume (issue 23 item 5), beside gates.ts: which coordinator acts on a decision.
 * `consumeResolution` is one compare-and-set on `consumed_by is null`; a miss is explained in the
 * same transaction. With an idempotency key (see idempotent.ts) the consumer's own retry gets
 * its first outcome back instead of "already consumed by" itself.
 */

/** A resolved gate's decision, taken by one consumer. */
export interface ConsumedResolution {
  readonly gateId: string;
  readonly resolution: string;
  readonly consumer: string;
  readonly consumedAt: number;
}

export interface ConsumeResolutionInput {
  /** Who acts on the decision (a run id, a process name): named to later callers. */
  readonly consumer: string;
  /** A retry with the same key (and consumer) returns this call's outcome. */
  readonly idempotencyKey?: string;
}

/**
 * The typed refusals `consumeResolution` records under an idempotency key. Not
 * `GateNotResolvedError`: a consumer polls until the decision comes, and a stored "not resolved
 * yet" would answer its keyed retries for the whole window.
 */
export const CONSUME_REFUSALS = [ResolutionAlreadyConsumedError, NotFoundError] as const;

/** Takes gate `gateId`'s resolution for `consumer` at `now`, or throws why not; inside `trx`. */
export async function consumeResolutionIn(
  trx: Transaction<Database>,
  gateId: string,
  consumer: string,
  now: number,
): Promise<ConsumedResolution> {
  const row = await trx
    .updateTable('decision_gates')
    .set({ consumed_by: consumer, consumed_at: now })
    .where('id', '=', gateId)
    .where('status', '=', 'resolved')
    .where('timed_out_at', 'is', null)
    .where('consumed_by', 'is', null)
    .returningAll()
    .executeTakeFirst();
  if (row) return consumed(row);
  const current = await trx.selectFrom('decision_gates').selectAll().where('id', '=', gateId).executeTakeFirst();
  if (!current) throw new NotFoundError('decision gate', gateId);
  // A timed-out gate is stored resolved, with no resolution: there is nothing to consume.
  if (current.status !== 'resolved' || current.timed_out_at !== null)
    throw new GateNotResolvedError(gateId, current.timed_out_at !== null ? 'timeout' : current.status);
  throw new ResolutionAlreadyConsumedError(gateId, current.consumed_by!, Number(current.consumed_at));
}

function consumed(row: DecisionGateRow): ConsumedResolution {
  return {
    gateId: row.id,
    resolution: row.resolution!,
    consumer: row.consumed_by!,
    consumedAt: Number(row.consumed_at),
  };
}
