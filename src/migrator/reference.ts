import type { CompiledQuery, OperationNode } from 'kysely';
import type { MigrationDefinition } from '../migrations/types.js';
import { recordMigration } from './checksum.js';

const cache = new Map<string, Map<string, string[]>>();

/**
 * The tables and column names a database has at `version`, found by replaying the schema
 * statements each migration's `up` issues (recorded, not run: no database and no driver is
 * needed, so a PostgreSQL-only install does not need better-sqlite3). Table and column names are
 * the same on both dialects. A table change made through raw SQL would be missed, so one throws.
 */
export async function expectedTablesAt(
  version: number,
  migrations: readonly MigrationDefinition[],
): Promise<Map<string, string[]>> {
  const key = `${version}:${migrations.map((m) => m.version).join(',')}`;
  const cached = cache.get(key);
  if (cached) return cached;
  const tables = new Map<string, string[]>();
  for (const m of migrations) {
    if (m.version > version) break;
    for (const query of await recordMigration(m, 'up', 'sqlite')) apply(tables, query, m);
  }
  cache.set(key, tables);
  return tables;
}

interface Named {
  readonly table: { readonly identifier: { readonly name: string } };
}
interface ColumnRef {
  readonly column: { readonly name: string };
}

function apply(tables: Map<string, string[]>, query: CompiledQuery, migration: MigrationDefinition): void {
  const node = query.query as OperationNode & Record<string, any>;
  switch (node.kind) {
    case 'CreateTableNode': {
      const name = (node.table as Named).table.identifier.name;
      if (node.ifNotExists && tables.has(name)) return;
      tables.set(
        name,
        (node.columns as { column: ColumnRef }[]).map((c) => c.column.column.name),
      );
      return;
    }
    case 'DropTableNode':
      tables.delete((node.table as Named).table.identifier.name);
      return;
    case 'AlterTableNode': {
      let name = (node.table as Named).table.identifier.name;
      const columns = tables.get(name) ?? [];
      for (const change of (node.columnAlterations ?? []) as (OperationNode & Record<string, any>)[]) {
        if (change.kind === 'AddColumnNode') columns.push((change.column as { column: ColumnRef }).column.column.name);
        else if (change.kind === 'DropColumnNode') remove(columns, (change.column as ColumnRef).column.name);
        else if (change.kind === 'RenameColumnNode') {
          const at = columns.indexOf((change.column as ColumnRef).column.name);
          if (at >= 0) columns[at] = (change.renameTo as ColumnRef).column.name;
        }
      }
      tables.delete(name);
      if (node.renameTo) name = (node.renameTo as Named).table.identifier.name;
      tables.set(name, columns);
      return;
    }
    case 'RawNode':
      if (/^\s*(create|alter|drop)\s+table\b/i.test(query.sql)) {
        throw new Error(
          `Migration ${migration.version} ${migration.name} changes a table through raw SQL; use the schema builder so the migrator can see it.`,
        );
      }
      return;
    default:
      return;
  }
}

function remove(list: string[], item: string): void {
  const at = list.indexOf(item);
  if (at >= 0) list.splice(at, 1);
}
