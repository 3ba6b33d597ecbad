/**
 * `store.semaphores` (issue 21): counting semaphores. The guarantees are stated on
 * `SemaphoreRepository` (types.ts). Every acquisition runs in one write transaction under the
 * semaphore's key (protocol.ts, level 8: PostgreSQL advisory lock; SQLite `BEGIN IMMEDIATE`),
 * which reclaims the expired slots, counts the live ones and grants a slot only below the limit.
 */
import { sql, type CompiledQuery, type Kysely, type QueryCreator, type RawBuilder, type Transaction } from 'kysely';
import type { Database } from '../../schema/database.js';
import { clampTimerMs } from '../../timers.js';
import { prepared, runBound } from '../../query/prepared.js';
import type { StoreContext } from '../context.js';
import { readLeaseRowLocked, type LeaseFence } from '../shared/fence.js';
import { requireLease, type LeaseLostReason } from '../shared/lease.js';
import { semaphoreLockKey, semaphoreTopic } from '../../protocol.js';
import { auditLeaseActs, auditsLeaseAct, type LeaseActRecord } from '../shared/audit.js';
import { idempotentInOneTrip, keyedCall, keyedWrite, type IdempotencyOptions } from '../idempotent.js';
import {
  optionalInput,
  requireCounter,
  requireId,
  requireInput,
  requireLimit,
  requirePositiveMs,
} from '../validate.js';
import {
  DEFAULT_SEMAPHORE_TTL_MS,
  MAX_SEMAPHORE_LIMIT,
  SEMAPHORE_HOLDER_REPORT_LIMIT,
  SemaphoreLeaseLostError,
  SemaphoreTimeoutError,
  type AcquireSemaphoreInput,
  type SemaphoreClaim,
  type SemaphoreHolder,
  type SemaphoreLease,
  type SemaphoreRepository,
} from './types.js';
import { extend } from '../../objects.js';

type Trx = Transaction<Database>;

const toHolder = (row: { holder: string; token: number; expires_at: number }): SemaphoreHolder => ({
  holder: row.holder,
  token: Number(row.token),
  expiresAt: Number(row.expires_at),
});

/** The latest token granted for `name`, or 0. */
async function latestToken(trx: Trx, name: string): Promise<number> {
  const row = await trx.selectFrom('semaphores').select('token').where('name', '=', name).executeTakeFirst();
  return row ? Number(row.token) : 0;
}

/**
 * Why `token` holds no live slot: its row lapsed (`expired`) or is gone. A slot row is gone once
 * released or reclaimed after expiry; the lease's own `expiresAt` tells the two apart.
 */
async function lostSlotReason(trx: Trx, name: string, token: number, leaseExpiresAt: number, now: number) {
  const row = await trx
    .selectFrom('semaphore_holders')
    .select('expires_at')
    .where('name', '=', name)
    .where('token', '=', token)
    .executeTakeFirst();
  if (row) return 'expired' satisfies LeaseLostReason;
  if (token > (await latestToken(trx, name))) return 'never_granted' satisfies LeaseLostReason;
  return (leaseExpiresAt <= now ? 'expired' : 'released') satisfies LeaseLostReason;
}

// Kysely types bigint columns as number; the driver may hand back strings, and `toHolder` converts.
type SlotRow = { holder: string; token: number; expires_at: number };

/**
 * Deletes the name's expired slots (returned, for the trail) and reads its live ones, in two
 * statements (where a WITH clause cannot write; PostgreSQL folds them with the grant,
 * `reclaimAndGrant`).
 */
