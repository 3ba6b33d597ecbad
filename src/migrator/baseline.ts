import { BaselineMismatchError, BaselineRequiredError, UnknownVersionError, formatVersion } from '../errors.js';
import type { SchemaDescription } from '../schema/describe.js';
import type { Chain } from './chain.js';
import { HISTORY_TABLE, createHistoryTable } from './history.js';
import type { LockSettings } from './lock.js';
import { expectedTablesAt } from './reference.js';
import type { MigrationStatus } from './types.js';

/** What keeps the database from being adopted as `version` (empty when it matches). */
async function baselineProblems(chain: Chain, version: number, actual: SchemaDescription): Promise<string[]> {
  const expected = await expectedTablesAt(version, chain.migrations);
  const problems: string[] = [];
  for (const [table, columns] of expected) {
    const found = actual.tables[table];
    if (!found) {
      problems.push(`table ${table} is missing`);
      continue;
    }
    for (const column of columns) if (!(column in found.columns)) problems.push(`column ${table}.${column} is missing`);
  }
  // Tables that only later versions create mean the database is newer than claimed.
  const later = await expectedTablesAt(chain.latestVersion, chain.migrations);
  for (const table of later.keys()) {
    if (!expected.has(table) && actual.tables[table]) problems.push(`table ${table} belongs to a later version`);
  }
  return problems;
}

/** The error for a database with tables but no history: lists what is there, suggests only a taskfence version that fits. */
export async function baselineRequiredError(chain: Chain): Promise<BaselineRequiredError> {
  const actual = await chain.dialect.describeSchema();
  const tables = Object.keys(actual.tables)
    .filter((t) => t !== HISTORY_TABLE)
    .sort();
  let suggestion: number | null = null;
  for (const m of [...chain.migrations].reverse()) {
    if ((await baselineProblems(chain, m.version, actual)).length === 0) {
      suggestion = m.version;
      break;
    }
  }
  return new BaselineRequiredError(tables, await chain.dialect.readUserVersion(), suggestion);
}

/** Records versions up to `version` as applied after checking that the database has their tables and columns. */
export async function adoptBaseline(
  chain: Chain,
  version: number,
  status: MigrationStatus,
  checksums: ReadonlyMap<number, string>,
  lock: LockSettings,
): Promise<void> {
  if (version === 0)
    throw new UnknownVersionError(
      0,
      chain.migrations.map((m) => m.version),
    );
  if (status.applied.length > 0) {
    throw new BaselineMismatchError(version, [
      `the database already has migration history up to ${formatVersion(status.currentVersion)}; --baseline only adopts a database without history`,
    ]);
  }
  const problems = await baselineProblems(chain, version, await chain.dialect.describeSchema());
  if (problems.length > 0) throw new BaselineMismatchError(version, problems);
  await chain.dialect.withMigrationLock(async (trx) => {
    await createHistoryTable(trx, chain.dialect.columnTypes);
    const existing = await trx.selectFrom(HISTORY_TABLE).select('version').executeTakeFirst();
    if (existing) return; // another migrator adopted it meanwhile
    for (const m of chain.migrations.filter((m) => m.version <= version)) {
      await trx
        .insertInto(HISTORY_TABLE)
        .values({
          version: m.version,
          name: m.name,
          checksum: checksums.get(m.version)!,
          applied_at: Date.now(),
          duration_ms: 0,
        })
        .execute();
    }
  }, lock);
}
