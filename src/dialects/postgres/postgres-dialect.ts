import pg from 'pg';
import {
  CompiledQuery,
  Kysely,
  PostgresAdapter,
  PostgresIntrospector,
  PostgresQueryCompiler,
  sql,
  type Expression,
  type QueryResult,
  type RawBuilder,
  type Transaction,
} from 'kysely';
import type { Database as Schema } from '../../schema/database.js';
import type { SchemaDescription } from '../../schema/describe.js';
import {
  DatabaseUnavailableError,
  ForeignTransactionError,
  InvalidArgumentError,
  LockTimeoutError,
  MigrationLockTimeoutError,
  PermissionDeniedError,
  ReadOnlyError,
  StatementTimeoutError,
  StorageFullError,
  TaskfenceError,
  driverCodeOf,
} from '../../errors.js';
import {
  BEGIN_LOCKS,
  FaultTolerantPostgresDriver,
  SERVER_NOW_SQL,
  ServerClockOffset,
  classifyPostgresError,
  clientQueryTimeoutMs,
} from './postgres-driver.js';
import { parseDatabaseUrl, redactDatabaseUrl } from '../../config.js';
import { describePostgresSchema } from './postgres-describe.js';
import { hostPool, int8AsNumbers } from './host-pool.js';
import { runBound } from '../../query/prepared.js';
import { HostRouter, parsePostgresHostList } from './hosts.js';
import { TaskfenceSchemaPlugin, confineIntrospection, validateSchemaName } from '../../query/schema.js';
import { POSTGRES_COLUMN_TYPES } from './postgres-column-types.js';
import { Backoff } from '../backoff.js';
import { retryTransient } from '../retry.js';
import { DEFAULT_WAKE_FALLBACK_MS } from '../wakeups.js';
import { PostgresWakeups } from './postgres-wakeups.js';
import {
  DEFAULT_WRITE_DEADLINE_MS,
  queryLogger,
  type DialectObservers,
  type DialectOptions,
  type DialectStats,
  type ErrorKind,
  type JoinedTransaction,
  type MigrationLockHolder,
  type MigrationLockOptions,
  type StoreDialect,
  type WriteTransactionFn,
  type WriteTransactionOptions,
} from '../types.js';
import { MIGRATION_LOCK_PREFIX, migrationLockKey, schemaLockKey } from '../../protocol.js';
import { extend } from '../../objects.js';

/** The migration lock's key: one per schema, so two schemas in one database migrate independently. */
const MIGRATION_KEY = sql`hashtextextended(${sql.lit(MIGRATION_LOCK_PREFIX)} || current_schema(), 0)`;
/**
 * The migration lock key of an install in a configured schema (else `MIGRATION_KEY`: the current
 * schema). A literal, never a bind parameter: a parameterized statement (extended protocol) leaves
 * its transaction holding a snapshot (`backend_xmin`) while idle, and a migrator polling for the
 * lock inside its transaction would then make the holder's `CREATE INDEX CONCURRENTLY` wait for
 * it: each waits for the other until the lock wait times out.
 */
const migrationKey = (schema: string | undefined) =>
  schema === undefined ? MIGRATION_KEY : sql`hashtextextended(${sql.lit(migrationLockKey(schema))}, 0)`;
/** Retried as a whole within the write deadline: each of these guarantees the transaction changed nothing. */
const RETRYABLE: ReadonlySet<ErrorKind> = new Set(['serialization', 'deadlock', 'connection_lost']);
const INT8_OID = 20;
/** The level every write transaction states in its BEGIN (see `writeTransaction`). */
const WRITE_ISOLATION = 'read committed';
/** Reads that must agree with each other run on one snapshot, and write nothing. */
const READ_ISOLATION = 'repeatable read';

/** Reads bigint (int8) columns back as numbers: epoch milliseconds and counts stay far below 2^53. */
const types = {
  getTypeParser: ((oid: number, format?: 'text' | 'binary') =>
    // eslint-disable-next-line @typescript-eslint/no-unsafe-return -- pg's own parsers are typed `any`
    oid === INT8_OID && format !== 'binary'
      ? (value: string) => Number(value)
      : pg.types.getTypeParser(oid, format)) as typeof pg.types.getTypeParser,
};

