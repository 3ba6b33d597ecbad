import type BetterSqlite3 from 'better-sqlite3';
import { DriverNotInstalledError, driverCodeOf } from '../../errors.js';

/**
 * Loads better-sqlite3, an optional peer dependency: PostgreSQL-only apps never install (nor
 * compile) it, so it is imported only when a `sqlite:` URL is opened. Missing, it is a
 * `DriverNotInstalledError` saying what to install; any other load failure (a build for another
 * Node version, say) is rethrown as it is.
 */
export async function loadBetterSqlite3(target: string): Promise<typeof BetterSqlite3> {
  try {
    return (await import('better-sqlite3')).default;
  } catch (error) {
    if (isMissingPackage(error, 'better-sqlite3')) throw new DriverNotInstalledError('better-sqlite3', target, error);
    throw error;
  }
}

/** Whether `error` says `name` itself cannot be found (not one of its own dependencies). */
function isMissingPackage(error: unknown, name: string): boolean {
  const code = driverCodeOf(error);
  if (code !== 'ERR_MODULE_NOT_FOUND' && code !== 'MODULE_NOT_FOUND') return false;
  const message = error instanceof Error ? error.message : String(error);
  return message.includes(`'${name}'`);
}
