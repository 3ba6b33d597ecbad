import type { Kysely } from 'kysely';
import type { Database } from '../schema/database.js';

/** The pool could not hand out a second connection in time (a pool of one, or every client busy). */
export class NoSecondConnectionError extends Error {
  constructor(readonly waitMs: number) {
    super(`no second connection from the store's pool within ${waitMs} ms (poolSize 1, or every connection busy)`);
  }
}

/**
 * Runs `fn` on another connection from `db`'s pool while the caller holds one. Fails with
 * `NoSecondConnectionError` if none is handed out within `waitMs`; a connection handed out later
 * is released untouched.
 */
export async function onSecondConnection<T>(
  db: Kysely<Database>,
  waitMs: number,
  fn: (conn: Kysely<Database>) => Promise<T>,
): Promise<T> {
  let abandoned = false;
  let acquired!: () => void;
  const gotConnection = new Promise<'acquired'>((resolve) => (acquired = () => resolve('acquired')));
  const attempt = db.connection().execute(async (conn) => {
    if (abandoned) return undefined as T;
    acquired();
    return fn(conn);
  });
  attempt.catch(() => {});
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<'timeout'>((resolve) => (timer = setTimeout(() => resolve('timeout'), waitMs)));
  const first = await Promise.race([
    gotConnection,
    attempt.then(
      () => 'acquired' as const,
      () => 'acquired' as const,
    ),
    timeout,
  ]);
  clearTimeout(timer);
  if (first === 'timeout') {
    abandoned = true;
    throw new NoSecondConnectionError(waitMs);
  }
  return attempt;
}
