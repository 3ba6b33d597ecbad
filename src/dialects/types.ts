import type { CompiledQuery, Expression, Kysely, KyselyConfig, QueryResult, RawBuilder, Transaction } from 'kysely';
import type pg from 'pg';
import type { Database } from '../schema/database.js';
import type { SchemaDescription } from '../schema/describe.js';
import type { Wakeups } from './wakeups.js';

/** What kind of failure a driver error is; the only thing repositories may ask about an error. */
export type ErrorKind =
  | 'busy'
  | 'serialization'
  | 'deadlock'
  | 'unique_violation'
  | 'foreign_key_violation'
  | 'check_violation'
  | 'lock_timeout'
  | 'statement_timeout'
  | 'connection_lost'
  /** The disk under the database is full (`StorageFullError`). */
  | 'storage_full'
  /** The database accepts no writes (`ReadOnlyError`). */
  | 'read_only'
  /** The role lacks a privilege the statement needs (`PermissionDeniedError`). */
  | 'permission_denied'
  | 'unknown';

/** Column types that differ per dialect, for migrations (see the type mapping in README). */
export interface ColumnTypes {
  /** Epoch milliseconds: `integer` on SQLite (64-bit), `bigint` on PostgreSQL. */
  readonly epochMs: 'integer' | 'bigint';
  /** Text compared byte by byte (path-lease keys): SQLite's BINARY default, `COLLATE "C"` on PostgreSQL. */
  readonly bytewiseText: string;
  /** Do `integer` columns already hold 64 bits (SQLite)? Then widening one to `bigint` (0056) has nothing to do. */
  readonly integerIs64Bit: boolean;
  /**
   * Does the database have `CREATE SEQUENCE` (PostgreSQL)? Then a monotonic column defaults to
   * `nextval`; SQLite assigns it in an `AFTER INSERT` trigger (writers are serialized there).
   */
  readonly nativeSequences: boolean;
  /**
   * Can DDL on a table the running release writes be done without blocking its writes
   * (PostgreSQL: `CREATE INDEX CONCURRENTLY`, `ADD CONSTRAINT … NOT VALID` then `VALIDATE`)?
   * SQLite has neither: its CHECKs sit on the column, its indexes build in one short transaction.
   */
  readonly concurrentDdl: boolean;
  /**
   * Does the database keep stored functions' statement plans per connection (PostgreSQL
   * PL/pgSQL)? Then the hot calls' statements live in functions a migration installs (0101), so
   * a call costs one planned function call instead of parsing and planning its statements anew.
   */
  readonly storedFunctions: boolean;
}

export interface WriteTransactionOptions {
  /** Give up retrying busy/serialization failures after this long (default: the store's writeDeadlineMs). */
  readonly deadlineMs?: number;
  /**
   * Statements that each run once over many rows (a migration's DDL and backfill batches).
   * PostgreSQL then runs the transaction with JIT off: JIT compiles every statement anew, and
   * for 0052's batched backfill that cost about 350 ms per batch, more than the batch itself.
   */
  readonly bulk?: boolean;
  /**
   * `fn` runs host code (`store.transaction`): on SQLite the transaction is then marked as holding
   * the connection, so a store call inside `fn` throws `TransactionReentryError` instead of
   * waiting forever. Off for taskfence's own callbacks, which never call back into the store.
   */
  readonly hostCode?: boolean;
  /**
   * Keys (from `src/protocol.ts`) the transaction takes as it begins, in this order, as `lockKey`
   * would as its first statements; `lockKey` on them inside `fn` is then a no-op. PostgreSQL takes
   * them in BEGIN's own round trip, one round trip less; SQLite's `BEGIN IMMEDIATE` already
   * serializes. Only for a transaction whose first lock is these keys (lock order is unchanged).
   */
  readonly lockKeys?: readonly string[];
  /**
   * The statement `fn` sends first (after `lockKeys`), bound already (a prepared query's `bind`).
   * PostgreSQL sends it in BEGIN's own round trip, its values written as escaped literals, and
   * `fn` reads its result with `beginResult(first)` instead of sending it; SQLite, and a
   * transaction joined from a host, send it from `fn` as usual. Only for statements whose
   * parameters are strings, finite numbers, booleans or null, and whose text holds no `$n` but
   * its parameters.
   */
  readonly first?: CompiledQuery | readonly CompiledQuery[];
  /**
   * With `first`: BEGIN's round trip also commits, so the whole transaction is one round trip
   * (PostgreSQL). `fn` must then send nothing but `first` (read with `beginResult`; a statement
   * after such a BEGIN throws), and a refusal it throws is thrown after a commit that wrote
   * nothing: only for statements whose guards write nothing when they refuse. A connection lost
   * in that round trip is `COMMIT_OUTCOME_UNKNOWN`. Where BEGIN does not carry `first`, `fn`
   * sends it and the transaction commits as usual.
   */
  readonly commit?: boolean;
}

