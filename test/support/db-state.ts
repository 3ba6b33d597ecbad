import { sql } from 'kysely';
import type { Store } from '../../src/index.js';

/**
 * A fingerprint of everything a refusal must not change: the schema and, per table, the row
 * count and a digest of every row (so an UPDATE that bumps a token shows too).
 */
export async function databaseState(store: Store): Promise<string> {
  const schema = await store.describeSchema();
  const parts: string[] = [JSON.stringify(schema)];
  for (const table of Object.keys(schema.tables).sort()) {
    const columns = Object.keys(schema.tables[table]!.columns).sort();
    const { rows } = await sql<Record<string, unknown>>`select * from ${sql.table(table)}`.execute(store.db);
    const lines = rows.map((row) => JSON.stringify(columns.map((c) => (row[c] === null || row[c] === undefined ? null : String(row[c]))))).sort();
    parts.push(`${table}:${rows.length}:${lines.join('|')}`);
  }
  return parts.join('\n');
}
