import Database from 'better-sqlite3';
import pg from 'pg';

/**
 * The raw-driver side of each comparison: a hand-written client that issues SQL text directly,
 * with the same connection settings taskfence uses. SQLite statements are prepared once;
 * transactions are `BEGIN IMMEDIATE … COMMIT` as in taskfence.
 */
export interface RawClient {
  readonly kind: 'sqlite' | 'postgres';
  /** Runs statements in one write transaction; returns each statement's rows. */
  tx(statements: readonly (readonly [sql: string, params: readonly unknown[]])[]): Promise<unknown[][]>;
  /** Runs `fn` in one write transaction, for baselines that branch on what they read. */
  txWith<T>(fn: (run: (sql: string, params: readonly unknown[]) => Promise<unknown[]>) => Promise<T>): Promise<T>;
  query(sql: string, params?: readonly unknown[]): Promise<unknown[]>;
  close(): Promise<void>;
}

export function openRawSqlite(file: string): RawClient {
  const db = new Database(file, { timeout: 250 });
  db.pragma('journal_mode = WAL');
  db.pragma('foreign_keys = ON');
  // The same durability as a store opened with the default `durability: 'full'`.
  db.pragma('synchronous = FULL');
  const cache = new Map<string, Database.Statement>();
  const prepare = (text: string) => {
    let stmt = cache.get(text);
    if (!stmt) cache.set(text, (stmt = db.prepare(text)));
    return stmt;
  };
  const run = (text: string, params: readonly unknown[]) => {
    const stmt = prepare(text);
    return stmt.reader ? stmt.all(...params) : (stmt.run(...params), []);
  };
  const txFn = db.transaction((statements: readonly (readonly [string, readonly unknown[]])[]) =>
    statements.map(([t, p]) => run(t, p)),
  );
  const begin = db.prepare('begin immediate');
  const commit = db.prepare('commit');
  const rollback = db.prepare('rollback');
  return {
    kind: 'sqlite',
    async tx(statements) {
      return txFn.immediate(statements);
    },
    async txWith(fn) {
      begin.run();
      try {
        const result = await fn(async (text, params) => run(text, params));
        commit.run();
        return result;
      } catch (error) {
        if (db.inTransaction) rollback.run();
        throw error;
      }
    },
    async query(text, params = []) {
      return run(text, params);
    },
    async close() {
      db.close();
    },
  };
}

export async function openRawPostgres(url: string): Promise<RawClient> {
  const client = new pg.Client({
    connectionString: url,
    options: '-c lock_timeout=10000 -c statement_timeout=60000',
    types: {
      getTypeParser: ((oid: number, format?: 'text' | 'binary') =>
        oid === 20 ? (v: string) => Number(v) : pg.types.getTypeParser(oid, format)) as typeof pg.types.getTypeParser,
    },
  });
  await client.connect();
  return {
    kind: 'postgres',
    async tx(statements) {
      await client.query('begin');
      try {
        const out: unknown[][] = [];
        for (const [text, params] of statements) out.push((await client.query(text, params as unknown[])).rows);
        await client.query('commit');
        return out;
      } catch (error) {
        await client.query('rollback');
        throw error;
      }
    },
    async txWith(fn) {
      await client.query('begin');
      try {
        const result = await fn(async (text, params) => (await client.query(text, params as unknown[])).rows);
        await client.query('commit');
        return result;
      } catch (error) {
        await client.query('rollback');
        throw error;
      }
    },
    async query(text, params = []) {
      return (await client.query(text, params as unknown[])).rows;
    },
    async close() {
      await client.end();
    },
  };
}

/** `?` placeholders for SQLite, `$n` for PostgreSQL. */
export function placeholders(kind: RawClient['kind'], sqlText: string): string {
  if (kind === 'sqlite') return sqlText;
  let n = 0;
  return sqlText.replace(/\?/g, () => `$${++n}`);
}
