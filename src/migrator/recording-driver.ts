import {
  Kysely,
  PostgresAdapter,
  PostgresIntrospector,
  PostgresQueryCompiler,
  SqliteAdapter,
  SqliteIntrospector,
  SqliteQueryCompiler,
  type CompiledQuery,
  type DatabaseConnection,
  type Driver,
  type QueryResult,
} from 'kysely';
import type { StoreDialect } from '../dialects/types.js';

/**
 * A Kysely instance that compiles queries exactly as the given dialect would, records them in
 * `log` instead of running them, and answers every query with no rows. The migration engine
 * uses it for checksums and for `plan`.
 */
export function createRecordingKysely(
  kind: StoreDialect['kind'],
  log: CompiledQuery[],
  /** Answers a query instead of "no rows" (plan runs the reads a migration makes against the live database). */
  answer?: (query: CompiledQuery) => Promise<QueryResult<any> | undefined>,
): Kysely<any> {
  const driver: Driver = {
    async init() {},
    async acquireConnection(): Promise<DatabaseConnection> {
      return {
        async executeQuery(query) {
          log.push(query);
          return (await answer?.(query)) ?? { rows: [] };
        },
        async *streamQuery() {},
      };
    },
    async beginTransaction() {},
    async commitTransaction() {},
    async rollbackTransaction() {},
    async releaseConnection() {},
    async destroy() {},
  };
  return new Kysely<any>({
    dialect:
      kind === 'sqlite'
        ? {
            createAdapter: () => new SqliteAdapter(),
            createDriver: () => driver,
            createIntrospector: (db) => new SqliteIntrospector(db),
            createQueryCompiler: () => new SqliteQueryCompiler(),
          }
        : {
            createAdapter: () => new PostgresAdapter(),
            createDriver: () => driver,
            createIntrospector: (db) => new PostgresIntrospector(db),
            createQueryCompiler: () => new PostgresQueryCompiler(),
          },
  });
}

/**
 * Renders a compiled query with its parameters inlined as SQL literals (`?` for SQLite, `$n`
 * for PostgreSQL), skipping placeholders inside quoted strings and identifiers.
 */
export function inlineParameters(kind: StoreDialect['kind'], query: CompiledQuery): string {
  const params = query.parameters;
  let out = '';
  let quote: string | null = null;
  let positional = 0;
  const text = query.sql;
  for (let i = 0; i < text.length; i++) {
    const ch = text[i]!;
    if (quote) {
      out += ch;
      if (ch === quote) quote = null;
      continue;
    }
    if (ch === "'" || ch === '"') {
      quote = ch;
      out += ch;
      continue;
    }
    if (kind === 'sqlite' && ch === '?') {
      out += literal(params[positional++]);
      continue;
    }
    if (kind === 'postgres' && ch === '$') {
      const m = /^\$(\d+)/.exec(text.slice(i));
      if (m) {
        out += literal(params[Number(m[1]) - 1]);
        i += m[0].length - 1;
        continue;
      }
    }
    out += ch;
  }
  return out;
}

function literal(value: unknown): string {
  if (value === null || value === undefined) return 'NULL';
  if (typeof value === 'number' || typeof value === 'bigint') return String(value);
  if (typeof value === 'boolean') return value ? '1' : '0';
  // eslint-disable-next-line @typescript-eslint/no-base-to-string -- migrations bind strings, numbers and dates only
  return `'${String(value).replace(/'/g, "''")}'`;
}
