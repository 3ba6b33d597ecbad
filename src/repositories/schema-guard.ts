import { sql, type Kysely } from 'kysely';
import { SchemaOutOfDateError, TaskfenceError } from '../errors.js';
import { LATEST_VERSION } from '../migrations/index.js';
import type { Database } from '../schema/database.js';
import type { Repositories } from './index.js';
import { tableIn } from '../query/schema.js';

/**
 * The schema-version check, done lazily so that opening a store stays one connection (the CLI
 * and tests open stores on empty databases to migrate them): when a repository call fails with
 * an error that is not a `TaskfenceError` (a raw "no such table", "column … does not exist"),
 * the store reads its migration history, and if the database is behind this code's schema the
 * call fails with `SchemaOutOfDateError` ("run taskfence migrate") instead. A database that is up
 * to date gets the original error back. The successful path costs nothing but a `.catch`.
 */
export function guardSchemaVersion(repositories: Repositories, db: Kysely<Database>): Repositories {
  const onError = async (error: unknown): Promise<never> => {
    if (error instanceof TaskfenceError) throw error;
    const version = await readSchemaVersion(db);
    if (version < LATEST_VERSION) throw new SchemaOutOfDateError(version, LATEST_VERSION);
    throw error;
  };
  const guarded: Record<string, object> = {};
  for (const [area, repository] of Object.entries(repositories) as [string, Record<string, unknown>][]) {
    const wrapped: Record<string, unknown> = {};
    for (const [name, fn] of Object.entries(repository)) {
      wrapped[name] =
        typeof fn === 'function'
          ? (...args: unknown[]) => {
              try {
                return (fn as (...a: unknown[]) => Promise<unknown>)(...args).catch(onError);
              } catch (error) {
                return onError(error);
              }
            }
          : fn;
    }
    guarded[area] = Object.freeze(wrapped);
  }
  return guarded as unknown as Repositories;
}

/** The highest applied migration version, 0 when there is no history table (or it cannot be read). */
export async function readSchemaVersion(db: Kysely<Database>): Promise<number> {
  try {
    const { rows } = await sql<{
      version: number | string | null;
    }>`select max(version) as version from ${tableIn(db, 'taskfence_migrations')}`.execute(db);
    return Number(rows[0]?.version ?? 0);
  } catch {
    return 0;
  }
}
