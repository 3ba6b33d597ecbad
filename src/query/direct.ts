import type { Kysely } from 'kysely';
import type { SynchronousConnection } from '../dialects/sqlite/sqlite-driver.js';

/*
 * Kysely instances that only ever run on one synchronous connection their owner already holds
 * (SQLite's write-transaction Kysely). Prepared queries executed on such an instance run straight
 * on the connection, skipping Kysely's async connection provider; nothing else differs (no
 * Kysely plugins are used, so there is no result transformation to skip).
 */
const CONNECTIONS = new WeakMap<Kysely<any>, SynchronousConnection>();

/** @internal Declares that `db` always runs on `connection`, held by whoever runs queries on `db`. */
export function runsOnConnection(db: Kysely<any>, connection: SynchronousConnection): void {
  CONNECTIONS.set(db, connection);
}

/** @internal The connection `db` always runs on, if it was declared with `runsOnConnection`. */
export function connectionOf(db: Kysely<any>): SynchronousConnection | undefined {
  return CONNECTIONS.get(db);
}
