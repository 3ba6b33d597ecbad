import { openSqliteDialect } from '../dialects/sqlite.js';
import { Migrator } from '../migrator/migrator.js';
import type { MigrationDefinition } from '../migrations/types.js';
import type { SchemaDescription } from '../schema/describe.js';

const cache = new Map<string, Promise<Map<number, SchemaDescription>>>();

/**
 * The schema the chain produces at each of its versions (0 = empty), found by migrating a scratch
 * in-memory SQLite database one version at a time and describing it after each step. Both
 * dialects describe an equal schema equally (the parity test holds this at every version), so the
 * result is the reference for either. Cached per chain.
 */
export function referenceSchemas(migrations: readonly MigrationDefinition[]): Promise<Map<number, SchemaDescription>> {
  const key = migrations.map((m) => `${m.version}:${m.name}`).join(',');
  let cached = cache.get(key);
  if (!cached) {
    cached = replay(migrations);
    cache.set(key, cached);
    cached.catch(() => cache.delete(key));
  }
  return cached;
}

async function replay(migrations: readonly MigrationDefinition[]): Promise<Map<number, SchemaDescription>> {
  const dialect = await openSqliteDialect(':memory:');
  try {
    const migrator = new Migrator(dialect, migrations);
    const schemas = new Map<number, SchemaDescription>([[0, { tables: {} }]]);
    for (const m of migrations) {
      await migrator.migrate({ to: m.version, now: 0 });
      schemas.set(m.version, await dialect.describeSchema());
    }
    return schemas;
  } finally {
    await dialect.close();
  }
}
