import { sql, type Kysely } from 'kysely';
import {
  normalizeExpression,
  normalizeType,
  sortForeignKeys,
  sortedRecord,
  type ColumnDescription,
  type IndexDescription,
  type SchemaDescription,
  type TableDescription,
} from '../../schema/describe.js';

const ON_DELETE: Record<string, string> = {
  a: 'no action',
  r: 'restrict',
  c: 'cascade',
  n: 'set null',
  d: 'set default',
};

/** Describes the tables of `schema` (default: the current schema) from the PostgreSQL catalogs. */
export async function describePostgresSchema(db: Kysely<any>, schema?: string): Promise<SchemaDescription> {
  const target = schema === undefined ? sql`current_schema()` : sql`${schema}::text`;
  const cols = await sql<{
    table_name: string;
    column_name: string;
    data_type: string;
    is_nullable: string;
    column_default: string | null;
  }>`
    select table_name, column_name, data_type, is_nullable, column_default
    from information_schema.columns
    where table_schema = ${target}
      and table_name in (select table_name from information_schema.tables
                         where table_schema = ${target} and table_type = 'BASE TABLE')
    order by table_name, ordinal_position`.execute(db);
  const pks = await sql<{ table_name: string; column_name: string }>`
    select c.relname as table_name, a.attname as column_name
    from pg_index i
    join pg_class c on c.oid = i.indrelid
    join pg_namespace n on n.oid = c.relnamespace and n.nspname = ${target}
    cross join lateral unnest(i.indkey) with ordinality as k(attnum, ord)
    join pg_attribute a on a.attrelid = c.oid and a.attnum = k.attnum
    where i.indisprimary
    order by c.relname, k.ord`.execute(db);
  const fks = await sql<{
    table_name: string;
    conname: string;
    columns: string[];
    ref_table: string;
    ref_columns: string[];
    confdeltype: string;
  }>`
    select c.relname as table_name, con.conname,
      array(select a.attname::text from unnest(con.conkey) with ordinality k(n, o)
            join pg_attribute a on a.attrelid = con.conrelid and a.attnum = k.n order by k.o) as columns,
      rc.relname as ref_table,
      array(select a.attname::text from unnest(con.confkey) with ordinality k(n, o)
            join pg_attribute a on a.attrelid = con.confrelid and a.attnum = k.n order by k.o) as ref_columns,
      con.confdeltype
    from pg_constraint con
    join pg_class c on c.oid = con.conrelid
    join pg_class rc on rc.oid = con.confrelid
    join pg_namespace n on n.oid = c.relnamespace and n.nspname = ${target}
    where con.contype = 'f'`.execute(db);
  const idx = await sql<{
    table_name: string;
    index_name: string;
    unique: boolean;
    columns: string[];
    predicate: string | null;
  }>`
    select c.relname as table_name, ic.relname as index_name, i.indisunique as unique,
      -- A column's definition omits its order; bit 0 of indoption marks DESC (SQLite's index SQL keeps it).
      array(select pg_get_indexdef(i.indexrelid, k, true) || case when i.indoption[k - 1] & 1 = 1 then ' desc' else '' end
        from generate_series(1, i.indnkeyatts) k order by k) as columns,
      pg_get_expr(i.indpred, i.indrelid, true) as predicate
    from pg_index i
    join pg_class c on c.oid = i.indrelid
    join pg_class ic on ic.oid = i.indexrelid
    join pg_namespace n on n.oid = c.relnamespace and n.nspname = ${target}
    where not i.indisprimary`.execute(db);

  const tables = new Map<
    string,
    {
      columns: [string, ColumnDescription][];
      pk: string[];
      fks: TableDescription['foreignKeys'][number][];
      indexes: [string, IndexDescription][];
    }
  >();
  const table = (name: string) => {
    let t = tables.get(name);
    if (!t) tables.set(name, (t = { columns: [], pk: [], fks: [], indexes: [] }));
    return t;
  };
  for (const c of cols.rows) {
    table(c.table_name).columns.push([
      c.column_name,
      {
        type: normalizeType(c.data_type),
        nullable: c.is_nullable === 'YES',
        // A sequence default (`messages.seq`) is how PostgreSQL numbers what SQLite numbers in a
        // trigger: both describe as no default, so the dialects' schemas compare equal and the
        // drift reference (built in a scratch schema, whose sequence has another name) matches.
        default:
          c.column_default === null || /^nextval\(/i.test(c.column_default)
            ? null
            : normalizeExpression(c.column_default),
      },
    ]);
  }
  for (const p of pks.rows) table(p.table_name).pk.push(p.column_name);
  for (const f of fks.rows) {
    table(f.table_name).fks.push({
      columns: f.columns,
      referencedTable: f.ref_table,
      referencedColumns: f.ref_columns,
      onDelete: ON_DELETE[f.confdeltype] ?? f.confdeltype,
    });
  }
  for (const i of idx.rows) {
    table(i.table_name).indexes.push([
      i.index_name,
      {
        unique: i.unique,
        columns: i.columns.map(normalizeExpression),
        where: i.predicate === null ? null : normalizeExpression(i.predicate),
      },
    ]);
  }
  return {
    tables: sortedRecord(
      [...tables].map(([name, t]) => [
        name,
        {
          columns: sortedRecord(t.columns),
          primaryKey: t.pk,
          foreignKeys: sortForeignKeys(t.fks),
          indexes: sortedRecord(t.indexes),
        },
      ]),
    ),
  };
}