/**
 * The pg client configuration: no startup parameters (transaction-mode poolers reject them;
 * timeouts are set with SET LOCAL per transaction), a connect timeout, TCP keepalive, and a
 * client-side query timeout a little above statement_timeout, so a silent network cannot hang a call.
 */
export function postgresClientConfig(connectionString: string, options: DialectOptions): pg.ClientConfig {
  return {
    connectionString,
    types,
    application_name: 'taskfence',
    connectionTimeoutMillis: options.connectTimeoutMs ?? 10_000,
    keepAlive: true,
    keepAliveInitialDelayMillis: 10_000,
    ...(clientQueryTimeoutMs(statementTimeoutOf(options)) > 0
      ? { query_timeout: clientQueryTimeoutMs(statementTimeoutOf(options)) }
      : {}),
  };
}

function statementTimeoutOf(options: DialectOptions): number {
  return options.statementTimeoutMs ?? 60_000;
}

/**
 * The client configuration of the `LISTEN` connection when `listenUrl` is given: a PostgreSQL URL
 * that reaches the store's own database on the same server (else notifications would never
 * arrive, and waiters would quietly poll). The server is told apart by its start time, which every
 * role may read (a pooler in between changes neither). Opens one connection to check, and closes it.
 */
/** The database and its server (by start time), e.g. `"app" (server started 2026-12-01 16:32:28.26+00)`. */
const WHICH_DATABASE_SQL = `select quote_ident(current_database()) || ' (server started ' || pg_postmaster_start_time() || ')' as name`;

async function checkedListenConfig(
  listenUrl: string,
  options: DialectOptions,
  pool: pg.Pool,
  target: string,
): Promise<pg.ClientConfig> {
  let location;
  try {
    location = parseDatabaseUrl(listenUrl);
  } catch (error) {
    throw new InvalidArgumentError('listenUrl', (error as Error).message.replace(/\.$/, ''));
  }
  if (location.dialect !== 'postgres') {
    throw new InvalidArgumentError('listenUrl', "it must be a postgres:// URL to the store's database");
  }
  if (parsePostgresHostList(location.connectionString) !== undefined) {
    throw new InvalidArgumentError('listenUrl', 'it must name one host (a host list is for the store URL)');
  }
  const config = postgresClientConfig(location.connectionString, options);
  const client = new pg.Client(config);
  client.on('error', () => {});
  let listening: string;
  try {
    await client.connect();
    listening = (await client.query<{ name: string }>(WHICH_DATABASE_SQL)).rows[0]!.name;
  } catch (error) {
    throw new DatabaseUnavailableError(redactDatabaseUrl(listenUrl), error);
  } finally {
    await client.end().catch(() => {});
  }
  let own: string;
  try {
    own = (await pool.query<{ name: string }>(WHICH_DATABASE_SQL)).rows[0]!.name;
  } catch (error) {
    throw new DatabaseUnavailableError(target, error);
  }
  if (listening !== own) {
    throw new InvalidArgumentError(
      'listenUrl',
      `it reaches database ${listening}, the store's is ${own}: notifications would never arrive`,
    );
  }
  return config;
}

/**
 * Opens a pg pool and wraps it as a `StoreDialect`, configured once: `observers` hear of its
 * retries and lost idle connections from the start. Fails with `DatabaseUnavailableError` if the
 * server does not answer.
 */
