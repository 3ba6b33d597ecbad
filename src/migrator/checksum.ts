import { createHash } from 'node:crypto';
import type { CompiledQuery, QueryResult } from 'kysely';
import { columnTypesFor } from '../dialects/column-types.js';
import { createRecordingKysely } from './recording-driver.js';
import type { StoreDialect } from '../dialects/types.js';
import type { MigrationDefinition } from '../migrations/types.js';
import { TaskfenceSchemaPlugin } from '../query/schema.js';
import { stepStatement } from './steps.js';

/**
 * Records the statements a migration issues in one direction on one dialect, answering every
 * query with no rows (so data backfills show the statements they run on an empty table), or as
 * `live.answer` does. With `live.schema` (a configured PostgreSQL schema) the statements name
 * their tables in it, as `migrate` sends them; checksums are recorded without one.
 */
export async function recordMigration(
  migration: MigrationDefinition,
  direction: 'up' | 'down' | 'backfill' | 'concurrent',
  kind: StoreDialect['kind'],
  live?: {
    readonly now: number;
    readonly answer: (query: CompiledQuery) => Promise<QueryResult<any> | undefined>;
    readonly schema?: string;
    readonly batchSize?: number;
  },
): Promise<CompiledQuery[]> {
  const log: CompiledQuery[] = [];
  const recording = createRecordingKysely(kind, log, live?.answer);
  const db = live?.schema === undefined ? recording : recording.withPlugin(new TaskfenceSchemaPlugin(live.schema));
  const types = columnTypesFor(kind);
  const now = live?.now ?? 0;
  if (direction === 'concurrent') {
    // Not run: compiled, as the steps' statements are never data-dependent.
    for (const step of migration.concurrent ?? []) {
      const statement = stepStatement(step, types, db);
      if (statement) log.push(statement);
    }
  } else if (direction !== 'backfill') await migration[direction]({ db, types, now, progress: () => {} });
  else await migration.backfill?.batch({ db, types, now, batchSize: live?.batchSize ?? CHECKSUM_BATCH_SIZE }, null);
  return log;
}

/** The batch size a backfill's first batch is recorded with for its checksum. */
const CHECKSUM_BATCH_SIZE = 5_000;

/**
 * The checksum of a migration on a dialect: SHA-256 of the SQL text and parameters its `up`,
 * `down`, its concurrent steps (if any) and its backfill's first batch (if it has one) issue there. Editing what a migration
 * does changes it; reformatting its source does not.
 */
export async function migrationChecksum(migration: MigrationDefinition, kind: StoreDialect['kind']): Promise<string> {
  const hash = createHash('sha256');
  hash.update(`${migration.version}\n${migration.name}\n`);
  const directions = [
    'up',
    'down',
    ...(migration.concurrent?.length ? (['concurrent'] as const) : []),
    ...(migration.backfill ? (['backfill'] as const) : []),
  ] as const;
  for (const direction of directions) {
    const queries = await recordMigration(migration, direction, kind);
    // Steps with nothing to do on this dialect (a validation on SQLite) leave its checksum as it was.
    if (direction === 'concurrent' && queries.length === 0) continue;
    hash.update(`-- ${direction}\n`);
    for (const query of queries) {
      hash.update(query.sql);
      hash.update(JSON.stringify(query.parameters));
      hash.update('\n');
    }
  }
  return hash.digest('hex');
}
