import type BetterSqlite3 from 'better-sqlite3';
import { CompiledQuery, type DatabaseConnection, type Driver, type QueryCompiler, type QueryResult } from 'kysely';
import { AsyncLocalStorage } from 'node:async_hooks';
import type { DialectOptions } from '../types.js';
import { ReadOnlyError, StorageFullError, TransactionReentryError } from '../../errors.js';

/**
 * The SQLite faults every caller must be able to tell apart, typed where they happen: a full disk
 * (`SQLITE_FULL`) and a file this process may not write (`SQLITE_READONLY*`). SQLite rolls the
 * statement back (and, on a failed COMMIT, the write transaction's ROLLBACK follows), so nothing
 * was changed. Every other error stays raw, for the dialect's classification and the repositories.
 */
export function translateSqliteError(error: unknown, target: string, sqlText: string): unknown {
  const code = (error as { code?: unknown } | null)?.code;
  if (typeof code !== 'string') return error;
  if (code === 'SQLITE_FULL') return new StorageFullError(target, describeStatement(sqlText), error);
  if (code.startsWith('SQLITE_READONLY')) return new ReadOnlyError(target, describeStatement(sqlText), null, error);
  return error;
}

function describeStatement(sqlText: string): string {
  const flat = sqlText.replace(/\s+/g, ' ').trim();
  return `statement "${flat.length > 60 ? `${flat.slice(0, 57)}…` : flat}"`;
}

/** Which driver's connection the current async context holds in an open transaction (see `holdingConnection`). */
const HOLDING = new AsyncLocalStorage<{ readonly driver: ImmediateSqliteDriver; active: boolean }>();

/**
 * Runs `fn` marked as holding `driver`'s connection, so a nested call that would queue for that
 * connection (and so wait forever for its own ancestor) throws `TransactionReentryError` instead.
 */
export async function holdingConnection<T>(driver: ImmediateSqliteDriver, fn: () => Promise<T>): Promise<T> {
  const mark = { driver, active: true };
  try {
    return await HOLDING.run(mark, fn);
  } finally {
    // Work the callback left running (not awaited) may outlive it: it may then wait normally.
    mark.active = false;
  }
}

const STATEMENT_CACHE_SIZE = 256;

/**
 * A Kysely driver for one better-sqlite3 connection that differs from Kysely's own in two ways
 * that matter for us: every transaction opens with `BEGIN IMMEDIATE` (a deferred transaction
 * that later upgrades to a write gets SQLITE_BUSY at once, ignoring busy_timeout), and
 * prepared statements are cached instead of prepared anew for every query.
 */
export class ImmediateSqliteDriver implements Driver {
  readonly #db: BetterSqlite3.Database;
  readonly #connection: CachingSqliteConnection;
  #held = false;
  /** Callers waiting for the connection, first come first served; release hands it to the first. */
  readonly #waiting: (() => void)[] = [];

  /** `onQuery` is called here, once per statement, for both Kysely instances on this connection. */
  constructor(db: BetterSqlite3.Database, target: string, onQuery?: DialectOptions['onQuery']) {
    this.#db = db;
    this.#connection = onQuery
      ? new LoggingSqliteConnection(db, target, onQuery)
      : new CachingSqliteConnection(db, target);
  }

  async init(): Promise<void> {}

  /** The one connection, for `PinnedSqliteDriver`; only use it while holding it via `acquireConnection`. */
  get connection(): SynchronousConnection {
    return this.#connection;
  }

  /** Whether SQLite is inside a transaction right now (it may have rolled back by itself). */
  get inTransaction(): boolean {
    return this.#db.inTransaction;
  }

  /** Takes the connection if nobody holds it; otherwise returns false (then use `acquireConnection`). */
  tryAcquire(): boolean {
    if (this.#held) return false;
    this.#held = true;
    return true;
  }

  /** Throws `TransactionReentryError` if the calling async context holds this connection in an open transaction. */
  assertNotHeldByCaller(operation: string): void {
    const mark = HOLDING.getStore();
    if (mark?.active && mark.driver === this) throw new TransactionReentryError(operation);
  }

  /** The mark of the caller's open transaction on this connection, if the calling async context is inside one. */
  heldByCaller(): { readonly active: boolean } | undefined {
    const mark = HOLDING.getStore();
    return mark?.active && mark.driver === this ? mark : undefined;
  }

  async acquireConnection(): Promise<SynchronousConnection> {
    // One connection: queue callers until the holder releases it.
    if (!this.tryAcquire()) {
      this.assertNotHeldByCaller('A query on store.db');
      await new Promise<void>((resolve) => this.#waiting.push(resolve));
    }
    return this.#connection;
  }

  async beginTransaction(connection: DatabaseConnection): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw('begin immediate'));
  }