export async function openPostgresDialect(
  connectionString: string,
  options: DialectOptions = {},
  observers: DialectObservers = {},
): Promise<StoreDialect> {
  // A host list (hosts.ts) routes every connection of taskfence's own pool to the acceptable host.
  const hostList = options.pool ? undefined : parsePostgresHostList(connectionString);
  // With the host's pool, sessions of taskfence's own (the migration lock) use the pool's settings.
  const config = options.pool
    ? extend(options.pool.options, { types })
    : postgresClientConfig(hostList?.connectionString ?? connectionString, options);
  const router = hostList ? new HostRouter(hostList, config) : undefined;
  const target = options.pool ? 'postgres (host pool)' : redactDatabaseUrl(connectionString);
  const stats: DialectStats = { retries: 0, ...observers };
  // An idle client that loses its server must not crash the process: pg-pool emits that on the
  // pool and throws when nobody listens. It is reported (`connection.lost`), and the pool drops
  // the client. Checked-out clients get the driver's own listener. On a host's pool the listener
  // is there while the store is open (host-pool.ts).
  const onIdleError = (error: Error) => stats.onIdleConnectionLost?.(error);
  const pool = options.pool
    ? hostPool(options.pool, types, onIdleError)
    : new pg.Pool(extend(config, { max: options.poolSize ?? 10, ...(router ? { Client: router.clientClass() } : {}) }));
  if (!options.pool) {
    pool.on('error', onIdleError);
    // And every client carries a listener from the moment the pool connects it, so a fault can never
    // meet a client between pg-pool's idle listener and the driver's (defence in depth: the fault
    // loop once died of an unhandled 57P01 'error' event under heavy load, path not identified).
    pool.on('connect', (client) => client.on('error', () => {}));
  }
  const offset = new ServerClockOffset(options.hostClock ?? { now: () => Date.now() });
  const driver = new FaultTolerantPostgresDriver({
    pool,
    target,
    offset,
    ...(router ? { hosts: router } : {}),
    limits: { lockTimeoutMs: options.lockTimeoutMs ?? 10_000, statementTimeoutMs: statementTimeoutOf(options) },
  });
  try {
    // Reach the server once at open, and learn its clock.
    const connection = await driver.acquireConnection();
    try {
      const sentAt = offset.host.now();
      const { rows } = await connection.executeQuery<{ server_now: number }>(CompiledQuery.raw(SERVER_NOW_SQL));
      offset.observe(sentAt, rows[0]?.server_now);
    } finally {
      await driver.releaseConnection(connection);
    }
  } catch (error) {
    await pool.end().catch(() => {});
    throw error instanceof DatabaseUnavailableError ? error : new DatabaseUnavailableError(target, error);
  }
  let listenConfig = config;
  if (options.listenUrl !== undefined) {
    try {
      listenConfig = await checkedListenConfig(options.listenUrl, options, pool, target);
    } catch (error) {
      await pool.end().catch(() => {});
      throw error;
    }
  }
  const schema = options.schema === undefined ? undefined : validateSchemaName(options.schema);
  const db = new Kysely<Schema>({
    dialect: confineIntrospection(
      {
        createAdapter: () => new PostgresAdapter(),
        createDriver: () => driver,
        createIntrospector: (k) => new PostgresIntrospector(k),
        createQueryCompiler: () => new PostgresQueryCompiler(),
      },
      schema,
    ),
    plugins: schema === undefined ? [] : [new TaskfenceSchemaPlugin(schema)],
    log: queryLogger(options.onQuery),
  });
  return new PostgresStoreDialect({
    db,
    clientConfig: config,
    writeDeadlineMs: options.writeDeadlineMs ?? DEFAULT_WRITE_DEADLINE_MS,
    clock: offset,
    wakeups: new PostgresWakeups({
      clientConfig: listenConfig,
      fallbackMs: options.wakeFallbackMs ?? DEFAULT_WAKE_FALLBACK_MS,
      enabled: options.wakeNotifications ?? true,
      schema,
      // The LISTEN connection follows the host list too, unless listenUrl names its own server.
      Client: router && options.listenUrl === undefined ? router.clientClass() : pg.Client,
    }),
    stats,
    target,
    schema,
    sessionClient: router ? router.clientClass() : pg.Client,
    pool: options.pool ?? pool,
  });
}

