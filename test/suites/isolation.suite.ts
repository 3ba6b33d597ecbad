import { afterAll, beforeAll, expect, it } from 'vitest';
import pg from 'pg';
import type { Store } from '../../src/index.js';
import type { DialectFixture } from '../support/fixtures.js';

/**
 * The write path's isolation, on a PostgreSQL database whose `default_transaction_isolation` a DBA
 * changed (`makeFixture` creates such databases): taskfence's write transactions state READ
 * COMMITTED in their own BEGIN, so a lease check after an advisory-lock wait still sees what the
 * lock's previous holder committed.
 */
export function defineIsolationSuite(makeFixture: () => DialectFixture, defaultIsolation: string) {
  let fx: DialectFixture;
  let url: string;
  let store: Store;
  let companyId: string;
  let n = 0;
  beforeAll(async () => {
    fx = makeFixture();
    url = await fx.freshUrl();
    store = await fx.open(url);
    await store.migrate();
    companyId = (await store.org.createCompany({ name: 'acme' })).id;
  });
  afterAll(() => fx.cleanup());

  /** Polls until a taskfence session of this database waits on a lock (not a timed assertion). */
  async function waitUntilBlocked(): Promise<void> {
    const admin = new pg.Client({ connectionString: url.replace(/\?.*$/, '') });
    await admin.connect();
    try {
      for (let i = 0; i < 2000; i++) {
        const { rows } = await admin.query<{ n: number }>(
          `select count(*)::int as n from pg_stat_activity where application_name = 'taskfence' and wait_event_type = 'Lock' and datname = current_database()`,
        );
        if (rows[0]!.n > 0) return;
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
      throw new Error('the second acquire never blocked on the workspace path lock');
    } finally {
      await admin.end();
    }
  }

  it(`the database really defaults to ${defaultIsolation}, and taskfence's sessions inherit it`, async () => {
    const rows = await store.db
      .selectNoFrom((eb) => eb.fn<string>('current_setting', [eb.val('default_transaction_isolation')]).as('level'))
      .execute();
    expect(rows[0]!.level).toBe(defaultIsolation);
  });

  it('every write transaction begins READ COMMITTED in the BEGIN round trip, and reads state their level', async () => {
    const begins: string[] = [];
    const watched = await fx.open(url, { onQuery: (q) => begins.push(q.sql) });
    const ws = (await watched.org.createWorkspace({ companyId, name: `ws-${++n}` })).id;
    await watched.paths.tryAcquirePaths({ workspaceId: ws, holder: 'h', paths: ['a'], ttlMs: 60_000 });
    await watched.transaction(async (tx) =>
      tx.locks.claimWorkspaceLock(ws, { holder: 'h', runId: 'r', ttlMs: 60_000 }),
    );
    await watched.migrationStatus();
    const transactionStarts = begins.filter((s) => /^begin\b/i.test(s));
    expect(transactionStarts.length).toBeGreaterThanOrEqual(4);
    for (const begin of transactionStarts) {
      expect(begin).toMatch(/^begin isolation level (read committed|repeatable read read only); select set_config\(/);
    }
    expect(transactionStarts.some((s) => s.startsWith('begin isolation level read committed;'))).toBe(true);
    expect(transactionStarts.some((s) => s.startsWith('begin isolation level repeatable read read only;'))).toBe(true);
  });

  it('a path acquired after waiting for a host transaction that leased its parent is refused, not granted', async () => {
    const ws = (await store.org.createWorkspace({ companyId, name: `ws-${++n}` })).id;
    const other = await fx.open(url);
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let acquiredInside!: () => void;
    const inside = new Promise<void>((resolve) => (acquiredInside = resolve));
    // Store A leases `src` inside a transaction that stays open (it holds the workspace's path lock).
    const a = store.transaction(async (tx) => {
      const r = await tx.paths.tryAcquirePaths({ workspaceId: ws, holder: 'A', paths: ['src'], ttlMs: 600_000 });
      acquiredInside();
      await held;
      return r;
    });
    await inside;
    // Store B asks for `src/a.ts`: it waits for the path lock, then must see A's committed lease.
    const b = other.paths.tryAcquirePaths({ workspaceId: ws, holder: 'B', paths: ['src/a.ts'], ttlMs: 600_000 });
    await waitUntilBlocked();
    release();
    expect((await a).acquired).toBe(true);
    expect(await b).toMatchObject({ acquired: false, conflicts: [{ key: 'src', holder: 'A' }] });
  });
}
