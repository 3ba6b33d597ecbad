import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { createServer } from 'node:net';
import pg from 'pg';
import { openStore, type Store } from '../../src/index.js';
import { postgresFixture } from '../support/dialects.js';
import { pgbouncerRunsHere, startPgbouncer, throughPooler } from '../support/pgbouncer.js';

/** Effectively never: only a notification can wake the waiter (a missing one fails the test by its timeout). */
const NEVER = 10 * 365 * 24 * 3600_000 - 1;

const runHere = pgbouncerRunsHere('wakeups-pooler.test.ts');

describe.runIf(runHere)('wake-ups through PgBouncer in transaction mode, with listenUrl', () => {
  const fx = postgresFixture();
  let bouncer: Awaited<ReturnType<typeof startPgbouncer>>;
  let direct: string;
  let pooled: string;
  const stores: Store[] = [];
  const open = async (options: Parameters<typeof openStore>[0]) => {
    const store = await openStore(options);
    stores.push(store);
    return store;
  };
  beforeAll(async () => {
    bouncer = await startPgbouncer(inject('pgAdminUrl'));
    direct = await fx.freshUrl();
    await (await fx.open(direct)).migrate();
    pooled = throughPooler(bouncer, direct);
  });
  afterAll(async () => {
    for (const store of stores) await store.close();
    await fx.cleanup();
    await bouncer?.stop();
  });

  /** Until a backend of this database has run the listener's LISTEN and sits idle on it. */
  async function listenerUp(database: string): Promise<void> {
    const admin = new pg.Client({ connectionString: inject('pgAdminUrl') });
    await admin.connect();
    try {
      for (let i = 0; i < 2_000; i++) {
        const { rows } = await admin.query<{ n: number }>(
          `select count(*)::int as n from pg_stat_activity
           where datname = $1 and application_name = 'taskfence-listen' and state = 'idle' and query ilike 'listen %'`,
          [database],
        );
        if (rows[0]!.n > 0) return;
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
      throw new Error('the listening connection never came up');
    } finally {
      await admin.end();
    }
  }

  it(
    'a waiter on a pooled store wakes on the commit of a sender through the pooler, with no fallback polling',
    { timeout: 30_000 },
    async () => {
      const consumer = await open({ url: pooled, listenUrl: direct, wakeFallbackMs: NEVER });
      const sender = await open({ url: pooled });
      const waiting = consumer.messages.waitForMessages('inbox-pooled', { timeoutMs: 600_000 });
      await listenerUp(new URL(direct).pathname.slice(1));
      const sent = await sender.messages.sendMessage({
        allowUnknownRecipient: true,
        from: 'worker',
        to: 'inbox-pooled',
        kind: 'done',
      });
      expect((await waiting).map((m) => m.id)).toEqual([sent.id]);
      // And again on the same listener: its LISTEN is a session of its own, not a pooled server
      // connection some other client now uses.
      const again = consumer.messages.waitForMessages('inbox-pooled', { timeoutMs: 600_000 });
      await new Promise((resolve) => setTimeout(resolve, 100));
      const second = await sender.messages.sendMessage({
        allowUnknownRecipient: true,
        from: 'worker',
        to: 'inbox-pooled',
        kind: 'again',
      });
      expect((await again).map((m) => m.id)).toEqual([second.id]);
    },
  );

  it('refuses a listenUrl that is not PostgreSQL, reaches another database or nothing, and any on SQLite', async () => {
    await expect(openStore({ url: pooled, listenUrl: 'sqlite:./x.db' })).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
      field: 'listenUrl',
    });
    await expect(openStore({ url: pooled, listenUrl: 'not a url' })).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
      field: 'listenUrl',
    });
    const elsewhere = new URL(direct);
    elsewhere.pathname = '/postgres';
    await expect(openStore({ url: pooled, listenUrl: elsewhere.toString() })).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
      field: 'listenUrl',
      reason: expect.stringMatching(
        /reaches database postgres \(server started [^)]+\), the store's is \S+ \(server started [^)]+\): notifications would never arrive/,
      ),
    });
    const port = await new Promise<number>((resolve) => {
      const server = createServer();
      server.listen(0, '127.0.0.1', () => {
        const { port } = server.address() as { port: number };
        server.close(() => resolve(port));
      });
    });
    await expect(
      openStore({ url: pooled, listenUrl: `postgres://postgres@127.0.0.1:${port}/nothing`, connectTimeoutMs: 2_000 }),
    ).rejects.toMatchObject({ code: 'DATABASE_UNAVAILABLE' });
    await expect(openStore({ url: 'sqlite::memory:', listenUrl: direct })).rejects.toMatchObject({
      code: 'INVALID_ARGUMENT',
      field: 'listenUrl',
    });
  });
});
