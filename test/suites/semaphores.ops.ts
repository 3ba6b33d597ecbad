/** Contender operations for the semaphore suite (run in child processes by the race helper). */
import type { Store } from '../../src/index.js';
import type { ContenderTools } from '../support/contender.js';
import { defineOperations } from '../support/operations.js';

/** The host's own table: one row per slot being used right now. */
export type SemaphoreHostTables = { sem_inside: { name: string; token: number; holder: string } };

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Until it got `rounds` slots: acquire a slot of `name` (limit `limit`); while holding it, mark the slot in the
 * host table, count the marked slots, hold a moment, unmark and release. Round 0 of an
 * `abandon` contender acquires with a short TTL and never releases (a crashed holder), so the
 * others only get its slot back by reclaiming it after expiry. Returns the largest count seen.
 */
export async function useSlots(
  store: Store,
  args: { name: string; limit: number; rounds: number; abandon: boolean; holdMs: number },
  tools: ContenderTools,
) {
  const holder = `c${tools.index}`;
  let maxSeen = 0;
  let acquired = 0;
  let busy = 0;
  for (let attempt = 0; acquired < args.rounds; attempt++) {
    if (attempt > 20_000) throw new Error(`${holder} got only ${acquired} slots`);
    if (attempt === 0 && args.abandon) {
      const claim = await store.semaphores.acquireWait(
        args.name,
        { holder, limit: args.limit, ttlMs: 150 },
        { timeoutMs: 30_000, maxPollMs: 20 },
      );
      acquired++;
      void claim; // abandoned: never released, reclaimed once expired
      continue;
    }
    const claim = await store.semaphores.acquire(args.name, { holder, limit: args.limit, ttlMs: 60_000 });
    if (claim.status === 'busy') {
      busy++;
      if (claim.heldBy.count < args.limit) throw new Error(`busy below the limit: ${JSON.stringify(claim.heldBy)}`);
      await sleep(2);
      continue;
    }
    acquired++;
    // The host's writes go through store.transaction, as a host's should: on SQLite a busy file
    // is waited out by the write transaction's retry loop (a bare store.db write under 8 writers
    // on a loaded machine can exceed busy_timeout and fail with SQLITE_BUSY).
    const seen = await store.transaction(async (tx) => {
      const host = tx.db.withTables<SemaphoreHostTables>();
      await host.insertInto('sem_inside').values({ name: args.name, token: claim.lease.token, holder }).execute();
      const row = await host
        .selectFrom('sem_inside')
        .select((eb) => eb.fn.countAll<number | string>().as('n'))
        .where('name', '=', args.name)
        .executeTakeFirstOrThrow();
      return Number(row.n);
    });
    maxSeen = Math.max(maxSeen, seen);
    await sleep(args.holdMs);
    await store.transaction((tx) =>
      tx.db
        .withTables<SemaphoreHostTables>()
        .deleteFrom('sem_inside')
        .where('name', '=', args.name)
        .where('token', '=', claim.lease.token)
        .execute(),
    );
    await store.semaphores.release(claim.lease);
  }
  return { maxSeen, acquired, busy };
}

/** Waits for a slot (no fallback poll to speak of: only a release wakes it), signals first. */
export async function waitForSlot(store: Store, args: { name: string; limit: number }, tools: ContenderTools) {
  tools.signal(`waiting:${args.name}`);
  const lease = await store.semaphores.acquireWait(
    args.name,
    { holder: `w${tools.index}`, limit: args.limit, ttlMs: 60_000 },
    { timeoutMs: 60_000, maxPollMs: 600_000 },
  );
  await store.semaphores.release(lease);
  return lease.token;
}

export const ops = defineOperations(import.meta.url, { useSlots, waitForSlot });
