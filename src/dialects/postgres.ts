import pg from 'pg';
import { Kysely, PostgresDialect, sql, type Transaction } from 'kysely';
import type { Database as Schema } from '../schema/database.js';
import type { SchemaDescription } from '../schema/describe.js';
import { DatabaseUnavailableError, ForeignTransactionError, MigrationLockTimeoutError } from '../errors.js';
import { redactDatabaseUrl } from '../config.js';
import { describePostgresSchema } from './postgres-describe.js';
import { hostPool } from './host-pool.js';
import { TaskfenceSchemaPlugin, confineIntrospection, validateSchemaName } from './schema.js';
import { POSTGRES_COLUMN_TYPES } from './recording.js';
import { retryTransient } from './retry.js';
import {
  DEFAULT_WRITE_DEADLINE_MS,
  queryLogger,
  type DialectOptions,
  type DialectStats,
  type ErrorKind,
  type StoreDialect,
  type WriteTransactionFn,
  type WriteTransactionOptions,
} from './types.js';

const RETRYABLE: ReadonlySet<ErrorKind> = new Set(['serialization', 'deadlock']);
const INT8_OID = 20;

/** Reads bigint (int8) columns back as numbers: epoch milliseconds and counts stay far below 2^53. */
const types = {
  getTypeParser: ((oid: number, format?: 'text' | 'binary') =>
    oid === INT8_OID && format !== 'binary'
      ? (value: string) => Number(value)
      : pg.types.getTypeParser(oid, format as 'text')) as typeof pg.types.getTypeParser,
};

function connectionConfig(connectionString: string, options: DialectOptions): pg.ClientConfig {
  const settings = [
    `-c lock_timeout=${options.lockTimeoutMs ?? 10_000}`,
    `-c statement_timeout=${options.statementTimeoutMs ?? 60_000}`,
  ];
  return { connectionString, types, options: settings.join(' '), application_name: 'taskfence' };
}

/** Opens a pg pool and wraps it as a `StoreDialect`; fails with `DatabaseUnavailableError` if the server does not answer. */
export async function openPostgresDialect(connectionString: string, options: DialectOptions = {}): Promise<StoreDialect> {
  // With the host's pool, sessions of taskfence's own (the migration lock) use the pool's settings.
  const config = options.pool ? { ...options.pool.options, types } : connectionConfig(connectionString, options);
  const pool = options.pool ? hostPool(options.pool, types) : new pg.Pool({ ...config, max: options.poolSize ?? 10 });
  // An idle client that loses its server must not crash the process.
  if (pool instanceof pg.Pool) pool.on('error', () => {});
  try {
    const client = await pool.connect();
    client.release();
  } catch (error) {
    await pool.end().catch(() => {});
    throw new DatabaseUnavailableError(redactDatabaseUrl(connectionString), error);
  }
  const schema = options.schema === undefined ? undefined : validateSchemaName(options.schema);
  const db = new Kysely<Schema>({
    dialect: confineIntrospection(new PostgresDialect({ pool }), schema),
    plugins: schema === undefined ? [] : [new TaskfenceSchemaPlugin(schema)],
    log: queryLogger(options.onQuery),
  });
  return new PostgresStoreDialect(db, config, options.writeDeadlineMs ?? DEFAULT_WRITE_DEADLINE_MS, schema);
}

class PostgresStoreDialect implements StoreDialect {
  readonly kind = 'postgres' as const;
  readonly columnTypes = POSTGRES_COLUMN_TYPES;
  readonly stats: DialectStats = { retries: 0 };

  constructor(
    readonly db: Kysely<Schema>,
    private readonly config: pg.ClientConfig,
    private readonly writeDeadlineMs: number,
    /** The configured schema; lock keys and introspection are confined to it. */
    private readonly schema?: string,
  ) {}

  writeTransaction<T>(fn: WriteTransactionFn<T>, options?: WriteTransactionOptions): Promise<T> {
    const run: WriteTransactionFn<T> = options?.bulk
      ? async (trx) => {
          await sql`set local jit = off`.execute(trx);
          return fn(trx);
        }
      : fn;
    return retryTransient(
      () => this.db.transaction().execute(run),
      (e) => this.classifyError(e),
      RETRYABLE,
      options?.deadlineMs ?? this.writeDeadlineMs,
      this.stats,
    );
  }

