import { describe, expect, it } from 'vitest';
import { openSqliteDialect } from '../../src/dialects/sqlite/sqlite-dialect.js';
import { MIGRATIONS } from '../../src/migrations/index.js';
import { expectedTablesAt } from '../../src/migrator/reference.js';

/** Independent reference: migrate a scratch in-memory SQLite database and read its tables. */
async function tablesBySqlite(version: number): Promise<Record<string, string[]>> {
  const dialect = await openSqliteDialect(':memory:');
  try {
    for (const m of MIGRATIONS) {
      if (m.version > version) break;
      await dialect.writeTransaction((trx) =>
        m.up({ db: trx, types: dialect.columnTypes, now: 0, progress: () => {} }),
      );
    }
    const description = await dialect.describeSchema();
    return Object.fromEntries(
      Object.entries(description.tables).map(([name, t]) => [name, Object.keys(t.columns).sort()]),
    );
  } finally {
    await dialect.close();
  }
}

describe('expectedTablesAt (recorded, no driver)', () => {
  for (const version of [0, ...MIGRATIONS.map((m) => m.version)]) {
    it(`matches a real migrated database at version ${version}`, async () => {
      const recorded = await expectedTablesAt(version, MIGRATIONS);
      const actual = Object.fromEntries([...recorded].map(([name, columns]) => [name, [...columns].sort()]));
      expect(actual).toEqual(await tablesBySqlite(version));
    });
  }
});
