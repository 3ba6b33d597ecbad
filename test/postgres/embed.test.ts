import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import { CamelCasePlugin, Kysely, PostgresDialect } from 'kysely';
import {
  ForeignTransactionError,
  InvalidArgumentError,
  InvalidDatabaseUrlError,
  LATEST_VERSION,
  openStore,
  parseDatabaseUrl,
  type Database as Schema,
  type Store,
  type StoreTransaction,
} from '../../src/index.js';
import { createHostTables, defineEmbedSuite } from '../suites/embed.suite.js';
import { defineHostMigrationSuite } from '../suites/host-migrations.suite.js';
import type { HostTables } from '../suites/embed.ops.js';
import { postgresFixture } from '../support/dialects.js';
import { Contenders } from '../support/race.js';
import { ops as OPS } from '../suites/embed.ops.js';

defineEmbedSuite(postgresFixture);
defineHostMigrationSuite(postgresFixture);

describe('PostgreSQL: the host pool and the host transaction', () => {
  const fx = postgresFixture();
  let url: string;
  let pool: pg.Pool;
  let store: Store;
  let ws: string;
  beforeAll(async () => {
    url = await fx.freshUrl();
    pool = new pg.Pool({ connectionString: url, max: 4 });
    // As every host's pool must have (pg's docs): taskfence listens only while a store is open, and
    // pg-pool's end() resolves before its clients' sockets close, so the fixture's
    // DROP DATABASE … WITH (FORCE) at cleanup can still reach one of them after store.close().
    pool.on('error', () => {});
    store = await openStore({ pool, url }); // the url only for its ?schema= (TEST_PG_SCHEMA); the pool is what connects
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
    expect(claim).toEqual({
      status: 'acquired',
      lease: expect.objectContaining({ token: 1, expiresAt: expect.any(Number) }),
    });
    await store.locks.releaseWorkspaceLock(ws, { token: 1 });
    const second = await openStore({ pool, url });
    await second.close();
    expect((await pool.query('select 1 as one')).rows).toEqual([{ one: 1 }]);
  });

  it("store.withTransaction joins the host's own Kysely transaction; the host's rollback undoes the claim", async () => {
    // The host's Kysely, with a plugin taskfence must not be affected by.
    const plain = new Kysely<HostTables & Schema>({
      dialect: new PostgresDialect({ pool }),
      plugins: [new CamelCasePlugin()],
    });
    // The host's tables of this test live beside taskfence's (in TEST_PG_SCHEMA when set).
    const schema = store.location.dialect === 'postgres' ? store.location.schema : undefined;
    const hostDb = schema === undefined ? plain : plain.withSchema(schema);
    await expect(
      hostDb.transaction().execute(async (trx) => {
        await trx.insertInto('host_orders').values({ id: 'host-tx', contender: 0 }).execute();
        const claim = await store
          .withTransaction(trx)
          .locks.claimWorkspaceLock(ws, { holder: 'h', runId: 'rh', ttlMs: 60_000 });
        expect(claim).toEqual({
          status: 'acquired',
          lease: expect.objectContaining({ token: 2, expiresAt: expect.any(Number) }),
        });
        throw new Error('host rollback');
      }),
    ).rejects.toThrow('host rollback');
    expect(await store.locks.getWorkspaceLock(ws)).toBeNull();
    expect(
      await store.db
        .withTables<HostTables>()
        .selectFrom('host_orders')
        .selectAll()
        .where('id', '=', 'host-tx')
        .execute(),
    ).toEqual([]);
    await hostDb.transaction().execute(async (trx) => {
      await trx.insertInto('host_orders').values({ id: 'host-tx', contender: 0 }).execute();
      await store.withTransaction(trx).locks.claimWorkspaceLock(ws, { holder: 'h', runId: 'rh', ttlMs: 60_000 });
      // The host's connection parses int8 as strings; taskfence's results still carry numbers.
      const read = await store.withTransaction(trx).org.getWorkspace(ws);
      expect(typeof read?.createdAt).toBe('number');
    });
    expect(await store.locks.getWorkspaceLock(ws)).toMatchObject({ holder: 'h', token: 2 });
    expect(
      await store.db
        .withTables<HostTables>()
        .selectFrom('host_orders')
        .select('id')
        .where('id', '=', 'host-tx')
        .execute(),
    ).toHaveLength(1);
    // Not hostDb.destroy(): that would end the pool, which belongs to the host (ended in afterAll).
  });
});

