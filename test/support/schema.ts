/**
 * Raw SQL in test code when the PostgreSQL suites run in a schema (TEST_PG_SCHEMA, `?schema=`):
 * taskfence qualifies every table it names, so test code that reads or writes its tables with
 * raw SQL must name the same schema, or it would see the host's `public` tables (the CI pass puts
 * a decoy `public.tasks` there).
 */
import { sql, type Kysely, type RawBuilder } from 'kysely';
import type pg from 'pg';
import { schemaOf, tableIn } from '../../src/query/schema.js';

/**
 * `name` (a table or index) as raw SQL for statements run on `db` (a store's `db`, or a
 * transaction on it): `"schema"."name"` when the store is confined to a schema, else `name`.
 */

export function tbl(db: Kysely<any>, name: string): RawBuilder<unknown> {
  return tableIn(db, name);
}

/** `name` as text for `::regclass`: `schema.name` when `db` is confined to a schema, else `name`. */

export function qualifiedName(db: Kysely<any>, name: string): string {
  const schema = schemaOf(db);
  return schema === undefined ? name : `${schema}.${name}`;
}

/** The schema `url` confines taskfence to (its `?schema=`), if any. */
export function schemaOfUrl(url: string): string | undefined {
  return new URL(url).searchParams.get('schema') ?? undefined;
}

/**
 * Runs `fn` in a transaction on `db` whose unqualified names resolve in `db`'s schema (`set local
 * search_path`), for long raw SQL written without qualifiers (a legacy baseline, invariant checks).
 * Creates the schema if it is missing. Without a schema, `fn(db)` as it is.
 */

export async function inStoreSchema<T>(db: Kysely<any>, fn: (trx: Kysely<any>) => Promise<T>): Promise<T> {
  const schema = schemaOf(db);
  if (schema === undefined) return fn(db);
  return db.transaction().execute(async (trx) => {
    // A store creates its schema when it migrates: raw DDL before that needs it first.
    await sql`create schema if not exists ${sql.id(schema)}`.execute(trx);
    await sql`select set_config('search_path', ${schema}, true)`.execute(trx);
    return fn(trx);
  });
}

/** Points a raw `pg` client opened on `url` at `url`'s schema (session `search_path`), if it has one. */
export async function useUrlSchema(client: pg.Client | pg.PoolClient, url: string): Promise<void> {
  const schema = schemaOfUrl(url);
  if (schema !== undefined) await client.query(`select set_config('search_path', $1, false)`, [schema]);
}

/**
 * `name` as migrate and plan print it, as a regular-expression source: `"schema"\."name"` when
 * `schema` is set, else `"name"`. Pass `schemaOf(db)` or `schemaOfUrl(url)`.
 */
export function quotedTablePattern(schema: string | undefined, name: string): string {
  const quoted = schema === undefined ? `"${name}"` : `"${schema}"."${name}"`;
  return quoted.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}
