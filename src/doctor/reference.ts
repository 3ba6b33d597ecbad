import { sql } from 'kysely';
import { openSqliteDialect } from '../dialects/sqlite/sqlite-dialect.js';
import { describePostgresSchema } from '../dialects/postgres/postgres-describe.js';
import type { StoreDialect } from '../dialects/types.js';
import { PROBE_TABLE_PREFIX } from './drift.js';
import { inRolledBackWrite, probeName } from './probe-support.js';
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

/**
 * The schema the chain produces at `version` on the live PostgreSQL database itself, and every
 * table any version creates: the migrations' `up` run in a scratch schema (alone on the search
 * path) inside a transaction that is rolled back, so nothing stays behind. What they built is
 * read from the scratch schema by name, never through `current_schema()`; the live side of the
 * comparison is the store's configured schema (`describeSchema`). For installs without
 * better-sqlite3, where `referenceSchemas` cannot open its scratch database. The migration history
 * table is not part of it (the migrator, not a migration, creates it).
 */
export async function scratchSchemaReference(
  dialect: StoreDialect,
  migrations: readonly MigrationDefinition[],
  version: number,
): Promise<{ schema: SchemaDescription | undefined; chainTables: Set<string> }> {
  const scratchSchema = `${PROBE_TABLE_PREFIX}${probeName()}`;
  const chainTables = new Set<string>();
  let schema: SchemaDescription | undefined = version === 0 ? { tables: {} } : undefined;
  await inRolledBackWrite(dialect, async (store) => {
    // Without the store's plugins: its statements would name the store's schema, not the scratch one.
    const trx = store.withoutPlugins();
    await sql`create schema ${sql.id(scratchSchema)}`.execute(trx);
    await sql`select set_config('search_path', ${scratchSchema}, true)`.execute(trx);
    for (const m of migrations) {
      await m.up({ db: trx, types: dialect.columnTypes, now: 0, progress: () => {} });
      // Its concurrent steps, in their plain form (a migrate runs them outside the transaction).
      for (const step of m.concurrent ?? []) {
        if (step.kind === 'create-index') await trx.executeQuery(step.build(trx).compile());
        else await sql`alter table ${sql.id(step.table)} validate constraint ${sql.id(step.constraint)}`.execute(trx);
      }
      const { rows } = await sql<{ name: string }>`
        select table_name as name from information_schema.tables where table_schema = ${scratchSchema}`.execute(trx);
      for (const row of rows) chainTables.add(row.name);
      if (m.version === version) schema = await describePostgresSchema(trx, scratchSchema);
    }
  });
  return { schema, chainTables };
}