describe('PostgreSQL: a host transaction joins only at READ COMMITTED (the database defaults to REPEATABLE READ)', () => {
  const fx = postgresFixture({ defaultIsolation: 'repeatable read' });
  let store: Store;
  let ws: string;
  beforeAll(async () => {
    store = await fx.open(await fx.freshUrl());
    await store.migrate();
    const company = await store.org.createCompany({ name: 'Acme' });
    ws = (await store.org.createWorkspace({ companyId: company.id, name: 'main' })).id;
  });
  afterAll(() => fx.cleanup());

  const claim = (tx: StoreTransaction) => tx.locks.claimWorkspaceLock(ws, { holder: 'h', runId: 'r', ttlMs: 60_000 });

  it.each([
    ['the default (REPEATABLE READ here)', undefined, 'REPEATABLE READ'],
    ['SERIALIZABLE', 'serializable', 'SERIALIZABLE'],
    ['REPEATABLE READ', 'repeatable read', 'REPEATABLE READ'],
  ] as const)('refuses a host transaction at %s with FOREIGN_TRANSACTION, before writing', async (_, level, named) => {
    const host = level === undefined ? store.db.transaction() : store.db.transaction().setIsolationLevel(level);
    await host.execute(async (trx) => {
      const tx = store.withTransaction(trx);
      const error = await claim(tx).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(ForeignTransactionError);
      expect(error).toMatchObject({ code: 'FOREIGN_TRANSACTION' });
      expect((error as Error).message).toContain(`it runs at ${named}`);
      expect((error as Error).message).toMatch(/setIsolationLevel\('read committed'\)/);
      // The refusal sticks for the joined transaction's every later call.
      await expect(tx.lockResources(['box'])).rejects.toBeInstanceOf(ForeignTransactionError);
    });
    expect(await store.locks.getWorkspaceLock(ws)).toBeNull();
  });

  it('joins a host transaction opened READ COMMITTED on that database', async () => {
    await store.db
      .transaction()
      .setIsolationLevel('read committed')
      .execute(async (trx) => {
        expect(await claim(store.withTransaction(trx))).toMatchObject({ status: 'acquired' });
      });
    expect(await store.locks.getWorkspaceLock(ws)).toMatchObject({ holder: 'h' });
  });
});

describe('PostgreSQL: resource locks on disjoint boxes are held at the same time', () => {
  const fx = postgresFixture();
  let contenders: Contenders<typeof OPS>;
  let store: Store;
  beforeAll(async () => {
    const url = await fx.freshUrl();
    store = await fx.open(url);
    await store.migrate();
    await createHostTables(store);
    contenders = await Contenders.start(2, { url, ops: OPS, storeOptions: { poolSize: 3 } });
  });
  afterAll(async () => {
    await contenders?.close();
    await fx.cleanup();
  });

  it('two transactions on different boxes both hold their lock while the other does', async () => {
    const outcomes = await contenders.race('holdAndMeet', (i) => ({
      box: `box:${i}`,
      me: `disjoint-${i}`,
      partner: `disjoint-${1 - i}`,
      giveUpMs: 20_000,
    }));
    expect(outcomes.map((o) => (o.ok ? o.value : o.error.message))).toEqual([true, true]);
  });

  it('(control) on one box they cannot meet: the second waits for the first to commit', async () => {
    const outcomes = await contenders.race('holdAndMeet', (i) => ({
      box: 'box:same',
      me: `same-${i}`,
      partner: `same-${1 - i}`,
      giveUpMs: 1_000,
    }));
    expect(outcomes.map((o) => (o.ok ? o.value : o.error.message)).sort()).toEqual([false, true]);
  });
});