async function liveSlots(
  ctx: StoreContext,
  trx: Trx,
  name: string,
  now: number,
  limit: number,
): Promise<{ reclaimed: SlotRow[]; rows: SlotRow[] }> {
  const reclaim = trx.deleteFrom('semaphore_holders').where('name', '=', name).where('expires_at', '<=', now);
  // The trail records each reclaimed slot as lost (`returning` costs no statement more).
  const reclaimed = auditsLeaseAct(ctx, 'lost')
    ? await reclaim.returning(['holder', 'token', 'expires_at']).execute()
    : (await reclaim.execute(), []);
  const rows = await trx
    .selectFrom('semaphore_holders')
    .select(['holder', 'token', 'expires_at'])
    .where('name', '=', name)
    .orderBy('expires_at')
    .orderBy('token')
    .limit(limit)
    .execute();
  return { reclaimed, rows };
}

interface SlotGrant {
  readonly name: string;
  readonly holder: string;
  readonly limit: number;
  readonly now: number;
  readonly expiresAt: number;
}

/**
 * The name's next token. It rises on every grant of the name and is never reset (the row is
 * never deleted); the latest grant's limit is the name's limit (what inspect shows beside the
 * holders).
 */
const takeToken = (db: QueryCreator<Database>, p: SlotGrant, when?: RawBuilder<boolean>) =>
  (when === undefined
    ? db.insertInto('semaphores').values({ name: p.name, token: 1, updated_at: p.now, slot_limit: p.limit })
    : db
        .insertInto('semaphores')
        .columns(['name', 'token', 'updated_at', 'slot_limit'])
        .expression(
          db
            .selectNoFrom((eb) => [
              eb.val(p.name).as('name'),
              eb.lit(1).as('token'),
              eb.val(p.now).as('updated_at'),
              eb.val(p.limit).as('slot_limit'),
            ])
            .where(when),
        )
  )
    .onConflict((oc) =>
      oc
        .column('name')
        .doUpdateSet({ token: sql<number>`semaphores.token + 1`, updated_at: p.now, slot_limit: p.limit }),
    )
    .returning('token');

/** Takes the name's next token and the slot under it (two statements: SQLite). */
async function grantSlot(trx: Trx, p: SlotGrant): Promise<number> {
  const token = Number((await takeToken(trx, p).executeTakeFirstOrThrow()).token);
  await trx
    .insertInto('semaphore_holders')
    .values({ name: p.name, token, holder: p.holder, acquired_at: p.now, expires_at: p.expiresAt })
    .execute();
  return token;
}

/**
 * The whole acquisition in one statement, where a WITH clause may write (PostgreSQL), the name's
 * key held since BEGIN:
 * - `reclaimed` deletes the expired slots (it waits for a fenced transaction that still holds one
 *   before the statement returns);
 * - `live` reads the live slots, soonest-expiring first, `report` of them; in the statement's
 *   snapshot it skips exactly the rows `reclaimed` takes, by its predicate (`expires_at > now`);
 * - `granted` takes the next token only while fewer than `limit` are live, and `slot` inserts the
 *   slot under it.
 *
 * Rows: each live slot (`part` 0), each reclaimed one (1), and the granted token (2) if any.
 */
function reclaimAndGrant(trx: Trx, p: SlotGrant, report: number) {
  return (
    trx
      .with('reclaimed', (q) =>
        q
          .deleteFrom('semaphore_holders')
          .where('name', '=', p.name)
          .where('expires_at', '<=', p.now)
          .returning(['holder', 'token', 'expires_at']),
      )
      .with('live', (q) =>
        q
          .selectFrom('semaphore_holders')
          .select(['holder', 'token', 'expires_at'])
          .where('name', '=', p.name)
          .where('expires_at', '>', p.now)
          .orderBy('expires_at')
          .orderBy('token')
          .limit(report),
      )
      // The CTEs before add their names to the creator's tables; takeToken reads none of them.
      .with('granted', (q) =>
        takeToken(q as unknown as QueryCreator<Database>, p, sql<boolean>`(select count(*) from live) < ${p.limit}`),
      )
      .with('slot', (q) =>
        q
          .insertInto('semaphore_holders')
          .columns(['name', 'token', 'holder', 'acquired_at', 'expires_at'])
          .expression((eb) =>
            eb
              .selectFrom('granted')
              .select((s) => [
                s.val(p.name).as('name'),
                'granted.token',
                s.val(p.holder).as('holder'),
                s.val(p.now).as('acquired_at'),
                s.val(p.expiresAt).as('expires_at'),
              ]),
          )
          .returning('token'),
      )
      .selectFrom('live')
      .select(['holder', 'token', 'expires_at', sql.lit(0).as('part')])
      .unionAll((u) => u.selectFrom('reclaimed').select(['holder', 'token', 'expires_at', sql.lit(1).as('part')]))
      .unionAll((u) =>
        u
          .selectFrom('slot')
          .select([sql<string>`null`.as('holder'), 'token', sql<number>`null`.as('expires_at'), sql.lit(2).as('part')]),
      )
      .execute()
  );
}