  async commitTransaction(connection: DatabaseConnection): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw('commit'));
  }

  async rollbackTransaction(connection: DatabaseConnection): Promise<void> {
    // SQLite may already have rolled back by itself (SQLITE_BUSY, SQLITE_FULL, …).
    if (this.#db.inTransaction) await connection.executeQuery(CompiledQuery.raw('rollback'));
  }

  async savepoint(connection: DatabaseConnection, name: string, compile: QueryCompiler['compileQuery']): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw(`savepoint ${quoteIdentifier(name)}`));
    void compile;
  }

  async rollbackToSavepoint(connection: DatabaseConnection, name: string): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw(`rollback to ${quoteIdentifier(name)}`));
  }

  async releaseSavepoint(connection: DatabaseConnection, name: string): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw(`release ${quoteIdentifier(name)}`));
  }

  async releaseConnection(): Promise<void> {
    this.release();
  }

  /** Gives the connection to the next waiting caller, if any (it stays held), or frees it. */
  release(): void {
    const next = this.#waiting.shift();
    if (next) next();
    else this.#held = false;
  }

  async destroy(): Promise<void> {
    if (this.#db.open) this.#db.close();
  }
}

/** A connection whose statements run synchronously (better-sqlite3), for callers that hold it. */
export interface SynchronousConnection extends DatabaseConnection {
  executeSync<R>(compiledQuery: CompiledQuery): QueryResult<R>;
}

class CachingSqliteConnection implements SynchronousConnection {
  protected readonly db: BetterSqlite3.Database;
  /** Prepared statements by SQL text, least recently prepared evicted first; `reader` is a native getter, so it is read once. */
  readonly #cache = new Map<string, { readonly stmt: BetterSqlite3.Statement; readonly reader: boolean }>();

  constructor(
    db: BetterSqlite3.Database,
    /** `sqlite:<file>`, for the typed errors. */
    readonly target: string,
  ) {
    this.db = db;
  }

  #prepare(sqlText: string): { readonly stmt: BetterSqlite3.Statement; readonly reader: boolean } {
    let cached = this.#cache.get(sqlText);
    if (cached) return cached;
    const stmt = this.db.prepare(sqlText);
    cached = { stmt, reader: stmt.reader };
    if (this.#cache.size >= STATEMENT_CACHE_SIZE) {
      const oldest = this.#cache.keys().next().value;
      if (oldest !== undefined) this.#cache.delete(oldest);
    }
    this.#cache.set(sqlText, cached);
    return cached;
  }

  async executeQuery<R>(compiledQuery: CompiledQuery): Promise<QueryResult<R>> {
    return this.executeSync<R>(compiledQuery);
  }

  executeSync<R>(compiledQuery: CompiledQuery): QueryResult<R> {
    try {
      const { stmt, reader } = this.#prepare(compiledQuery.sql);
      const params = compiledQuery.parameters.map(toSqliteValue);
      if (reader) return { rows: stmt.all(params) as R[] };
      const { changes, lastInsertRowid } = stmt.run(params);
      return {
        numAffectedRows: BigInt(changes),
        insertId: BigInt(lastInsertRowid),
        rows: [],
      };
    } catch (error) {
      throw translateSqliteError(error, this.target, compiledQuery.sql);
    }
  }

  async *streamQuery<R>(compiledQuery: CompiledQuery): AsyncIterableIterator<QueryResult<R>> {
    const { stmt } = this.#prepare(compiledQuery.sql);
    for (const row of stmt.iterate(compiledQuery.parameters.map(toSqliteValue))) {
      yield { rows: [row as R] };
    }
  }
}

/** Reports every statement to `onQuery` with its duration (and error, if it failed). */
class LoggingSqliteConnection extends CachingSqliteConnection {
  constructor(
    db: BetterSqlite3.Database,
    target: string,
    private readonly onQuery: NonNullable<DialectOptions['onQuery']>,
  ) {
    super(db, target);
  }

  override executeSync<R>(compiledQuery: CompiledQuery): QueryResult<R> {
    const started = performance.now();
    const report = (error?: unknown) =>
      this.onQuery({
        sql: compiledQuery.sql,
        parameters: compiledQuery.parameters,
        durationMs: performance.now() - started,
        ...(error === undefined ? {} : { error }),
      });
    try {
      const result = super.executeSync<R>(compiledQuery);
      report();
      return result;
    } catch (error) {
      report(error);
      throw error;
    }
  }
}

function toSqliteValue(value: unknown): unknown {
  if (typeof value === 'boolean') return value ? 1 : 0;
  if (value instanceof Date) return value.getTime();
  return value;
}

function quoteIdentifier(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}

/**
 * A driver for a Kysely instance that runs on a connection someone else already holds (the
 * write transaction of `SqliteDialect`): no locking, no transaction control of its own. Building
 * this Kysely once, instead of Kysely's per-call transaction object, saves most of the fixed cost
 * of a write transaction.
 */
export class PinnedSqliteDriver implements Driver {
  constructor(private readonly owner: ImmediateSqliteDriver) {}
  async init(): Promise<void> {}
  async acquireConnection(): Promise<DatabaseConnection> {
    return this.owner.connection;
  }
  async beginTransaction(): Promise<void> {
    throw new Error('A write transaction is already open; nested transactions are not supported.');
  }
  async commitTransaction(): Promise<void> {}
  async rollbackTransaction(): Promise<void> {}
  async releaseConnection(): Promise<void> {}
  async destroy(): Promise<void> {}
}
