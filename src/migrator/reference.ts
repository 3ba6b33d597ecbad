import { openSqliteDialect } from '../dialects/sqlite.js';
import type { MigrationDefinition } from '../migrations/types.js';

const cache = new Map<string, Map<string, string[]>>();

/**
 * The tables and column names a database has at `version`, found by migrating a scratch
 * in-memory SQLite database to it. Table and column names are the same on both dialects.
 */
export async function expectedTablesAt(version: number, migrations: readonly MigrationDefinition[]): Promise<Map<string, string[]>> {
  const key = `${version}:${migrations.map((m) => m.version).join(',')}`;
  const cached = cache.get(key);
  if (cached) return cached;
  const dialect = await openSqliteDialect(':memory:');
  try {
    for (const m of migrations) {
      if (m.version > version) break;
      await dialect.writeTransaction((trx) => m.up({ db: trx, types: dialect.columnTypes, now: 0, progress: () => {} }));
    }
    const description = await dialect.describeSchema();
    const tables = new Map(Object.entries(description.tables).map(([name, t]) => [name, Object.keys(t.columns)]));
    cache.set(key, tables);
    return tables;
  } finally {
    await dialect.close();
  }
}