/** What a `PostgresStoreDialect` is built from: everything `openPostgresDialect` decided, fixed from then on. */
interface PostgresDialectConfig {
  readonly db: Kysely<Schema>;
  /** The pool's client configuration, for dedicated connections (the migration lock, the schema version read). */
  readonly clientConfig: pg.ClientConfig;
  readonly writeDeadlineMs: number;
  /** The database's clock (host clock + measured offset): what leases and heartbeats are judged on. */
  readonly clock: ServerClockOffset;
  readonly wakeups: PostgresWakeups;
  /** The counters, with the observers the dialect was opened with (the pool's idle-error listener reports to them too). */
  readonly stats: DialectStats;
  /** The server, redacted, for the typed errors. */
  readonly target: string;
  /** The configured schema; lock keys and introspection are confined to it. */
  readonly schema: string | undefined;
  /** The client class of taskfence's own sessions (the migration lock's guard): the host list's, if any. */
  readonly sessionClient: typeof pg.Client;
  /** The pool `connectionStats` counts: the host's, or taskfence's own. */
  readonly pool: pg.Pool;
}

class PostgresStoreDialect implements StoreDialect {
  readonly kind = 'postgres' as const;
  readonly columnTypes = POSTGRES_COLUMN_TYPES;
  readonly supportsSkipLocked = true;
  readonly insertReturnsSeq = true;
  readonly writableCtes = true;
  readonly db: Kysely<Schema>;
  readonly clock: ServerClockOffset;
  readonly wakeups: PostgresWakeups;
  readonly stats: DialectStats;
  readonly #config: PostgresDialectConfig;

  constructor(config: PostgresDialectConfig) {
    this.#config = Object.freeze({ ...config });
    this.db = config.db;
    this.clock = config.clock;
    this.wakeups = config.wakeups;
    this.stats = config.stats;
  }

  connectionStats(): { total: number; idle: number; waiting: number } {
    const { pool } = this.#config;
    return { total: pool.totalCount, idle: pool.idleCount, waiting: pool.waitingCount };
  }