/** Counters a dialect keeps, for benchmarks and diagnostics, and the observers it was opened with. */
export interface DialectStats {
  /** Write transactions retried because of SQLITE_BUSY, serialization failures, deadlocks or connection loss before COMMIT. */
  retries: number;
  /** Transaction attempts (write and read; each retry is another attempt). */
  transactions?: number;
  /** Called before each retry (the store turns it into a `transaction.retry` event); see `DialectObservers`. */
  onRetry?: (kind: ErrorKind, attempt: number, delayMs: number) => void;
  /** Called when an idle pooled connection fails (PostgreSQL; the store turns it into a `connection.lost` event). */
  onIdleConnectionLost?: (error: Error) => void;
}

/**
 * Who hears of a dialect's retries and lost idle connections (the store's event hub): given when
 * the dialect is opened and fixed from then on, never assigned to a dialect that is already open.
 */
export type DialectObservers = Pick<DialectStats, 'onRetry' | 'onIdleConnectionLost'>;

export type WriteTransactionFn<T> = (trx: Transaction<Database>) => Promise<T>;

/** The key of `HeldConnectionKysely`'s synchronous executor. */
export const EXECUTE_COMPILED_SYNC: unique symbol = Symbol('taskfence.executeCompiledSync');

/**
 * The fast path a dialect may offer for prepared queries (`src/query/prepared.ts`): a Kysely
 * instance whose statements all run on one connection that whoever runs them already holds,
 * and that can run a compiled statement synchronously on it. SQLite's write transactions hand
 * one to their callback (better-sqlite3 is synchronous, and the transaction holds the store's
 * one connection); prepared queries executed on it skip Kysely's async connection provider.
 * Nothing else differs: it has no plugins, so no result transformation is skipped. A Kysely
 * derived from it (`withPlugin`, `withSchema`, `withTables`) is a plain Kysely again and takes
 * Kysely's normal path, plugins included. PostgreSQL offers none: a statement there is a network
 * round trip, and its transactions are plain Kysely transactions.
 */
export interface HeldConnectionKysely extends Kysely<Database> {
  /** Runs `query` on the held connection, now. */
  [EXECUTE_COMPILED_SYNC]<R>(query: CompiledQuery): QueryResult<R>;
}

/** Whether `db` is a `HeldConnectionKysely` (see there). */
export function runsOnHeldConnection(db: Kysely<Database>): db is HeldConnectionKysely {
  return EXECUTE_COMPILED_SYNC in db;
}

/** A host transaction `StoreDialect.joinTransaction` accepted. */
export interface JoinedTransaction {
  readonly db: Transaction<Database>;
  isActive(): boolean;
  /**
   * What can only be checked with a statement (PostgreSQL: the transaction's isolation level),
   * run once before taskfence's first call in the transaction; rejects with
   * `ForeignTransactionError` when the transaction cannot carry the guarantees.
   */
  readonly verify?: () => Promise<void>;
}

/**
 * What a dialect is, without I/O (Kysely's `DialectAdapter`): the answers repositories and
 * migrations may base a choice on, fixed for the dialect's life.
 */
export interface DialectCapabilities {
  /** For diagnostics and for the migration engine's SQL recorder; repositories must not branch on it. */
  readonly kind: 'sqlite' | 'postgres';
  readonly columnTypes: ColumnTypes;
  /**
   * Whether `SELECT … FOR UPDATE SKIP LOCKED` exists (PostgreSQL), so that consumers of one queue
   * can claim different rows in parallel; SQLite serializes writers instead.
   */
  readonly supportsSkipLocked: boolean;
  /**
   * Whether `INSERT … RETURNING` shows the `seq` the insert assigned (PostgreSQL: a sequence
   * default). SQLite assigns it in an `AFTER INSERT` trigger that RETURNING does not see.
   */
  readonly insertReturnsSeq: boolean;
  /**
   * Whether a WITH clause may hold INSERT, UPDATE or DELETE (PostgreSQL), so a write and the
   * read or write that follows it travel in one statement (one round trip). Its rows are not
   * visible to the rest of the statement, which reads the statement's one snapshot.
   */
  readonly writableCtes: boolean;
}