/** One acquisition inside the caller's write transaction. */
async function acquireIn(
  ctx: StoreContext,
  trx: Trx,
  name: string,
  holder: string,
  limit: number,
  ttlMs: number,
): Promise<SemaphoreClaim> {
  await ctx.dialect.lockKey(trx, semaphoreLockKey(name));
  // Read the clock only once the name is serialized, so slot times follow commit order.
  const now = ctx.clock.now();
  // Reclaim: expired slots are deleted, which waits for a fenced transaction (`tx.assertLease`)
  // that still holds one, so a slot is never counted free while its old holder writes under it.
  // Then the live slots, soonest-expiring first, as many as decide the claim, in one snapshot (a
  // release may commit meanwhile without the name's key; it only ever frees slots).
  const report = Math.max(limit, SEMAPHORE_HOLDER_REPORT_LIMIT);
  const expiresAt = now + ttlMs;
  const grant: SlotGrant = { name, holder, limit, now, expiresAt };
  let reclaimed: SlotRow[];
  let rows: SlotRow[];
  let granted: number | null = null;
  if (ctx.dialect.writableCtes) {
    const all = await reclaimAndGrant(trx, grant, report);
    rows = all.filter((r) => Number(r.part) === 0);
    reclaimed = all.filter((r) => Number(r.part) === 1);
    const slot = all.find((r) => Number(r.part) === 2);
    if (slot) granted = Number(slot.token);
  } else ({ reclaimed, rows } = await liveSlots(ctx, trx, name, now, report));
  const lost = reclaimed.map(
    (r): LeaseActRecord => ({
      act: 'lost',
      kind: 'semaphore',
      resource: name,
      holder: r.holder,
      token: Number(r.token),
      detail: { reason: 'reclaimed', expiresAt: Number(r.expires_at), by: { holder } },
    }),
  );
  if (rows.length >= limit) {
    await auditLeaseActs(ctx, trx, now, lost);
    const holders = rows.slice(0, SEMAPHORE_HOLDER_REPORT_LIMIT).map(toHolder);
    return {
      status: 'busy',
      heldBy: { holder: holders[0]!.holder, expiresAt: holders[0]!.expiresAt, limit, count: rows.length, holders },
    };
  }
  const token = granted ?? (await grantSlot(trx, grant));
  await auditLeaseActs(ctx, trx, now, [
    { act: 'granted', kind: 'semaphore', resource: name, holder, token, detail: { limit, expiresAt } },
    ...lost,
  ]);
  return {
    status: 'acquired',
    lease: Object.freeze({ kind: 'semaphore' as const, resource: name, holder, token, expiresAt, limit }),
  };
}

/**
 * `tx.assertLease` for a semaphore slot: its row, read `FOR SHARE` on PostgreSQL, must be live.
 * An acquisition reclaims expired slots by deleting them, so it waits for this transaction.
 */
export const fenceSemaphore: LeaseFence = async (ctx, trx, lease) => {
  const row = await readLeaseRowLocked(
    ctx,
    trx
      .selectFrom('semaphore_holders')
      .select('expires_at')
      .where('name', '=', lease.resource)
      .where('token', '=', lease.token),
  );
  const now = ctx.clock.now();
  if (row && Number(row.expires_at) > now) return;
  throw new SemaphoreLeaseLostError(
    lease.resource,
    lease.token,
    await lostSlotReason(trx, lease.resource, lease.token, lease.expiresAt, now),
  );
};