  /**
   * Always `BEGIN ISOLATION LEVEL READ COMMITTED`, whatever the database's
   * `default_transaction_isolation` says: every guarantee is proven at READ COMMITTED, where a
   * statement after an advisory-lock wait sees what the lock's previous holder committed (under
   * REPEATABLE READ the snapshot taken by BEGIN's own SELECT would hide it, and path leases
   * overlapped). Retried whole within the deadline on serialization failures, deadlocks and
   * connection loss before COMMIT was sent (each left nothing behind), each attempt on a fresh
   * connection. Loss while COMMIT was in flight is `CommitOutcomeUnknownError` and is never retried.
   */
  writeTransaction<T>(fn: WriteTransactionFn<T>, options?: WriteTransactionOptions): Promise<T> {
    const run: WriteTransactionFn<T> = options?.bulk
      ? async (trx) => {
          await sql`set local jit = off`.execute(trx);
          return fn(trx);
        }
      : fn;
    const keys = (options?.lockKeys ?? []).map((key) => schemaLockKey(this.#config.schema, key));
    const first: readonly CompiledQuery[] =
      options?.first === undefined
        ? []
        : Array.isArray(options.first)
          ? options.first
          : [options.first as CompiledQuery];
    const commit = options?.commit === true && first.length > 0;
    const attempt = () => this.db.transaction().setIsolationLevel(WRITE_ISOLATION).execute(run);
    return retryTransient(
      // Each attempt begins anew, so each takes the keys (and sends `first`) in its own BEGIN, and
      // collects its own statements for COMMIT (not for host code, which reads after its calls).
      () =>
        BEGIN_LOCKS.run(
          {
            keys,
            first,
            commit,
            results: new Map(),
            committed: false,
            taken: false,
            ...(options?.hostCode ? {} : { trailing: [] as CompiledQuery[] }),
          },
          attempt,
        ),
      (e) => this.classifyError(e),
      RETRYABLE,
      options?.deadlineMs ?? this.#config.writeDeadlineMs,
      this.stats,
    );
  }

  readTransaction<T>(fn: WriteTransactionFn<T>): Promise<T> {
    // Outside any write transaction's BEGIN_LOCKS: a read begun inside one (another connection)
    // must neither skip its COMMIT nor carry that transaction's statements.
    const attempt = () =>
      this.db.transaction().setIsolationLevel(READ_ISOLATION).setAccessMode('read only').execute(fn);
    return retryTransient(
      () => BEGIN_LOCKS.exit(attempt),
      (e) => this.classifyError(e),
      RETRYABLE,
      this.#config.writeDeadlineMs,
      this.stats,
    );
  }

  async lockKey(trx: Transaction<Schema>, key: string): Promise<void> {
    const scoped = this.lockKeyText(key);
    // Taken already by this transaction's BEGIN (`writeTransaction`'s `lockKeys`).
    const begun = BEGIN_LOCKS.getStore();
    if (begun?.taken && begun.keys.includes(scoped)) return;
    await sql`select pg_advisory_xact_lock(hashtextextended(${scoped}, 0))`.execute(trx);
  }

  beginResult<R>(first: CompiledQuery<R>): QueryResult<R> | undefined {
    const begun = BEGIN_LOCKS.getStore();
    const result = begun?.taken ? begun.results.get(first) : undefined;
    if (result) begun!.results.delete(first);
    return result as QueryResult<R> | undefined;
  }

  async commitWith(trx: Transaction<Schema>, statement: CompiledQuery): Promise<void> {
    const begun = BEGIN_LOCKS.getStore();
    if (begun?.committed) throw new TypeError('taskfence: commitWith in a transaction that BEGIN already committed');
    if (begun?.taken && begun.trailing) begun.trailing.push(statement);
    else await runBound(trx, statement);
  }

  lockKeyText(key: string): string {
    // With a configured schema, two installs in one database never share a key.
    return schemaLockKey(this.#config.schema, key);
  }

  lockKeyExpression(key: Expression<string>): RawBuilder<unknown> {
    // The same key string as `lockKey` builds (`schemaLockKey`): the schema prefix, then the key.
    const { schema } = this.#config;
    const scoped = schema === undefined ? key : sql`${schemaLockKey(schema, '')}::text || ${key}`;
    return sql`pg_advisory_xact_lock(hashtextextended(${scoped}, 0))`;
  }

  /**
   * A host transaction joins at the host's isolation level, so `verify` reads it before
   * taskfence's first call and refuses anything but READ COMMITTED: the primitives are proven
   * there, and under a snapshot (REPEATABLE READ, SERIALIZABLE) a check made after an
   * advisory-lock wait misses what the lock's previous holder committed, so leases overlap.
   */
  joinTransaction(trx: Transaction<Schema>): JoinedTransaction {
    if (!(trx as Partial<Transaction<Schema>> | null)?.isTransaction || typeof trx.withoutPlugins !== 'function') {
      throw new ForeignTransactionError(
        'it is not a Kysely transaction (pass the trx of db.transaction().execute(async (trx) => …))',
      );
    }
    // The host's plugins (CamelCasePlugin, …) must not rewrite taskfence's statements.
    const db = trx.withoutPlugins().withPlugin(int8AsNumbers);
    return {
      db: this.#config.schema === undefined ? db : db.withPlugin(new TaskfenceSchemaPlugin(this.#config.schema)),
      isActive: () => true,
      verify: async () => {
        const { rows } = await sql<{
          level: string;
        }>`select current_setting('transaction_isolation') as level`.execute(db);
        const level = rows[0]?.level ?? 'unknown';
        if (level === WRITE_ISOLATION) return;
        throw new ForeignTransactionError(
          `it runs at ${level.toUpperCase()}, and taskfence's guarantees hold at READ COMMITTED only ` +
            `(under a snapshot a check made after a lock wait misses what the lock's previous holder committed, ` +
            `so two holders could be granted overlapping leases); open it with ` +
            `db.transaction().setIsolationLevel('read committed'), or use store.transaction`,
        );
      },
    };
  }

  classifyError(error: unknown): ErrorKind {
    if (error instanceof DatabaseUnavailableError) return error.retrySafe ? 'connection_lost' : 'unknown';
    if (error instanceof LockTimeoutError) return 'lock_timeout';
    if (error instanceof StatementTimeoutError) return 'statement_timeout';
    if (error instanceof StorageFullError) return 'storage_full';
    if (error instanceof ReadOnlyError) return 'read_only';
    if (error instanceof PermissionDeniedError) return 'permission_denied';
    if (error instanceof TaskfenceError) return 'unknown';
    return classifyPostgresError(error);
  }

  async withMigrationLock<T>(fn: WriteTransactionFn<T>, options: MigrationLockOptions): Promise<T> {
    // A transaction-scoped lock, polled with a try-lock: a lost connection releases it with the
    // transaction it guards, and a blocked pg_advisory_xact_lock waiter could deadlock against DDL.
    // Each try is a transaction of its own, ended when it fails: a waiter kept inside one long
    // transaction could be caught mid-poll by the holder's `CREATE INDEX CONCURRENTLY`, which then
    // waits for that whole transaction, while the waiter waits for the holder (until its timeout).
    const tryLock = sql<{
      locked: boolean;
    }>`select pg_try_advisory_xact_lock(${migrationKey(this.#config.schema)}) as locked`;
    let done: { value: T } | null = null;
    await this.#pollMigrationLock(async () => {
      done = await this.writeTransaction(
        async (trx) => {
          if ((await tryLock.execute(trx)).rows[0]?.locked !== true) return null;
          if (options.ddlLockTimeoutMs !== undefined) {
            await sql`select set_config('lock_timeout', ${String(options.ddlLockTimeoutMs)}, true)`.execute(trx);
          }
          return { value: await fn(trx) };
        },
        { deadlineMs: options.waitMs, ...(options.bulk ? { bulk: true } : {}) },
      );
      return done !== null;
    }, options);
    return (done as { value: T } | null)!.value;
  }

  /**
   * The lock is held by a guard transaction on a session of its own (not one of the pool's, so a
   * pool of one still migrates) while `fn` runs outside any transaction on a pooled connection
   * (`CREATE INDEX CONCURRENTLY` refuses a transaction block). Both work through a
   * transaction-mode pooler, where a session lock would be taken on one server connection and
   * released on another. The guard holds no snapshot (its statements carry no bind parameters),
   * so the index build never waits for it; it turns off `idle_in_transaction_session_timeout` for
   * itself, and is checked after `fn`: a guard lost meanwhile fails the step, which is then not
   * recorded. A lost guard connection releases the lock with its transaction.
   */
  async withMigrationSession<T>(fn: (db: Kysely<Schema>) => Promise<T>, options: MigrationLockOptions): Promise<T> {
    const guard = new this.#config.sessionClient(
      extend(this.#config.clientConfig, { application_name: 'taskfence-migrate' }),
    );
    guard.on('error', () => {});
    const query = async (text: string) => {
      try {
        return await guard.query<{ locked?: boolean }>(text);
      } catch (error) {
        throw this.classifyError(error) === 'connection_lost'
          ? new DatabaseUnavailableError(this.#config.target, error, 'migration lock')
          : error;
      }
    };
    try {
      await guard.connect();
    } catch (error) {
      await guard.end().catch(() => {});
      throw new DatabaseUnavailableError(this.#config.target, error, 'connect');
    }
    try {
      const tryLock = sql<{
        locked: boolean;
      }>`select pg_try_advisory_xact_lock(${migrationKey(this.#config.schema)}) as locked`.compile(this.db).sql;
      // Each try is a guard transaction of its own, rolled back when it fails (see withMigrationLock).
      await this.#pollMigrationLock(async () => {
        await query('begin isolation level read committed');
        await query('set local idle_in_transaction_session_timeout = 0');
        if ((await query(tryLock)).rows[0]?.locked === true) return true;
        await query('rollback');
        return false;
      }, options);
      const result = await this.db.connection().execute(async (conn) => {
        try {
          // An index build over a large table may take longer than any statement_timeout the store sets.
          await sql`set statement_timeout = 0`.execute(conn);
          return await fn(conn);
        } finally {
          // Fails only with the connection (a pooler may route it to another server connection,
          // where it is harmless: the store states its timeouts per transaction).
          await sql`reset statement_timeout`.execute(conn).catch(() => {});
        }
      });
      await query('commit');
      return result;
    } catch (error) {
      await guard.query('rollback').catch(() => {});
      throw error;
    } finally {
      await guard.end().catch(() => {});
    }
  }

  /** Polls the migration lock with `tryLock` (never a blocking wait), reporting the holder every few seconds. */
  async #pollMigrationLock(tryLock: () => Promise<boolean>, options: MigrationLockOptions): Promise<void> {
    const started = Date.now();
    const reportEveryMs = options.reportEveryMs ?? 3_000;
    let nextReport = started + reportEveryMs;
    const backoff = new Backoff(20, 250);
    for (;;) {
      if (await tryLock()) return;
      const waited = Date.now() - started;
      if (waited >= options.waitMs) throw new MigrationLockTimeoutError(options.waitMs);
      if (options.onWaiting && Date.now() >= nextReport) {
        options.onWaiting(await this.migrationLockHolder().catch(() => null), waited);
        nextReport = Date.now() + reportEveryMs;
      }
      await new Promise((resolve) => setTimeout(resolve, backoff.next()));
    }
  }

