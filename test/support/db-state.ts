import { sql } from 'kysely';
import type { SchemaDescription, Store } from '../../src/index.js';
import { tbl } from './schema.js';

/**
 * A fingerprint of everything a refusal must not change: the schema and, per table, the row
 * count and a digest of every row (so an UPDATE that bumps a token shows too). With `schema`
 * (a description read earlier), the schema itself is not re-read or included: for callers that
 * take many fingerprints and compare the schema once at the end. Tables named in `except` are
 * left out.
 */
export async function databaseState(
  store: Store,
  options: { schema?: SchemaDescription; except?: readonly string[] } = {},
): Promise<string> {
  const schema = options.schema ?? (await store.describeSchema());
  const parts: string[] = options.schema ? [] : [JSON.stringify(schema)];
  for (const table of Object.keys(schema.tables).sort()) {
    if (options.except?.includes(table)) continue;
    const columns = Object.keys(schema.tables[table]!.columns).sort();
    const { rows } = await sql<Record<string, unknown>>`select * from ${tbl(store.db, table)}`.execute(store.db);
    const lines = rows
      .map((row) =>
        JSON.stringify(
          columns.map((c) => (row[c] === null || row[c] === undefined ? null : String(row[c] as string | number))),
        ),
      )
      .sort();
    parts.push(`${table}:${rows.length}:${lines.join('|')}`);
  }
  return parts.join('\n');
}