/**
 * How statements reach the database (Kysely's `Driver`): the Kysely instance, write and read
 * transactions with their retries, joining a host's transaction, what a driver error means, the
 * counters, and closing.
 */
export interface DialectDriver {
  readonly db: Kysely<Database>;
  readonly stats: DialectStats;

  /**
   * Runs `fn` in a transaction that holds write intent from its first statement
   * (SQLite `BEGIN IMMEDIATE`; PostgreSQL READ COMMITTED) and retries it whole on
   * SQLITE_BUSY, serialization failures and deadlocks, with jittered backoff, until the deadline.
   * `fn` may therefore run more than once: keep side effects outside the database out of it.
   * `trx` may be a `HeldConnectionKysely` (SQLite), which prepared queries run on synchronously.
   */
  writeTransaction<T>(fn: WriteTransactionFn<T>, options?: WriteTransactionOptions): Promise<T>;

  /**
   * Runs `fn` on one consistent snapshot without taking the write lock (SQLite: a deferred
   * `BEGIN` in WAL mode; PostgreSQL: REPEATABLE READ, READ ONLY), retried on transient errors.
   * For reads that must agree with each other, such as the migrator's history-and-tables check.
   */
  readTransaction<T>(fn: WriteTransactionFn<T>): Promise<T>;

  /**
   * For `store.withTransaction(trx)`: checks that `trx` is an open transaction this store can
   * join (else `ForeignTransactionError`) and returns the Kysely taskfence runs its statements on
   * inside it, and whether the transaction is still open.
   */
  joinTransaction(trx: Transaction<Database>): JoinedTransaction;

  /** Classifies a driver error. */
  classifyError(error: unknown): ErrorKind;

  /** PostgreSQL pool usage (clients total, idle, and callers waiting for one); absent on SQLite. */
  connectionStats?(): { total: number; idle: number; waiting: number };

  close(): Promise<void>;
}

/**
 * What every lease is built on: serializing writers on a key, waking waiters when a key's
 * holders change, and the clock expiries are judged on.
 */
export interface DialectCoordination {
  /**
   * Serializes writers on `key` until the surrounding write transaction ends
   * (PostgreSQL: a transaction-scoped advisory lock; SQLite: already serialized by `BEGIN IMMEDIATE`).
   * Take it before reading the rows the decision depends on. Keys come from `src/protocol.ts`.
   */
  lockKey(trx: Transaction<Database>, key: string): Promise<void>;
  /**
   * `lockKey` as an expression, for the statement that reads the key's column: selected there, it
   * takes the lock on `key` (a text expression) for the rows the statement returns, saving a round
   * trip. Null when `lockKey` is a no-op (SQLite): the caller reads without it. Rows the caller
   * decides on must still be read by a later statement, once the lock is held.
   */
  lockKeyExpression(key: Expression<string>): RawBuilder<unknown> | null;
  /**
   * The key string `lockKey` locks for `key` (PostgreSQL: prefixed with the configured schema;
   * SQLite: `key` as is), for SQL that takes the key itself from a prefix and a column (a stored
   * function: `pg_advisory_xact_lock(hashtextextended(prefix || id, 0))`).
   */
  lockKeyText(key: string): string;
  /**
   * The result of `writeTransaction`'s `first` statement when BEGIN sent it (PostgreSQL), taken
   * once: `undefined` when it was not sent there, and the caller sends it itself.
   */
  beginResult<R>(first: CompiledQuery<R>): QueryResult<R> | undefined;
  /**
   * Sends `statement` in COMMIT's round trip (PostgreSQL, in a write transaction taskfence began
   * for its own code: `writeTransaction` without `hostCode`), else now. For the transaction's
   * last writes, whose results the caller does not need and which nothing later in the
   * transaction reads. Each is its own statement with its own READ COMMITTED snapshot, sent in
   * order before COMMIT; a failure aborts the commit, and the transaction rolls back as for any
   * failed statement.
   */
  commitWith(trx: Transaction<Database>, statement: CompiledQuery): Promise<void>;
  /** Wake-ups for waiters: LISTEN/NOTIFY on PostgreSQL, COMMIT hooks and `PRAGMA data_version` on SQLite. */
  readonly wakeups: Wakeups;
  /**
   * The clock leases, TTLs and heartbeats are judged on, unless the store was given a `clock`:
   * on PostgreSQL the server's (the host clock corrected by the offset measured at every
   * transaction start), on SQLite the host's (one host by nature).
   */
  readonly clock: { now(): number };
}

