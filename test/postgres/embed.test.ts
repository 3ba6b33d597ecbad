import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { CamelCasePlugin, Kysely, PostgresDialect } from 'kysely';
import { openStore, type Database as Schema, type Store } from '../../src/index.js';
import { createHostTables, defineEmbedSuite } from '../suites/embed.suite.js';
import { defineHostMigrationSuite } from '../suites/host-migrations.suite.js';
import type { HostTables } from '../suites/embed.ops.js';
import { postgresFixture } from '../support/dialects.js';
import { Contenders } from '../support/race.js';

defineEmbedSuite(postgresFixture);
defineHostMigrationSuite(postgresFixture);

const OPS = fileURLToPath(new URL('../suites/embed.ops.ts', import.meta.url));

describe('PostgreSQL: the host pool and the host transaction', () => {
  const fx = postgresFixture();
  let url: string;
  let pool: pg.Pool;
  let store: Store;
  let ws: string;
  beforeAll(async () => {
    url = await fx.freshUrl();
    pool = new pg.Pool({ connectionString: url, max: 4 });
    store = await openStore({ pool });
    await store.migrate();
    await createHostTables(store);
    const company = await store.org.createCompany({ name: 'Acme' });
    ws = (await store.org.createWorkspace({ companyId: company.id, name: 'main' })).id;
  });
  afterAll(async () => {
    await store?.close();
    await pool?.end();
    await fx.cleanup();
  });

  it('openStore({ pool }) runs on the host pool and leaves it open on close()', async () => {
    const claim = await store.locks.claimWorkspaceLock(ws, { holder: 'p', runId: 'rp', ttlMs: 60_000 });
    // Tokens are numbers even though the host pool parses int8 as strings.
    expect(claim).toEqual({ status: 'claimed', token: 1, expiresAt: expect.any(Number) });
    await store.locks.releaseWorkspaceLock(ws, { token: 1 });
    const second = await openStore({ pool });
    await second.close();
    expect((await pool.query('select 1 as one')).rows).toEqual([{ one: 1 }]);
  });

  it("store.withTransaction joins the host's own Kysely transaction; the host's rollback undoes the claim", async () => {
    // The host's Kysely, with a plugin taskfence must not be affected by.
    const hostDb = new Kysely<HostTables & Schema>({ dialect: new PostgresDialect({ pool }), plugins: [new CamelCasePlugin()] });
    await expect(
      hostDb.transaction().execute(async (trx) => {
        await trx.insertInto('host_orders').values({ id: 'host-tx', contender: 0 }).execute();
        const claim = await store.withTransaction(trx).locks.claimWorkspaceLock(ws, { holder: 'h', runId: 'rh', ttlMs: 60_000 });
        expect(claim).toEqual({ status: 'claimed', token: 2, expiresAt: expect.any(Number) });
        throw new Error('host rollback');
      }),
    ).rejects.toThrow('host rollback');
    expect(await store.locks.getWorkspaceLock(ws)).toBeNull();
    expect(await store.db.withTables<HostTables>().selectFrom('host_orders').selectAll().where('id', '=', 'host-tx').execute()).toEqual([]);
    await hostDb.transaction().execute(async (trx) => {
      await trx.insertInto('host_orders').values({ id: 'host-tx', contender: 0 }).execute();
      await store.withTransaction(trx).locks.claimWorkspaceLock(ws, { holder: 'h', runId: 'rh', ttlMs: 60_000 });
    });
    expect(await store.locks.getWorkspaceLock(ws)).toMatchObject({ holder: 'h', token: 2 });
    expect(await store.db.withTables<HostTables>().selectFrom('host_orders').select('id').where('id', '=', 'host-tx').execute()).toHaveLength(1);
    // Not hostDb.destroy(): that would end the pool, which belongs to the host (ended in afterAll).
  });
});

describe('PostgreSQL: resource locks on disjoint boxes are held at the same time', () => {
  const fx = postgresFixture();
  let contenders: Contenders;
  let store: Store;
  beforeAll(async () => {
    const url = await fx.freshUrl();
    store = await fx.open(url);
    await store.migrate();
    await createHostTables(store);
    contenders = await Contenders.start(2, { url, module: OPS, storeOptions: { poolSize: 3 } });
  });
  afterAll(async () => {
    await contenders?.close();
    await fx.cleanup();
  });

  it('two transactions on different boxes both hold their lock while the other does', async () => {
    const outcomes = await contenders.race<boolean>('holdAndMeet', (i) => ({
      box: `box:${i}`,
      me: `disjoint-${i}`,
      partner: `disjoint-${1 - i}`,
      giveUpMs: 20_000,
    }));
    expect(outcomes.map((o) => (o.ok ? o.value : o.error.message))).toEqual([true, true]);
  });

  it('(control) on one box they cannot meet: the second waits for the first to commit', async () => {
    const outcomes = await contenders.race<boolean>('holdAndMeet', (i) => ({
      box: 'box:same',
      me: `same-${i}`,
      partner: `same-${1 - i}`,
      giveUpMs: 1_000,
    }));
    expect(outcomes.map((o) => (o.ok ? o.value : o.error.message)).sort()).toEqual([false, true]);
  });
});
