import { sql, type Kysely } from 'kysely';
import type { DataLoss } from '../errors.js';
import { tableIn } from '../query/schema.js';
import type { Database } from '../schema/database.js';
import type { MigrationDefinition } from '../migrations/types.js';
import type { Chain } from './chain.js';
import { expectedTablesAt } from './reference.js';

/** Tables and columns that reverting `m` drops, with the rows they hold (only those holding rows). */
export async function droppedRows(chain: Chain, db: Kysely<Database>, m: MigrationDefinition): Promise<DataLoss[]> {
  const index = chain.migrations.indexOf(m);
  const before = await expectedTablesAt(m.version, chain.migrations);
  const after =
    index > 0
      ? await expectedTablesAt(chain.migrations[index - 1]!.version, chain.migrations)
      : new Map<string, string[]>();
  const existing = new Set((await db.introspection.getTables()).map((t) => t.name));
  const losses: DataLoss[] = [];
  for (const [table, columns] of before) {
    if (!existing.has(table)) continue;
    const kept = after.get(table);
    const dropped = kept ? columns.filter((c) => !kept.includes(c)) : [];
    if (kept && dropped.length === 0) continue;
    // A dropped table loses its rows; a dropped column the rows where it holds a value.
    const targets = kept ? dropped : [undefined];
    for (const column of targets) {
      const counted = column === undefined ? sql`count(*)` : sql`count(${sql.ref(column)})`;
      const { rows } = await sql<{ n: number | string }>`select ${counted} as n from ${tableIn(db, table)}`.execute(db);
      const count = Number(rows[0]?.n ?? 0);
      if (count > 0)
        losses.push({ version: m.version, name: m.name, table, ...(column ? { column } : {}), rows: count });
    }
  }
  return losses;
}

/** What reverting `downs` (newest first) would drop, counted on one snapshot. */
export async function droppedRowsOf(chain: Chain, downs: readonly MigrationDefinition[]): Promise<DataLoss[]> {
  return chain.dialect.readTransaction(async (trx) => {
    const found: DataLoss[] = [];
    for (const m of downs) found.push(...(await droppedRows(chain, trx, m)));
    return found;
  });
}