/**
 * Builds `store.semaphores` on a store context.
 *
 * @example
 * const semaphores = createSemaphoreRepository(createStoreContext(dialect));
 */
/** A slot by its token, for deletion. */
const slotRow = (db: Kysely<Database>, p: { name: string; token: number }) =>
  db.deleteFrom('semaphore_holders').where('name', '=', p.name).where('token', '=', p.token);

const RELEASE_SLOT = prepared((db, p: { name: string; token: number }) => slotRow(db, p).returning('token'));

/** The typed refusal a keyed renew or release stores (a busy acquire is a result). */
const LEASE_REFUSALS = [SemaphoreLeaseLostError];

export function createSemaphoreRepository(ctx: StoreContext): SemaphoreRepository {
  const { dialect } = ctx;

  function checkAcquire(name: string, input: AcquireSemaphoreInput) {
    requireId('name', name);
    requireInput('input', input);
    return {
      holder: requireId('holder', input.holder),
      limit: requireLimit('limit', input.limit, MAX_SEMAPHORE_LIMIT),
      ttlMs: input.ttlMs === undefined ? DEFAULT_SEMAPHORE_TTL_MS : requirePositiveMs('ttlMs', input.ttlMs),
    };
  }

  function checkLease(value: unknown): SemaphoreLease {
    const lease = requireLease('semaphore', value);
    const limit = requireCounter(
      'lease.limit',
      (value as { limit?: unknown }).limit,
      'limit the lease was granted under',
    );
    return extend(lease, { limit });
  }

  return {
    async acquire(name, input) {
      const { holder, limit, ttlMs } = checkAcquire(name, input);
      const call = keyedCall('semaphores.acquire', input, { name, holder, limit, ttlMs }, []);
      return keyedWrite(ctx, call, (trx) => acquireIn(ctx, trx, name, holder, limit, ttlMs), [semaphoreLockKey(name)]);
    },

    async acquireWait(name, input, options) {
      const { holder, limit, ttlMs } = checkAcquire(name, input);
      requireInput('options', options);
      const timeoutMs = requirePositiveMs('timeoutMs', options.timeoutMs, 0);
      const maxPollMs = options.maxPollMs === undefined ? undefined : requirePositiveMs('maxPollMs', options.maxPollMs);
      // A real-time deadline: waiting is a duration, and a test's frozen store clock must not make it endless.
      const deadline = performance.now() + timeoutMs;
      for (;;) {
        // Subscribe before trying: a release committed between the try and the wait still wakes us.
        const wake = dialect.wakeups.subscribe(semaphoreTopic(name), maxPollMs);
        const result = await dialect
          .writeTransaction((trx) => acquireIn(ctx, trx, name, holder, limit, ttlMs), {
            lockKeys: [semaphoreLockKey(name)],
          })
          .catch((error: unknown) => {
            wake.cancel();
            throw error;
          });
        if (result.status === 'acquired') {
          wake.cancel();
          return result.lease;
        }
        const left = deadline - performance.now();
        if (left <= 0) {
          wake.cancel();
          throw new SemaphoreTimeoutError(name, holder, limit, timeoutMs, result.heldBy.holders);
        }
        const deadlineTimer = setTimeout(() => wake.cancel(), clampTimerMs(left));
        await wake.woken;
        clearTimeout(deadlineTimer);
      }
    },

    async renew(value, options) {
      const lease = checkLease(value);
      const opts = options === undefined ? {} : requireInput('options', options);
      const ttlMs = opts.ttlMs === undefined ? DEFAULT_SEMAPHORE_TTL_MS : requirePositiveMs('ttlMs', opts.ttlMs);
      const call = keyedCall('semaphores.renew', opts, { lease, ttlMs }, LEASE_REFUSALS);
      return keyedWrite(ctx, call, async (trx) => {
        const now = ctx.clock.now();
        const row = await trx
          .updateTable('semaphore_holders')
          .set({ expires_at: now + ttlMs })
          .where('name', '=', lease.resource)
          .where('token', '=', lease.token)
          .where('expires_at', '>', now)
          .returning(['holder', 'expires_at'])
          .executeTakeFirst();
        if (row) {
          const renewed = Object.freeze(extend(lease, { holder: row.holder, expiresAt: Number(row.expires_at) }));
          await auditLeaseActs(ctx, trx, now, [
            {
              act: 'renewed',
              kind: 'semaphore',
              resource: renewed.resource,
              holder: renewed.holder,
              token: renewed.token,
              detail: { expiresAt: renewed.expiresAt },
            },
          ]);
          return renewed;
        }
        throw new SemaphoreLeaseLostError(
          lease.resource,
          lease.token,
          await lostSlotReason(trx, lease.resource, lease.token, lease.expiresAt, now),
        );
      });
    },

    async release(value, options?: IdempotencyOptions) {
      const lease = checkLease(value);
      const call = keyedCall('semaphores.release', optionalInput('options', options), { lease }, LEASE_REFUSALS);
      // PostgreSQL announces the release in the deleting statement itself (only if it deleted).
      const announce = dialect.wakeups.notifyExpression(semaphoreTopic(lease.resource));
      // Bound before BEGIN, which sends it (PostgreSQL, one round trip less); prepared without
      // an announcement, compiled per call with one (its topic is a literal of the expression).
      const slot = { name: lease.resource, token: lease.token };
      const deletion: CompiledQuery<{ token: number }> = announce
        ? slotRow(dialect.db, slot)
            .returning(['token', announce.as('announced')])
            .compile()
        : RELEASE_SLOT.bind(dialect.db, slot);
      // Unkeyed and unaudited on PostgreSQL: BEGIN, the deletion and COMMIT in one round trip.
      const once = dialect.writableCtes && call === null && !auditsLeaseAct(ctx, 'released');
      const settle = (rows: readonly unknown[]) => (rows.length > 0 ? { value: undefined } : null);
      await idempotentInOneTrip(ctx, once, deletion, settle, () =>
        keyedWrite(
          ctx,
          call,
          async (trx) => {
            const gone = (dialect.beginResult(deletion) ?? (await runBound(trx, deletion))).rows[0];
            if (gone) {
              await auditLeaseActs(ctx, trx, ctx.clock.now(), [
                {
                  act: 'released',
                  kind: 'semaphore',
                  resource: lease.resource,
                  holder: lease.holder,
                  token: lease.token,
                },
              ]);
              if (!announce) await dialect.wakeups.notify(trx, semaphoreTopic(lease.resource));
              return;
            }
            // The slot is gone: released already, or reclaimed after it lapsed (the lease protocol's
            // release rule). A reclaim takes only a lapsed slot, so while the lease has not lapsed, or
            // while nobody was granted the name after it, a repeat release is a no-op; a lapsed slot
            // followed by a grant of the name may have been taken over: superseded.
            const latest = await latestToken(trx, lease.resource);
            if (lease.token > latest) throw new SemaphoreLeaseLostError(lease.resource, lease.token, 'never_granted');
            if (lease.expiresAt <= ctx.clock.now() && latest > lease.token)
              throw new SemaphoreLeaseLostError(lease.resource, lease.token, 'superseded');
          },
          undefined,
          deletion,
        ),
      );
    },

    async listHolders(name) {
      requireId('name', name);
      const rows = await dialect.db
        .selectFrom('semaphore_holders')
        .select(['holder', 'token', 'expires_at'])
        .where('name', '=', name)
        .where('expires_at', '>', ctx.clock.now())
        .orderBy('expires_at')
        .orderBy('token')
        .execute();
      return rows.map(toHolder);
    },
  };
}