  async indexState(db: Kysely<Schema>, name: string): Promise<'missing' | 'valid' | 'invalid'> {
    const { rows } = await sql<{ valid: boolean }>`
      select i.indisvalid as valid from pg_index i
      join pg_class c on c.oid = i.indexrelid join pg_namespace n on n.oid = c.relnamespace
      where c.relname = ${name} and n.nspname = ${this.#config.schema ?? sql`current_schema()`}`.execute(db);
    const row = rows[0];
    return row === undefined ? 'missing' : row.valid ? 'valid' : 'invalid';
  }

  async constraintValidated(db: Kysely<Schema>, table: string, name: string): Promise<boolean | null> {
    const { rows } = await sql<{ validated: boolean }>`
      select k.convalidated as validated from pg_constraint k
      join pg_class c on c.oid = k.conrelid join pg_namespace n on n.oid = c.relnamespace
      where k.conname = ${name} and c.relname = ${table} and n.nspname = ${this.#config.schema ?? sql`current_schema()`}`.execute(
      db,
    );
    return rows[0]?.validated ?? null;
  }

  /** Who holds the migration lock now (`pg_locks` + `pg_stat_activity`), or null. */
  async migrationLockHolder(): Promise<MigrationLockHolder | null> {
    const { rows } = await sql<{
      pid: number;
      application_name: string | null;
      xact_start: Date | null;
      client_addr: string | null;
    }>`
      select a.pid, a.application_name, a.xact_start, a.client_addr::text as client_addr
      from pg_locks l join pg_stat_activity a on a.pid = l.pid
      where l.locktype = 'advisory' and l.granted and l.objsubid = 1
        and l.database = (select oid from pg_database where datname = current_database())
        and ((l.classid::bigint << 32) | l.objid::bigint) = ${migrationKey(this.#config.schema)}
      limit 1`.execute(this.db);
    const row = rows[0];
    if (!row) return null;
    return {
      pid: row.pid,
      application: row.application_name ?? '',
      since: row.xact_start ? new Date(row.xact_start).getTime() : null,
      clientAddress: row.client_addr,
    };
  }

