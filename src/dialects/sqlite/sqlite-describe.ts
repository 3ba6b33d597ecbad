import { sql, type Kysely } from 'kysely';
import {
  normalizeExpression,
  normalizeType,
  sortForeignKeys,
  sortedRecord,
  splitTopLevel,
  type ColumnDescription,
  type ForeignKeyDescription,
  type IndexDescription,
  type SchemaDescription,
  type TableDescription,
} from '../../schema/describe.js';

/** Describes an SQLite schema from sqlite_master and the table/index pragmas. */
export async function describeSqliteSchema(db: Kysely<any>): Promise<SchemaDescription> {
  const tables = await sql<{ name: string }>`
    select name from sqlite_master where type = 'table' and name not like 'sqlite_%' order by name`.execute(db);
  const described: [string, TableDescription][] = [];
  for (const { name } of tables.rows) {
    const cols = await sql<{ name: string; type: string; notnull: number; dflt_value: string | null; pk: number }>`
      select name, type, "notnull", dflt_value, pk from pragma_table_info(${name})`.execute(db);
    const columns: [string, ColumnDescription][] = cols.rows.map((c) => [
      c.name,
      {
        type: normalizeType(c.type),
        nullable: c.notnull === 0 && c.pk === 0,
        default: c.dflt_value === null ? null : normalizeExpression(c.dflt_value),
      },
    ]);
    const primaryKey = cols.rows
      .filter((c) => c.pk > 0)
      .sort((a, b) => a.pk - b.pk)
      .map((c) => c.name);

    const fkRows = await sql<{ id: number; seq: number; table: string; from: string; to: string; on_delete: string }>`
      select id, seq, "table", "from", "to", on_delete from pragma_foreign_key_list(${name}) order by id, seq`.execute(
      db,
    );
    const fkById = new Map<
      number,
      { columns: string[]; referencedTable: string; referencedColumns: string[]; onDelete: string }
    >();
    for (const fk of fkRows.rows) {
      let entry = fkById.get(fk.id);
      if (!entry) {
        entry = { columns: [], referencedTable: fk.table, referencedColumns: [], onDelete: fk.on_delete.toLowerCase() };
        fkById.set(fk.id, entry);
      }
      entry.columns.push(fk.from);
      entry.referencedColumns.push(fk.to);
    }
    const foreignKeys: ForeignKeyDescription[] = sortForeignKeys([...fkById.values()]);

    const idxRows = await sql<{ name: string; unique: number; origin: string; sql: string | null }>`
      select il.name, il."unique", il.origin, m.sql
      from pragma_index_list(${name}) il left join sqlite_master m on m.name = il.name and m.type = 'index'`.execute(
      db,
    );
    const indexes: [string, IndexDescription][] = [];
    for (const idx of idxRows.rows) {
      if (idx.origin === 'pk') continue;
      indexes.push([idx.name, { unique: idx.unique === 1, ...parseIndexSql(idx.sql ?? '') }]);
    }
    described.push([name, { columns: sortedRecord(columns), primaryKey, foreignKeys, indexes: sortedRecord(indexes) }]);
  }
  return { tables: sortedRecord(described) };
}

/** Pulls the column list and the WHERE clause out of a `CREATE INDEX … ON t (…) WHERE …` statement. */
function parseIndexSql(createSql: string): { columns: string[]; where: string | null } {
  const on = /\bon\s+("[^"]+"|\S+?)\s*\(/i.exec(createSql);
  if (!on) return { columns: [], where: null };
  let depth = 0;
  let end = -1;
  const start = on.index + on[0].length - 1;
  for (let i = start; i < createSql.length; i++) {
    if (createSql[i] === '(') depth++;
    if (createSql[i] === ')' && --depth === 0) {
      end = i;
      break;
    }
  }
  const list = createSql.slice(start + 1, end);
  const rest = createSql.slice(end + 1);
  const where = /\bwhere\b([\s\S]*)$/i.exec(rest)?.[1];
  return {
    columns: splitTopLevel(list).map(normalizeExpression),
    where: where === undefined ? null : normalizeExpression(where),
  };
}