describe('PostgreSQL: schemas', () => {
  const fx = postgresFixture();
  afterAll(() => fx.cleanup());

  it('parses ?schema= and strips it from the URL pg sees', () => {
    expect(parseDatabaseUrl('postgres://u@h:5432/db?schema=tf&sslmode=disable')).toMatchObject({
      dialect: 'postgres',
      schema: 'tf',
      connectionString: 'postgres://u@h:5432/db?sslmode=disable',
    });
    expect(() => parseDatabaseUrl('postgres://u@h/db?schema=a&schema=b')).toThrow(InvalidDatabaseUrlError);
  });

  it("two installs in two schemas of one database are independent, and a host's public.tasks does not matter", async () => {
    const base = new URL(await fx.freshUrl());
    base.search = '';
    const admin = new pg.Client({ connectionString: base.toString() });
    await admin.connect();
    try {
      await admin.query('create table if not exists public.tasks (id text primary key, host_column text)');
      const a = await fx.open(`${base.toString()}?schema=tf_a`);
      const b = await fx.open(base.toString(), { schema: 'tf_b' });
      await expect(fx.open(`${base.toString()}?schema=tf_a`, { schema: 'tf_b' })).rejects.toBeInstanceOf(
        InvalidArgumentError,
      );
      await Promise.all([a.migrate(), b.migrate()]);
      for (const store of [a, b]) {
        expect(await store.migrationStatus()).toMatchObject({
          currentVersion: LATEST_VERSION,
          baselineRequired: false,
          unknown: [],
        });
      }
      expect(await a.describeSchema()).toEqual(await b.describeSchema());
      const { rows } = await admin.query<{ table_schema: string; n: number }>(
        `select table_schema, count(*)::int as n from information_schema.tables where table_schema in ('public', 'tf_a', 'tf_b') group by 1 order by 1`,
      );
      expect(rows[0]).toEqual({ table_schema: 'public', n: 1 });
      expect(rows[1]!.n).toBe(rows[2]!.n);
      // The same ids in both: each install has its own rows, lock tokens and history.
      for (const store of [a, b]) {
        const co = await store.org.createCompany({ id: 'co', name: 'Acme' });
        await store.org.createWorkspace({ id: 'ws', companyId: co.id, name: 'main' });
        expect(await store.locks.claimWorkspaceLock('ws', { holder: 'h', runId: 'r', ttlMs: 60_000 })).toMatchObject({
          status: 'acquired',
          lease: { token: 1 },
        });
        await store.transaction(async (tx) => tx.lockResources(['box:shared']));
      }
      await a.migrate({ to: 0, allowDataLoss: true });
      expect((await b.migrationStatus()).currentVersion).toBe(LATEST_VERSION);
      expect((await admin.query(`select count(*)::int as n from public.tasks`)).rows[0].n).toBe(0);
    } finally {
      await admin.end();
    }
  });

  it('resource locks of two schemas do not exclude each other', async () => {
    const base = new URL(await fx.freshUrl());
    base.search = '';
    const a = await fx.open(`${base.toString()}?schema=tf_a`);
    const b = await fx.open(`${base.toString()}?schema=tf_b`);
    await Promise.all([a.migrate(), b.migrate()]);
    // a holds box:x in an open transaction while b takes box:x: b finishes first.
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let locked!: () => void;
    const isLocked = new Promise<void>((resolve) => (locked = resolve));
    const first = a.transaction(async (tx) => {
      await tx.lockResources(['box:x']);
      locked();
      await held;
    });
    await isLocked;
    await b.transaction((tx) => tx.lockResources(['box:x']));
    release();
    await first;
  });
});
