import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MIGRATIONS, type SchemaDescription, type Store } from '../../src/index.js';
import { SqliteFixture, type DialectFixture } from '../support/fixtures.js';
import { postgresFixture } from '../support/dialects.js';
import { makeLegacyV5Database } from '../suites/legacy.js';

/** Lives in the postgres project because it needs both dialects at once. */
describe('schema parity between SQLite and PostgreSQL', () => {
  let sqlite: DialectFixture;
  let postgres: DialectFixture;
  beforeAll(() => {
    sqlite = new SqliteFixture();
    postgres = postgresFixture();
  });
  afterAll(async () => {
    await sqlite.cleanup();
    await postgres.cleanup();
  });

  it('the schemas are equal at every version, up to the declared type mapping', async () => {
    const a = await sqlite.freshStore({ to: 0 });
    const b = await postgres.freshStore({ to: 0 });
    for (const m of MIGRATIONS) {
      await a.migrate({ to: m.version });
      await b.migrate({ to: m.version });
      expect(await a.describeSchema(), `version ${m.version}`).toEqual(await b.describeSchema());
    }
  });

  it('a fresh database and an adopted v5 database migrated forward end equal, on both dialects', async () => {
    const describeAll = async (fx: DialectFixture): Promise<SchemaDescription[]> => {
      const fresh = await fx.freshStore();
      const legacy: Store = await fx.open(await fx.freshUrl());
      await makeLegacyV5Database(legacy);
      await legacy.migrate({ baseline: 5 });
      return [await fresh.describeSchema(), await legacy.describeSchema()];
    };
    const [sqliteFresh, sqliteAdopted] = await describeAll(sqlite);
    const [pgFresh, pgAdopted] = await describeAll(postgres);
    expect(sqliteAdopted).toEqual(sqliteFresh);
    expect(pgAdopted).toEqual(pgFresh);
    expect(sqliteFresh).toEqual(pgFresh);
  });
});
