import { sql } from 'kysely';
import type { SchemaDescription, Store } from '../../src/index.js';
import { RELEASES_TABLE } from '../../src/migrator/releases.js';
import { tbl } from './schema.js';

/**
 * Columns that change with no call: an open store refreshes its registry row's `seen_at` every
 * minute (`HEARTBEAT_MS`, src/migrator/releases.ts), in the background. A fingerprint that read
 * it would see a refusal "change the database" whenever the heartbeat fell between two reads.
 */
const HEARTBEAT_COLUMNS: Readonly<Record<string, readonly string[]>> = { [RELEASES_TABLE]: ['seen_at'] };

/**
 * A fingerprint of everything a refusal must not change: the schema and, per table, the row
 * count and a digest of every row (so an UPDATE that bumps a token shows too). With `schema`
 * (a description read earlier), the schema itself is not re-read or included: for callers that
 * take many fingerprints and compare the schema once at the end. Tables named in `except` are
 * left out, and so is the store registry's heartbeat (above).
 */
export async function databaseState(
  store: Store,
  options: { schema?: SchemaDescription; except?: readonly string[] } = {},
): Promise<string> {
  const schema = options.schema ?? (await store.describeSchema());
  const parts: string[] = options.schema ? [] : [JSON.stringify(schema)];
  for (const table of Object.keys(schema.tables).sort()) {
    if (options.except?.includes(table)) continue;
    const columns = Object.keys(schema.tables[table]!.columns)
      .filter((c) => !HEARTBEAT_COLUMNS[table]?.includes(c))
      .sort();
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
