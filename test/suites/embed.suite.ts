/**
 * Embedding (issue 14) on one dialect: host transactions shared with taskfence's repositories
 * (`store.transaction`, `store.withTransaction`), named resource locks (`tx.lockResources`), and
 * the multi-process races that prove commit/rollback atomicity and per-resource exclusion.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from 'kysely';
import {
  InvalidArgumentError,
  TaskfenceError,
  TransactionAbortedError,
  TransactionEndedError,
  type Store,
  type StoreTransaction,
} from '../../src/index.js';
import type { DialectFixture } from '../support/fixtures.js';
import { Contenders } from '../support/race.js';
import type { HostTables } from './embed.ops.js';
import { ops as OPS } from './embed.ops.js';

const CONTENDERS = 8;

/** The host's own tables, created after taskfence's migrations in the same database (and schema). */
export async function createHostTables(store: Store): Promise<void> {
  const db = store.db.withTables<HostTables>();
  await db.schema
    .createTable('host_orders')
    .ifNotExists()
    .addColumn('id', 'text', (c) => c.primaryKey())
    .addColumn('contender', 'integer', (c) => c.notNull())
    .execute();
  await db.schema
    .createTable('box_log')
    .ifNotExists()
    .addColumn('seq', store.dialect.kind === 'postgres' ? 'serial' : 'integer', (c) => c.primaryKey())
    .addColumn('box', 'text', (c) => c.notNull())
    .addColumn('owner', 'text', (c) => c.notNull())
    .addColumn('event', 'text', (c) => c.notNull())
    .execute();
  await db.schema
    .createTable('rendezvous')
    .ifNotExists()
    .addColumn('name', 'text', (c) => c.primaryKey())
    .execute();
}

const host = (tx: StoreTransaction | Store) => tx.db.withTables<HostTables>();

async function seedWorkspace(store: Store, id: string): Promise<string> {
  const company = await store.org.createCompany({ id: `${id}-co`, name: 'Acme' });
  return (await store.org.createWorkspace({ id, companyId: company.id, name: 'main' })).id;
}

/** Every holder's enter/exit rows for each box, in commit order, must come in unbroken pairs. */
export function interleavings(log: readonly { box: string; owner: string; event: string }[]): string[] {
  const problems: string[] = [];
  const open = new Map<string, string>();
  for (const row of log) {
    const holder = open.get(row.box);
    if (row.event === 'enter') {
      if (holder !== undefined) problems.push(`${row.owner} entered ${row.box} while ${holder} was inside`);
      open.set(row.box, row.owner);
    } else {
      if (holder !== row.owner) problems.push(`${row.owner} left ${row.box} held by ${holder ?? 'nobody'}`);
      open.delete(row.box);
    }
  }
  for (const [box, owner] of open) problems.push(`${owner} never left ${box}`);
  return problems;
}

