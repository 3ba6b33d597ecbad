import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import Database from 'better-sqlite3';
import { Kysely, SqliteDialect } from 'kysely';
import {
  ForeignTransactionError,
  TransactionReentryError,
  type Database as Schema,
  type Store,
} from '../../src/index.js';
import { createHostTables, defineEmbedSuite } from '../suites/embed.suite.js';
import { defineHostMigrationSuite } from '../suites/host-migrations.suite.js';
import type { HostTables } from '../suites/embed.ops.js';
import { sqliteFixture } from '../support/dialects.js';

defineEmbedSuite(sqliteFixture);
defineHostMigrationSuite(sqliteFixture);

/** Settles `promise`, or reports that it was still pending after the event loop went idle for a while. */
async function settleOrHang<T>(
  promise: Promise<T>,
): Promise<{ settled: true; value?: T; error?: unknown } | { settled: false }> {
  const hang = new Promise<{ settled: false }>((resolve) => setTimeout(() => resolve({ settled: false }), 2000));
  return Promise.race([
    promise.then(
      (value) => ({ settled: true as const, value }),
      (error: unknown) => ({ settled: true as const, error }),
    ),
    hang,
  ]);
}

describe('SQLite: calls that would wait for their own connection throw instead of hanging', () => {
  const fx = sqliteFixture();
  let store: Store;
  let ws: string;
  beforeAll(async () => {
    store = await fx.freshStore();
    await createHostTables(store);
    const company = await store.org.createCompany({ name: 'Acme' });
    ws = (await store.org.createWorkspace({ companyId: company.id, name: 'main' })).id;
  });
  afterAll(() => fx.cleanup());

  it('a store call inside store.db.transaction()', async () => {
    const outcome = await settleOrHang(
      store.db
        .transaction()
        .execute(() => store.locks.claimWorkspaceLock(ws, { holder: 'h', runId: 'r', ttlMs: 1000 })),
    );
    expect(outcome).toMatchObject({ settled: true, error: expect.any(TransactionReentryError) });
    expect(await store.locks.getWorkspaceLock(ws)).toBeNull();
  });

  it('a non-tx store call or a store.db query inside store.transaction', async () => {
    const claim = await settleOrHang(
      store.transaction(() => store.locks.claimWorkspaceLock(ws, { holder: 'h', runId: 'r', ttlMs: 1000 })),
    );
    expect(claim).toMatchObject({ settled: true, error: expect.any(TransactionReentryError) });
    const read = await settleOrHang(store.transaction(() => store.db.selectFrom('tasks').selectAll().execute()));
    expect(read).toMatchObject({ settled: true, error: expect.any(TransactionReentryError) });
    // The store still works afterwards.
    expect(await store.locks.claimWorkspaceLock(ws, { holder: 'h', runId: 'r', ttlMs: 1000 })).toMatchObject({
      status: 'acquired',
    });
    await store.locks.releaseWorkspaceLock(ws, { token: 1 });
  });

  it('work a callback leaves running may wait normally after it ends', async () => {
    let later: Promise<unknown> | undefined;
    await store.transaction(async () => {
      later = new Promise((resolve) => setTimeout(resolve, 20)).then(() => store.locks.getWorkspaceLock(ws));
    });
    await expect(later).resolves.toBeNull();
  });

  it('store.withTransaction joins store.db.transaction(); a rollback undoes the claim and the host row', async () => {
    await expect(
      store.db.transaction().execute(async (trx) => {
        await trx.withTables<HostTables>().insertInto('host_orders').values({ id: 'joined', contender: 0 }).execute();
        const claim = await store
          .withTransaction(trx)
          .locks.claimWorkspaceLock(ws, { holder: 'j', runId: 'rj', ttlMs: 60_000 });
        expect(claim).toMatchObject({ status: 'acquired' });
        throw new Error('host rollback');
      }),
    ).rejects.toThrow('host rollback');
    expect(await store.locks.getWorkspaceLock(ws)).toBeNull();
    expect(
      await store.db
        .withTables<HostTables>()
        .selectFrom('host_orders')
        .selectAll()
        .where('id', '=', 'joined')
        .execute(),
    ).toEqual([]);
    await store.db.transaction().execute(async (trx) => {
      await store.withTransaction(trx).locks.claimWorkspaceLock(ws, { holder: 'j', runId: 'rj', ttlMs: 60_000 });
    });
    expect(await store.locks.getWorkspaceLock(ws)).toMatchObject({ holder: 'j' });
  });

  it('refuses a transaction of another connection, and one used outside its callback', async () => {
    const other = new Kysely<Schema>({
      dialect: new SqliteDialect({
        database: new Database(store.location.dialect === 'sqlite' ? store.location.filename : ''),
      }),
    });
    try {
      await other.transaction().execute(async (trx) => {
        expect(() => store.withTransaction(trx)).toThrow(ForeignTransactionError);
      });
    } finally {
      await other.destroy();
    }
    let escaped: unknown;
    await store.db.transaction().execute(async (trx) => void (escaped = trx));
    expect(() => store.withTransaction(escaped as never)).toThrow(ForeignTransactionError);
  });
});
