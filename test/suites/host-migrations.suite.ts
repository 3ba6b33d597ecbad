/**
 * A host's own migrations beside taskfence's chain in one database (and PostgreSQL schema):
 * Kysely's Migrator and umzug, each with its own history table, in either order; taskfence
 * keeps its own chain and history and never mistakes the host's tables for its own.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Kysely } from 'kysely';
import * as kyselyRoot from 'kysely';
import { Umzug, type UmzugStorage } from 'umzug';
import { LATEST_VERSION, type Store } from '../../src/index.js';
import type { DialectFixture } from '../support/fixtures.js';

type HostDb = Kysely<any>;

/** A host migration, as Kysely's Migrator takes it. */
interface Migration {
  up(db: HostDb): Promise<void>;
  down?(db: HostDb): Promise<void>;
}

interface HostMigrator {
  migrateToLatest(): Promise<{ error?: unknown; results?: { migrationName: string; status: string }[] }>;
  migrateDown(): Promise<{ error?: unknown; results?: { migrationName: string; status: string }[] }>;
  getMigrations(): Promise<{ name: string; executedAt?: Date }[]>;
}

/**
 * Kysely's Migrator: exported from 'kysely' up to 0.28, from 'kysely/migration' since 0.29 (the
 * suite runs against both). The subpath is tried first.
 */
const KyselyMigrator: new (options: Record<string, unknown>) => HostMigrator = await (async () => {
  try {
    const subpath = 'kysely/migration';
    return (
      (await import(/* @vite-ignore */ subpath)) as { Migrator: new (options: Record<string, unknown>) => HostMigrator }
    ).Migrator;
  } catch {
    return (kyselyRoot as unknown as { Migrator: new (options: Record<string, unknown>) => HostMigrator }).Migrator;
  }
})();

/** The host's Kysely migrations (its own table names; `orders` and `invoices` are not taskfence's). */
const HOST_MIGRATIONS: Record<string, Migration> = {
  '2026_01_orders': {
    up: (db: HostDb) =>
      db.schema
        .createTable('orders')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .addColumn('total', 'integer')
        .execute(),
    down: (db: HostDb) => db.schema.dropTable('orders').execute(),
  },
  '2026_02_invoices': {
    up: (db: HostDb) =>
      db.schema
        .createTable('invoices')
        .addColumn('id', 'text', (c) => c.primaryKey())
        .execute(),
    down: (db: HostDb) => db.schema.dropTable('invoices').execute(),
  },
};

function kyselyMigrator(store: Store) {
  return new KyselyMigrator({
    db: store.db,
    provider: { getMigrations: async () => HOST_MIGRATIONS },
    // Its own history and lock tables, next to taskfence_migrations.
    migrationTableName: 'host_kysely_migrations',
    migrationLockTableName: 'host_kysely_migrations_lock',
  });
}

/** umzug with a storage of the host's own, in a table of its own, through store.db. */
function hostUmzug(store: Store) {
  const db = store.db as unknown as HostDb;
  const ensure = () =>
    db.schema
      .createTable('host_umzug_meta')
      .ifNotExists()
      .addColumn('name', 'text', (c) => c.primaryKey())
      .execute();
  const storage: UmzugStorage = {
    async executed() {
      await ensure();
      return (await db.selectFrom('host_umzug_meta').select('name').orderBy('name').execute()).map(
        (r: { name: string }) => r.name,
      );
    },
    async logMigration({ name }) {
      await ensure();
      await db.insertInto('host_umzug_meta').values({ name }).execute();
    },
    async unlogMigration({ name }) {
      await db.deleteFrom('host_umzug_meta').where('name', '=', name).execute();
    },
  };
  return new Umzug({
    migrations: [
      {
        name: '001_shipments',
        up: () =>
          db.schema
            .createTable('shipments')
            .addColumn('id', 'text', (c) => c.primaryKey())
            .execute(),
        down: () => db.schema.dropTable('shipments').execute(),
      },
    ],
    storage,
    logger: undefined,
  });
}

async function tableNames(store: Store): Promise<string[]> {
  return (await store.db.introspection.getTables()).map((t) => t.name).sort();
}

export function defineHostMigrationSuite(makeFixture: () => DialectFixture) {
  describe("the host's own migrations beside taskfence's", () => {
    let fx: DialectFixture;
    beforeAll(() => {
      fx = makeFixture();
    });
    afterAll(() => fx.cleanup());

    for (const order of ['taskfence first', 'host first'] as const) {
      it(`Kysely Migrator and umzug with their own history tables, ${order}`, async () => {
        const store = await fx.open(await fx.freshUrl());
        const host = async () => {
          const kysely = await kyselyMigrator(store).migrateToLatest();
          expect(kysely.error).toBeUndefined();
          await hostUmzug(store).up();
        };
        if (order === 'host first') {
          // In a PostgreSQL schema of its own (TEST_PG_SCHEMA), the schema must exist before the host's tools write into it.
          const schema = store.location.dialect === 'postgres' ? store.location.schema : undefined;
          if (schema !== undefined) await store.db.schema.createSchema(schema).ifNotExists().execute();
          await host();
        }
        await store.migrate();
        if (order === 'taskfence first') await host();

        const status = await store.migrationStatus();
        expect(status).toMatchObject({
          currentVersion: LATEST_VERSION,
          baselineRequired: false,
          pending: [],
          unknown: [],
          modified: [],
        });
        expect(await tableNames(store)).toEqual(
          expect.arrayContaining([
            'orders',
            'invoices',
            'shipments',
            'host_kysely_migrations',
            'host_umzug_meta',
            'taskfence_migrations',
            'tasks',
          ]),
        );
        // Both tools see their own history only, and running them again changes nothing.
        expect((await kyselyMigrator(store).getMigrations()).map((m) => [m.name, m.executedAt !== undefined])).toEqual([
          ['2026_01_orders', true],
          ['2026_02_invoices', true],
        ]);
        expect((await hostUmzug(store).executed()).map((m) => m.name)).toEqual(['001_shipments']);
        expect((await store.migrate()).applied).toEqual([]);
        // The host's tables and taskfence's are used side by side.
        await (store.db as unknown as HostDb).insertInto('orders').values({ id: 'o1', total: 3 }).execute();
        await store.transaction(async (tx) => {
          await tx.org.createCompany({ id: 'co', name: 'Acme' });
          await (tx.db as unknown as HostDb).insertInto('invoices').values({ id: 'i1' }).execute();
        });
        // Reverting the host's migrations leaves taskfence at its version.
        await kyselyMigrator(store).migrateDown();
        expect((await store.migrationStatus()).currentVersion).toBe(LATEST_VERSION);
      });
    }
  });
}