/**
 * The schema and its migrations (Kysely's `Introspector`, plus the migration lock Kysely puts on
 * its adapter): locking out other migrators, reading what the schema holds, and its version.
 */
export interface DialectSchema {
  /**
   * Runs `fn` in a write transaction that holds the database-wide migration lock until it ends.
   * PostgreSQL: a transaction-scoped advisory lock on the migration key (which names the schema),
   * polled with a try-lock until `waitMs`, then `lock_timeout` set to `ddlLockTimeoutMs` for the
   * rest of the transaction; no session lock, so a lost connection costs only that transaction and
   * waiting works through a transaction-mode pooler. SQLite: `BEGIN IMMEDIATE`, retried until
   * `waitMs`. Throws `MigrationLockTimeoutError` when the wait runs out.
   */
  withMigrationLock<T>(fn: WriteTransactionFn<T>, options: MigrationLockOptions): Promise<T>;

  /**
   * Runs `fn` outside any transaction, holding the migration lock, for a migration's concurrent
   * steps (`CREATE INDEX CONCURRENTLY` cannot run in a transaction). PostgreSQL: one connection
   * takes the migration key as a session advisory lock (polled with a try-lock until `waitMs`, like
   * `withMigrationLock`), runs `fn` with no `statement_timeout`, and unlocks; a lost connection
   * releases the lock with it. SQLite: exactly `withMigrationLock` (one `BEGIN IMMEDIATE`
   * transaction). Throws `MigrationLockTimeoutError` when the wait runs out.
   */
  withMigrationSession<T>(fn: (db: Kysely<Database>) => Promise<T>, options: MigrationLockOptions): Promise<T>;

  /**
   * Index `name` of the store's schema, read on `db`: missing, valid, or invalid (PostgreSQL: a
   * `CREATE INDEX CONCURRENTLY` that failed or was killed leaves the index INVALID: never used
   * by queries, still updated by writes).
   */
  indexState(db: Kysely<Database>, name: string): Promise<'missing' | 'valid' | 'invalid'>;

  /** Is constraint `name` on `table` validated (SQLite: always, it has no NOT VALID)? Null when it does not exist. */
  constraintValidated(db: Kysely<Database>, table: string, name: string): Promise<boolean | null>;

  /** A normalized description of the schema, comparable across dialects. */
  describeSchema(): Promise<SchemaDescription>;

  /**
   * The highest applied migration version, for the store's lazy schema check: 0 only when there
   * is no history table; any other failure throws, typed (never a guessed 0). PostgreSQL reads it
   * on a new connection of its own, closed after: a pooled one may have been ended by the server
   * (idle_session_timeout) since the call that failed, and would fail the read the same way.
   */
  readSchemaVersion(): Promise<number>;

  /** `PRAGMA user_version` on SQLite, `null` on PostgreSQL; on `db` (e.g. an open transaction) if given. */
  readUserVersion(db?: Kysely<Database>): Promise<number | null>;
}

/**
 * The one place dialect differences live: the four small interfaces above, together.
 * Repositories receive a `StoreDialect` and use only its members; they never ask which dialect
 * they run on. A dialect is configured once, when it is opened (`openSqliteDialect`,
 * `openPostgresDialect`); after that only its `stats` counters move.
 */
export interface StoreDialect extends DialectCapabilities, DialectDriver, DialectCoordination, DialectSchema {}

export interface MigrationLockOptions {
  /** How long to wait for another migrator to release the lock, in ms. */
  readonly waitMs: number;
  /** PostgreSQL `lock_timeout` for the DDL run under the lock, in ms (0 disables; default: the store's). */
  readonly ddlLockTimeoutMs?: number;
  /** See `WriteTransactionOptions.bulk`. */
  readonly bulk?: boolean;
  /** Called every `reportEveryMs` while waiting, with who holds the lock (PostgreSQL; `null` when unknown). */
  readonly onWaiting?: (holder: MigrationLockHolder | null, waitedMs: number) => void;
  /** Default 3 000 ms. */
  readonly reportEveryMs?: number;
}

