import type pg from 'pg';
import type { PostgresPool, PostgresPoolClient } from 'kysely';

/**
 * A host's `pg.Pool` as Kysely sees it: every query carries taskfence's type parsers (int8 as a
 * number; the host's pool keeps its own for its own queries), and `end()` does nothing, so
 * closing the store leaves the host's pool open.
 */
export function hostPool(pool: pg.Pool, types: pg.CustomTypesConfig): PostgresPool {
  return {
    async connect(): Promise<PostgresPoolClient> {
      const client = await pool.connect();
      return {
        query: ((textOrCursor: unknown, values?: unknown[]) =>
          typeof textOrCursor === 'string'
            ? client.query({ text: textOrCursor, values, types })
            : client.query(textOrCursor as pg.Submittable)) as unknown as PostgresPoolClient['query'],
        release: (destroy?: boolean | Error) => client.release(destroy),
      };
    },
    async end(): Promise<void> {},
  };
}