export function defineEmbedSuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  let store: Store;
  let n = 0;
  const fresh = () => seedWorkspace(store, `ws-${++n}`);
  beforeAll(async () => {
    fx = makeFixture();
    store = await fx.freshStore();
    await createHostTables(store);
  });
  afterAll(() => fx.cleanup());

  describe('store.transaction', () => {
    it('commits the host insert and the claim together', async () => {
      const ws = await fresh();
      const token = await store.transaction(async (tx) => {
        await host(tx)
          .insertInto('host_orders')
          .values({ id: `${ws}:a`, contender: 1 })
          .execute();
        const claim = await tx.locks.claimWorkspaceLock(ws, { holder: 'h', runId: 'r', ttlMs: 60_000 });
        if (claim.status !== 'acquired') throw new Error('expected a claim');
        // Inside, the transaction's own reads see its writes.
        expect(await tx.locks.getWorkspaceLock(ws)).toMatchObject({ holder: 'h', token: claim.lease.token });
        return claim.lease.token;
      });
      expect(token).toBe(1);
      expect(await store.locks.getWorkspaceLock(ws)).toMatchObject({ holder: 'h', token: 1 });
      expect(
        await host(store).selectFrom('host_orders').select('id').where('id', '=', `${ws}:a`).execute(),
      ).toHaveLength(1);
    });

    it('a thrown callback leaves neither the host row nor the claim', async () => {
      const ws = await fresh();
      await expect(
        store.transaction(async (tx) => {
          await host(tx)
            .insertInto('host_orders')
            .values({ id: `${ws}:b`, contender: 1 })
            .execute();
          await tx.locks.claimWorkspaceLock(ws, { holder: 'h', runId: 'r', ttlMs: 60_000 });
          throw new Error('host failure');
        }),
      ).rejects.toThrow('host failure');
      expect(await store.locks.getWorkspaceLock(ws)).toBeNull();
      expect(await host(store).selectFrom('host_orders').select('id').where('id', '=', `${ws}:b`).execute()).toEqual(
        [],
      );
      // The lock is free for the next claimer, with token 1: the rolled-back claim left no trace.
      expect(await store.locks.claimWorkspaceLock(ws, { holder: 'k', runId: 'rk', ttlMs: 60_000 })).toMatchObject({
        status: 'acquired',
        lease: { token: 1 },
      });
    });

    it('a taskfence call that fails inside undoes only its own writes; the host may go on and commit', async () => {
      const ws = await fresh();
      await store.transaction(async (tx) => {
        await host(tx)
          .insertInto('host_orders')
          .values({ id: `${ws}:c`, contender: 1 })
          .execute();
        // A foreign-key violation: a failed statement (NotFoundError or the driver's error).
        await expect(tx.org.createWorkspace({ companyId: 'no-such-company', name: 'x' })).rejects.toThrow();
        // On PostgreSQL the failed statement would abort the whole transaction without the call's savepoint.
        await tx.locks.claimWorkspaceLock(ws, { holder: 'h', runId: 'r', ttlMs: 60_000 });
      });
      expect(await store.locks.getWorkspaceLock(ws)).toMatchObject({ holder: 'h' });
      expect(
        await host(store).selectFrom('host_orders').select('id').where('id', '=', `${ws}:c`).execute(),
      ).toHaveLength(1);
    });

    it('concurrent calls on one transaction run one after another', async () => {
      const a = await fresh();
      const b = await fresh();
      const claims = await store.transaction((tx) =>
        Promise.all(
          [a, b, a].map((ws, i) => tx.locks.claimWorkspaceLock(ws, { holder: `h${i}`, runId: `r${i}`, ttlMs: 60_000 })),
        ),
      );
      expect(claims.map((c) => c.status)).toEqual(['acquired', 'acquired', 'busy']);
    });

    it('a swallowed statement error is reported typed at COMMIT (TRANSACTION_ABORTED on PostgreSQL)', async () => {
      const swallowing = store.transaction(async (tx) => {
        await sql`select * from ${sql.table('no_such_host_table')}`.execute(tx.db).catch(() => {});
        return 'returned';
      });
      if (store.dialect.kind === 'postgres') {
        await expect(swallowing).rejects.toBeInstanceOf(TransactionAbortedError);
        await expect(swallowing).rejects.toMatchObject({ code: 'TRANSACTION_ABORTED' });
        await expect(swallowing).rejects.toBeInstanceOf(TaskfenceError);
      } else {
        expect(await swallowing).toBe('returned'); // SQLite does not abort a transaction on a failed statement
      }
    });

    it('refuses use of tx after the transaction ended', async () => {
      const ws = await fresh();
      const tx = await store.transaction(async (t) => t);
      await expect(tx.locks.claimWorkspaceLock(ws, { holder: 'h', runId: 'r', ttlMs: 1000 })).rejects.toBeInstanceOf(
        TransactionEndedError,
      );
      await expect(host(tx).selectFrom('host_orders').selectAll().execute()).rejects.toBeInstanceOf(
        TransactionEndedError,
      );
    });
  });

  describe('store.withTransaction', () => {
    it('joins the tx.db of store.transaction', async () => {
      const ws = await fresh();
      await expect(
        store.transaction(async (tx) => {
          await store.withTransaction(tx.db).locks.claimWorkspaceLock(ws, { holder: 'h', runId: 'r', ttlMs: 60_000 });
          throw new Error('undo');
        }),
      ).rejects.toThrow('undo');
      expect(await store.locks.getWorkspaceLock(ws)).toBeNull();
    });

    it('refuses something that is not a transaction', () => {
      expect(() => store.withTransaction({} as never)).toThrow(
        expect.objectContaining({ code: 'FOREIGN_TRANSACTION' }),
      );
    });
  });

  describe('tx.lockResources', () => {
    it('takes names in canonical order, once each, and reports them', async () => {
      const held = await store.transaction(async (tx) => {
        await tx.lockResources(['box:b', 'box:a', 'box:b']);
        await tx.lockResources(['box:a']); // already held: a no-op
        await tx.lockResources([]);
        return tx.heldResources;
      });
      expect(held).toEqual(['box:a', 'box:b']);
    });

    it('validates names', async () => {
      await store.transaction(async (tx) => {
        await expect(tx.lockResources([''])).rejects.toBeInstanceOf(InvalidArgumentError);
        await expect(tx.lockResources(['a\0b'])).rejects.toBeInstanceOf(InvalidArgumentError);
        await expect(tx.lockResources('box:a' as never)).rejects.toBeInstanceOf(InvalidArgumentError);
        await expect(tx.lockResources([1 as never])).rejects.toBeInstanceOf(InvalidArgumentError);
        expect(tx.heldResources).toEqual([]);
      });
    });
  });

  describe('races (separate processes)', () => {
    let url: string;
    let contenders: Contenders<typeof OPS>;
    let raceStore: Store;
    beforeAll(async () => {
      url = await fx.freshUrl();
      raceStore = await fx.open(url);
      await raceStore.migrate();
      await createHostTables(raceStore);
      contenders = await Contenders.start(CONTENDERS, { url, ops: OPS, storeOptions: { poolSize: 3 } });
    });
    afterAll(() => contenders?.close());

    it('many host transactions claiming one lock: exactly one commits its insert and its claim', async () => {
      for (let round = 0; round < 5; round++) {
        const ws = await seedWorkspace(raceStore, `race-${round}`);
        const outcomes = await contenders.race('orderAndClaim', () => ({ workspaceId: ws }));
        for (const o of outcomes) if (!o.ok) throw new Error(`contender ${o.index}: ${o.error.message}`);
        const winners = outcomes.filter((o) => o.ok && o.value.committed).map((o) => o.index);
        expect(winners).toHaveLength(1);
        const rows = await host(raceStore)
          .selectFrom('host_orders')
          .select(['id', 'contender'])
          .where('id', 'like', `${ws}:%`)
          .execute();
        expect(rows).toEqual([{ id: `${ws}:${winners[0]}`, contender: winners[0] }]);
        expect(await raceStore.locks.getWorkspaceLock(ws)).toMatchObject({ holder: `c${winners[0]}`, token: 1 });
      }
    });

    it('host transactions that throw after claiming leave neither insert nor claim', async () => {
      const ws = await seedWorkspace(raceStore, 'race-fail');
      const outcomes = await contenders.race('orderAndClaim', () => ({
        workspaceId: ws,
        fail: true,
      }));
      for (const o of outcomes) if (!o.ok) throw new Error(`contender ${o.index}: ${o.error.message}`);
      expect(outcomes.every((o) => o.ok && !o.value.committed)).toBe(true);
      expect(
        await host(raceStore).selectFrom('host_orders').select('id').where('id', 'like', `${ws}:%`).execute(),
      ).toEqual([]);
      expect(await raceStore.locks.getWorkspaceLock(ws)).toBeNull();
      expect(
        await raceStore.db.selectFrom('workspace_locks').selectAll().where('workspace_id', '=', ws).execute(),
      ).toEqual([]);
    });

    it('writers of overlapping boxes in random order never deadlock and never interleave on a box', async () => {
      const boxes = ['box:a', 'box:b', 'box:c', 'box:d', 'box:e'];
      const rounds = 6;
      const outcomes = await contenders.race('writeBoxes', () => ({
        boxes,
        rounds,
      }));
      for (const o of outcomes) if (!o.ok) throw new Error(`contender ${o.index}: ${o.error.message}`);
      expect(outcomes.map((o) => (o.ok ? o.value.committed : 0))).toEqual(Array(CONTENDERS).fill(rounds));
      // On PostgreSQL a lock-order deadlock would be detected (40P01) and retried: none happened.
      // (SQLite retries SQLITE_BUSY between writers, which is no deadlock.)
      if (fx.kind === 'postgres')
        expect(outcomes.map((o) => (o.ok ? o.value.retries : -1))).toEqual(Array(CONTENDERS).fill(0));
      const log = await host(raceStore)
        .selectFrom('box_log')
        .select(['box', 'owner', 'event'])
        .orderBy('seq')
        .execute();
      expect(log.length).toBeGreaterThan(0);
      expect(interleavings(log)).toEqual([]);
    });
  });
}
