import { SchemaOutOfDateError, TaskfenceError } from '../errors.js';
import { LATEST_VERSION } from '../migrations/index.js';
import type { Repositories } from './index.js';

/**
 * The schema-version check, done lazily so that opening a store stays one connection (the CLI
 * and tests open stores on empty databases to migrate them): when a repository call fails with
 * an error that is not a `TaskfenceError` (a raw "no such table", "column … does not exist"),
 * the store reads its migration history, and if the database is behind this code's schema the
 * call fails with `SchemaOutOfDateError` ("run taskfence migrate") instead. A database that is up
 * to date gets the original error back, and so does a call whose version read fails too: the
 * check never guesses a version (an operator told to migrate an up-to-date database loses time in
 * an incident). `readVersion` is `StoreDialect.readSchemaVersion` (a fresh connection on
 * PostgreSQL). The successful path costs nothing but a `.catch`.
 */
export function guardSchemaVersion(repositories: Repositories, readVersion: () => Promise<number>): Repositories {
  const onError = async (error: unknown): Promise<never> => {
    if (error instanceof TaskfenceError) throw error;
    let version: number;
    try {
      version = await readVersion();
    } catch {
      throw error;
    }
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