  readTransaction<T>(fn: WriteTransactionFn<T>): Promise<T> {
    return retryTransient(
      () => this.db.transaction().setIsolationLevel('repeatable read').setAccessMode('read only').execute(fn),
      (e) => this.classifyError(e),
      RETRYABLE,
      this.writeDeadlineMs,
      this.stats,
    );
  }

  async lockKey(trx: Transaction<Schema>, key: string): Promise<void> {
    // With a configured schema, two installs in one database never share a key.
    const scoped = this.schema === undefined ? key : `${this.schema}:${key}`;
    await sql`select pg_advisory_xact_lock(hashtextextended(${scoped}, 0))`.execute(trx);
  }

  joinTransaction(trx: Transaction<Schema>): { readonly db: Transaction<Schema>; isActive(): boolean } {
    if (!(trx as Partial<Transaction<Schema>> | null)?.isTransaction || typeof trx.withoutPlugins !== 'function') {
      throw new ForeignTransactionError('it is not a Kysely transaction (pass the trx of db.transaction().execute(async (trx) => …))');
    }
    // The host's plugins (CamelCasePlugin, …) must not rewrite taskfence's statements.
    const db = trx.withoutPlugins();
    return { db: this.schema === undefined ? db : db.withPlugin(new TaskfenceSchemaPlugin(this.schema)), isActive: () => true };
  }

  classifyError(error: unknown): ErrorKind {
    const code = (error as { code?: unknown } | null)?.code;
    if (typeof code === 'string') {
      if (code === '40001') return 'serialization';
      if (code === '40P01') return 'deadlock';
      if (code === '23505') return 'unique_violation';
      if (code === '23503') return 'foreign_key_violation';
      if (code === '23514' || code === '23502') return 'check_violation';
      if (code === '55P03') return 'lock_timeout';
      if (code.startsWith('08') || code === '57P01' || code === '57P02' || code === '57P03') return 'connection_lost';
      if (code === 'ECONNREFUSED' || code === 'ECONNRESET' || code === 'ENOTFOUND' || code === 'EPIPE') return 'connection_lost';
    }
    const message = error instanceof Error ? error.message : '';
    if (/Connection terminated|Client has encountered a connection error/i.test(message)) return 'connection_lost';
    return 'unknown';
  }

  async withMigrationLock<T>(fn: () => Promise<T>, timeoutMs: number): Promise<T> {
    // A dedicated session so the lock outlives each migration's own transaction, taken by
    // polling a try-lock: a blocked pg_advisory_lock waiter can deadlock against DDL.
    const client = new pg.Client(this.config);
    client.on('error', () => {});
    await client.connect();
    const key = sql`hashtextextended('taskfence:migrate:' || ${this.schema === undefined ? sql`current_schema()` : this.schema}, 0)`;
    try {
      const started = Date.now();
      let backoff = 20;
      for (;;) {
        const compiled = sql<{ locked: boolean }>`select pg_try_advisory_lock(${key}) as locked`.compile(this.db);
        const { rows } = await client.query<{ locked: boolean }>(compiled.sql, [...compiled.parameters]);
        if (rows[0]?.locked) break;
        if (Date.now() - started >= timeoutMs) throw new MigrationLockTimeoutError(timeoutMs);
        await new Promise((resolve) => setTimeout(resolve, backoff * (0.5 + Math.random())));
        backoff = Math.min(backoff * 2, 500);
      }
      try {
        return await fn();
      } finally {
        const unlock = sql`select pg_advisory_unlock(${key})`.compile(this.db);
        await client.query(unlock.sql, [...unlock.parameters]).catch(() => {});
      }
    } finally {
      await client.end().catch(() => {});
    }
  }

  describeSchema(): Promise<SchemaDescription> {
    return describePostgresSchema(this.db, this.schema);
  }

  async readUserVersion(): Promise<number | null> {
    return null;
  }

  async close(): Promise<void> {
    await this.db.destroy();
  }
}
