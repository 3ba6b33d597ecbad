/** Contender operations for the embedding suite (run in child processes by the race helper). */
import type { Generated } from 'kysely';
import type { Store, StoreTransaction } from '../../src/index.js';
import type { ContenderTools } from '../support/contender.js';
import { defineOperations } from '../support/operations.js';

/** The host's own tables in these tests (created by `createHostTables`). */
export type HostTables = {
  host_orders: { id: string; contender: number };
  box_log: { seq: Generated<number>; box: string; owner: string; event: string };
  rendezvous: { name: string };
};

const host = (tx: StoreTransaction) => tx.db.withTables<HostTables>();

/** Thrown to roll a transaction back on purpose. */
class Rollback extends Error {}

/**
 * One host transaction: the host's own insert plus a claim of `workspaceId`'s lock. Commits only
 * if the claim was granted; `fail` makes the callback throw after both writes.
 */
export async function orderAndClaim(
  store: Store,
  args: { workspaceId: string; fail?: boolean },
  tools: ContenderTools,
) {
  try {
    return await store.transaction(async (tx) => {
      await host(tx)
        .insertInto('host_orders')
        .values({ id: `${args.workspaceId}:${tools.index}`, contender: tools.index })
        .execute();
      const claim = await tx.locks.claimWorkspaceLock(args.workspaceId, {
        holder: `c${tools.index}`,
        runId: `r${tools.index}`,
        ttlMs: 600_000,
      });
      if (claim.status !== 'acquired') throw new Rollback('busy');
      if (args.fail) throw new Rollback('failed after both writes');
      return { committed: true, token: claim.lease.token };
    });
  } catch (error) {
    if (error instanceof Rollback) return { committed: false, reason: error.message };
    throw error;
  }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

function shuffled<T>(items: readonly T[]): T[] {
  const out = [...items];
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [out[i], out[j]] = [out[j]!, out[i]!];
  }
  return out;
}

/**
 * `rounds` transactions, each locking a random subset of `boxes` (in random order: lockResources
 * must sort them) and logging an enter and an exit row per box with pauses in between: if two
 * holders of one box ever overlapped, their rows interleave in `box_log`'s sequence.
 */
export async function writeBoxes(store: Store, args: { boxes: string[]; rounds: number }, tools: ContenderTools) {
  let committed = 0;
  const retriesBefore = store.dialect.stats.retries;
  for (let round = 0; round < args.rounds; round++) {
    const chosen = shuffled(args.boxes).slice(0, 1 + Math.floor(Math.random() * 3));
    const owner = `c${tools.index}:${round}`;
    await store.transaction(async (tx) => {
      await tx.lockResources(shuffled(chosen));
      for (const box of shuffled(chosen)) {
        await host(tx).insertInto('box_log').values({ box, owner, event: 'enter' }).execute();
        await sleep(Math.random() * 2);
        await host(tx).insertInto('box_log').values({ box, owner, event: 'exit' }).execute();
      }
    });
    committed++;
  }
  // PostgreSQL retries a transaction only on a deadlock or serialization failure: none may happen.
  return { committed, retries: store.dialect.stats.retries - retriesBefore };
}

/**
 * PostgreSQL: holds `box` and waits (outside the transaction, on another connection) until
 * `partner` says it holds its own box too. Returns whether both were held at once; gives up
 * after `giveUpMs`, which only happens if the two locks exclude each other.
 */
export async function holdAndMeet(store: Store, args: { box: string; me: string; partner: string; giveUpMs: number }) {
  return store.transaction(async (tx) => {
    await tx.lockResources([args.box]);
    await store.db.withTables<HostTables>().insertInto('rendezvous').values({ name: args.me }).execute();
    const started = Date.now();
    while (Date.now() - started < args.giveUpMs) {
      const seen = await store.db
        .withTables<HostTables>()
        .selectFrom('rendezvous')
        .select('name')
        .where('name', '=', args.partner)
        .executeTakeFirst();
      if (seen) return true;
      await sleep(10);
    }
    return false;
  });
}

/** The operations this module's contenders run (see test/support/operations.ts). */
export const ops = defineOperations(import.meta.url, { orderAndClaim, writeBoxes, holdAndMeet });
