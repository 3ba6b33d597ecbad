/**
 * The task-lease claim, shared by `locks.claimTaskLease` and `scheduler.dispatchRun` (which runs
 * its readiness check in the claim's transaction). See locks.ts for the lease rules.
 */
import { sql, type Kysely, type Transaction } from 'kysely';
import { NotFoundError } from '../../errors.js';
import { prepared } from '../../query/prepared.js';
import { tableIn } from '../../query/schema.js';
import type { Database } from '../../schema/database.js';
import type { StoreContext } from '../context.js';
import { keyedCall, keyedWrite, type RefusalClass } from '../idempotent.js';
import type { TaskLeaseClaim } from './leases.js';
import { auditLeaseActs, auditsLeaseAct, grantedActs } from './audit.js';
import { explainAfterRollback } from './misses.js';

// A claim is one upsert: the row is never deleted, so `token + 1` is higher than every token
// granted before; no row back ⇒ someone holds a live lease.
const CLAIM_TASK_LEASE = prepared(
  (db, p: { taskId: string; holder: string; now: number; expiresAt: number }) => sql<{
    token: number;
    expires_at: number;
  }>`
    insert into ${tableIn(db, 'task_leases')} (task_id, holder, token, acquired_at, expires_at)
    values (${p.taskId}, ${p.holder}, 1, ${p.now}, ${p.expiresAt})
    on conflict (task_id) do update
      set holder = excluded.holder, token = task_leases.token + 1,
          acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
      where task_leases.holder is null or task_leases.expires_at <= ${p.now}
    returning token, expires_at`,
);

/**
 * The task-lease claim (`claimTaskLease`, one write transaction keyed as `locks.claimTaskLease`),
 * with an optional `guard` run first in the same transaction: a refusal it throws (listed in
 * `refusals`, so a keyed retry replays it) rolls the claim back before the token moves. Input is
 * checked by the caller.
 */
export function claimTaskLeaseWith(
  ctx: StoreContext,
  taskId: string,
  input: { holder: string; ttlMs: number; idempotencyKey?: string | undefined },
  guard?: (trx: Transaction<Database>) => Promise<void>,
  refusals: readonly RefusalClass[] = [],
): Promise<TaskLeaseClaim> {
  const { holder, ttlMs } = input;
  const call = keyedCall('locks.claimTaskLease', input, { taskId, holder, ttlMs }, refusals);
  return mapMissing(ctx, 'task', taskId, () =>
    keyedWrite(ctx, call, async (trx): Promise<TaskLeaseClaim> => {
      if (guard) await guard(trx);
      const now = ctx.clock.now();
      const expiresAt = now + ttlMs;
      // The audit trail names the lease a takeover ends (only when it records losses).
      const before = auditsLeaseAct(ctx, 'lost') ? await readTaskLease(trx, taskId) : undefined;
      // Same fenced upsert as the workspace lock: one winner, token + 1, never reset.
      const row = await CLAIM_TASK_LEASE.first(trx, { taskId, holder, now, expiresAt });
      if (row) {
        const lease = Object.freeze({
          kind: 'task_lease' as const,
          resource: taskId,
          holder,
          token: Number(row.token),
          expiresAt: Number(row.expires_at),
        });
        await auditLeaseActs(
          ctx,
          trx,
          now,
          grantedActs('task_lease', taskId, holder, lease.token, { expiresAt: lease.expiresAt }, before),
        );
        return { status: 'acquired', lease };
      }
      const held = (await readTaskLease(trx, taskId))!;
      return {
        status: 'busy',
        heldBy: { holder: held.holder!, token: Number(held.token), expiresAt: Number(held.expires_at) },
      };
    }),
  );
}

/** The task's lease row (token, holder, expiry), if it was ever claimed. */
export function readTaskLease(trx: Kysely<Database>, taskId: string) {
  return trx
    .selectFrom('task_leases')
    .select(['token', 'holder', 'expires_at'])
    .where('task_id', '=', taskId)
    .executeTakeFirst();
}

/**
 * Maps a foreign-key failure of a claim (no such workspace / task) to `NotFoundError`, after the
 * rollback (`explainAfterRollback`); the claim's one reference names the missing row, so nothing is read.
 */
export function mapMissing<T>(ctx: StoreContext, entity: string, id: string, fn: () => Promise<T>): Promise<T> {
  return explainAfterRollback(ctx.dialect, 'foreign_key_violation', fn, async () => {
    throw new NotFoundError(entity, id);
  });
}