/** The session holding the migration lock, from `pg_locks` and `pg_stat_activity`. */
export interface MigrationLockHolder {
  readonly pid: number;
  readonly application: string;
  /** Epoch ms its transaction began, if known. */
  readonly since: number | null;
  readonly clientAddress: string | null;
}

export interface DialectOptions {
  /** Retry deadline of write transactions (default 30 000 ms). */
  readonly writeDeadlineMs?: number;
  /** SQLite `busy_timeout`, the synchronous wait inside one attempt (default 250 ms; the async retry loop does the rest). */
  readonly busyTimeoutMs?: number;
  /** PostgreSQL pool size (default 10). */
  readonly poolSize?: number;
  /** PostgreSQL `lock_timeout` in ms (default 10 000; 0 disables). */
  readonly lockTimeoutMs?: number;
  /** PostgreSQL `statement_timeout` in ms (default 60 000; 0 disables). */
  readonly statementTimeoutMs?: number;
  /**
   * SQLite: how a commit reaches the disk. `'full'` (the default): `PRAGMA synchronous = FULL`, the
   * WAL is synced at every commit, so a commit that returned survives power loss and an OS crash.
   * `'normal'`: `synchronous = NORMAL`, synced only at checkpoints: it survives a process crash,
   * but power loss can undo the last commits, and with them a lease grant (a fencing token can
   * then be handed out twice after the reboot). See the README (Failure model, durability).
   * Ignored on PostgreSQL, whose durability is the server's (`synchronous_commit`, `fsync`).
   */
  readonly durability?: 'full' | 'normal';
  /** SQLite: open an existing file read-only, without switching it to WAL (the CLI's `status` and `plan`). */
  readonly readOnly?: boolean;
  /**
   * The host clock the database clock is derived from (default `Date.now`). Only tests set it, to
   * simulate hosts whose clocks disagree; `StoreOptions.clock` replaces the clock altogether.
   */
  readonly hostClock?: { now(): number };
  /**
   * How long a waiter (`acquirePaths`, `waitForMessages`) waits for a wake-up before it re-checks
   * anyway (default 1 000 ms): the latency a lost notification can cost.
   */
  readonly wakeFallbackMs?: number;
  /** Set false to disable notifications (waiters then only poll every `wakeFallbackMs`); for tests. */
  readonly wakeNotifications?: boolean;
  /**
   * PostgreSQL: the URL of the one `LISTEN` connection only, when `url` (or `pool`) goes through a
   * transaction-mode pooler, which does not keep `LISTEN` (waiters then fall back to
   * `wakeFallbackMs`): a direct or session-mode URL to the same database. Checked at open (it
   * must reach the store's database on the same server). Default: the store's own connection settings.
   */
  readonly listenUrl?: string;
  /** PostgreSQL: how long opening a connection may take before `DATABASE_UNAVAILABLE` (default 10 000). */
  readonly connectTimeoutMs?: number;
  /**
   * PostgreSQL: the host's existing `pg.Pool` instead of one taskfence opens (then `url` is not
   * needed, `poolSize` is ignored, and `close()` leaves the pool open: it is the host's to end).
   */
  readonly pool?: pg.Pool;
  /**
   * PostgreSQL: the schema taskfence's tables, indexes, history and lock keys live in (default:
   * the connection's `current_schema()`, usually `public`). Also settable as `?schema=` in the URL.
   */
  readonly schema?: string;
  /** Called after every query with its SQL, parameters and duration (for debugging and benchmarks). */
  readonly onQuery?: (query: {
    sql: string;
    parameters: readonly unknown[];
    durationMs: number;
    error?: unknown;
  }) => void;
}

/** Kysely's `log` option for `DialectOptions.onQuery`. */
export function queryLogger(onQuery: DialectOptions['onQuery']): KyselyConfig['log'] {
  if (!onQuery) return undefined;
  return (event) =>
    onQuery({
      sql: event.query.sql,
      parameters: event.query.parameters,
      durationMs: event.queryDurationMillis,
      ...(event.level === 'error' ? { error: event.error } : {}),
    });
}

export const DEFAULT_WRITE_DEADLINE_MS = 30_000;