  describeSchema(): Promise<SchemaDescription> {
    return describePostgresSchema(this.db, this.#config.schema);
  }

  async readSchemaVersion(): Promise<number> {
    const client = new pg.Client(this.#config.clientConfig);
    client.on('error', () => {});
    try {
      await client.connect();
    } catch (error) {
      await client.end().catch(() => {});
      throw new DatabaseUnavailableError(this.#config.target, error, 'connect', true);
    }
    const table =
      this.#config.schema === undefined
        ? 'taskfence_migrations'
        : `${quoteIdentifier(this.#config.schema)}.taskfence_migrations`;
    try {
      const { rows } = await client.query<{ version: number | null }>(`select max(version) as version from ${table}`);
      return Number(rows[0]?.version ?? 0);
    } catch (error) {
      const code = driverCodeOf(error);
      // No history table (or no schema yet): a database taskfence never migrated.
      if (code === '42P01' || code === '3F000') return 0;
      const kind = classifyPostgresError(error);
      if (kind === 'connection_lost')
        throw new DatabaseUnavailableError(this.#config.target, error, 'the schema version read');
      throw error;
    } finally {
      await client.end().catch(() => {});
    }
  }

  async readUserVersion(): Promise<number | null> {
    return null;
  }

  async close(): Promise<void> {
    await this.wakeups.close();
    await this.db.destroy();
  }
}

function quoteIdentifier(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}
