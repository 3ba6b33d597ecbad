import { AsyncLocalStorage } from 'node:async_hooks';
import type pg from 'pg';
import {
  CompiledQuery,
  type DatabaseConnection,
  type Driver,
  type QueryResult,
  type TransactionSettings,
} from 'kysely';
import {
  CommitOutcomeUnknownError,
  DatabaseUnavailableError,
  driverCodeOf,
  LockTimeoutError,
  PermissionDeniedError,
  ReadOnlyError,
  StatementTimeoutError,
  StorageFullError,
  TaskfenceError,
  TransactionAbortedError,
} from '../../errors.js';
import type { ErrorKind } from '../types.js';
import { formatHost, type HostRouter } from './hosts.js';

/**
 * Advisory-lock keys (already schema-scoped) that the BEGIN of the transaction started in this
 * async context takes in its own round trip (`writeTransaction`'s `lockKeys`). `taken` is set once
 * that BEGIN succeeded: `lockKey` then skips those keys, and no other transaction takes them.
 */
export const BEGIN_LOCKS = new AsyncLocalStorage<BeginWith>();

/**
 * What the BEGIN of the transaction started in this async context sends with it: advisory-lock
 * keys, and a first statement (`writeTransaction`'s `first`) whose result it keeps for
 * `beginResult`.
 */
export interface BeginWith {
  readonly keys: readonly string[];
  /** The statements BEGIN sends after its SELECT (`writeTransaction`'s `first`). */
  readonly first: readonly CompiledQuery[];
  /** BEGIN also sends COMMIT (`writeTransaction`'s `commit`): the transaction ends in that round trip. */
  readonly commit: boolean;
  /** Each statement's result, once BEGIN sent it; taken (deleted) by `beginResult`. */
  readonly results: Map<CompiledQuery, QueryResult<unknown>>;
  /** BEGIN's round trip committed the transaction: COMMIT sends nothing, ROLLBACK nothing. */
  committed: boolean;
  /** Statements COMMIT sends before it (`commitWith`); absent where they may not wait (host code). */
  readonly trailing?: CompiledQuery[];
  taken: boolean;
}

/** Server-side limits set with `SET LOCAL` at the start of every transaction (never as startup parameters). */
export interface TransactionLimits {
  /** `lock_timeout` in ms; 0 disables. */
  readonly lockTimeoutMs: number;
  /** `statement_timeout` in ms; 0 disables. */
  readonly statementTimeoutMs: number;
}

/**
 * The client-side bound on one query: a little above `statement_timeout`, so the server's timeout
 * fires first and this one only catches a silent network. 0 (statement_timeout disabled) disables it.
 */
export function clientQueryTimeoutMs(statementTimeoutMs: number): number {
  if (statementTimeoutMs <= 0) return 0;
  return statementTimeoutMs + Math.min(5_000, Math.max(1_000, Math.round(statementTimeoutMs / 10)));
}

/**
 * Classifies a pg error. Connection loss covers the server terminating the backend (57P01–57P03),
 * the server's idle killers (25P03 idle_in_transaction_session_timeout, 57P05
 * idle_session_timeout), every class-08 error, socket errors, pg's own "terminated"/"not
 * queryable" errors, and the client-side query and connect timeouts (after which the connection
 * is discarded). 53100 is a full disk, 25006 a read-only transaction (standby or
 * default_transaction_read_only), 42501 a missing privilege.
 */
export function classifyPostgresError(error: unknown): ErrorKind {
  const code = (error as { code?: unknown } | null)?.code;
  if (typeof code === 'string') {
    if (code === '40001') return 'serialization';
    if (code === '40P01') return 'deadlock';
    if (code === '23505') return 'unique_violation';
    if (code === '23503') return 'foreign_key_violation';
    if (code === '23514' || code === '23502') return 'check_violation';
    if (code === '55P03') return 'lock_timeout';
    if (code === '57014') return 'statement_timeout';
    if (code === '53100') return 'storage_full';
    if (code === '25006') return 'read_only';
    if (code === '42501') return 'permission_denied';
    if (
      code === '25P03' ||
      code === '57P05' ||
      code.startsWith('08') ||
      code === '57P01' ||
      code === '57P02' ||
      code === '57P03' ||
      (code === '55000' && isNotAcceptingConnections(error))
    ) {
      return 'connection_lost';
    }
    if (SOCKET_CODES.has(code)) return 'connection_lost';
  }
  const message = error instanceof Error ? error.message : '';
  if (CONNECTION_MESSAGES.test(message)) return 'connection_lost';
  return 'unknown';
}

const SOCKET_CODES: ReadonlySet<string> = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EPIPE',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ECONNABORTED',
]);
const CONNECTION_MESSAGES =
  /Connection terminated|Client has encountered a connection error|Client was closed and is not queryable|Query read timeout|timeout exceeded when trying to connect|Connection ended unexpectedly|connection timeout/i;

function isNotAcceptingConnections(error: unknown): boolean {
  return /not accepting connections|not currently accepting connections/i.test(
    error instanceof Error ? error.message : '',
  );
}

/** Thrown by the driver's COMMIT when the connection died while COMMIT was in flight (the outcome is unknown). */
const COMMIT_SQL = 'commit';

/**
 * A Kysely driver over a pg pool that makes every database fault a typed, survivable error:
 * - every client it checks out keeps an `error` listener for its whole life (a terminated backend
 *   emits `error` on a checked-out client, which would otherwise crash the host process);
 * - a client that lost its connection or timed out is destroyed on release, never reused;
 * - connection loss becomes `DatabaseUnavailableError` (retry-safe before COMMIT), loss while
 *   COMMIT was in flight `CommitOutcomeUnknownError`, 55P03 `LockTimeoutError`, 57014 and the
 *   client-side query timeout `StatementTimeoutError` / `DatabaseUnavailableError`;
 * - `lock_timeout` and `statement_timeout` are set with `SET LOCAL` in the same round trip as
 *   BEGIN, so nothing depends on startup parameters or session state (transaction-mode poolers).
 */
export class FaultTolerantPostgresDriver implements Driver {
  readonly #pool: pg.Pool;
  readonly #target: string;
  readonly #limits: TransactionLimits;
  readonly #listened = new WeakSet<pg.PoolClient>();
  /** The error the server ended a client's session with, if it did. */
  readonly #endedBy = new WeakMap<pg.PoolClient, Error>();
  /** The server's clock minus the host's (ms), measured in the BEGIN round trip of every transaction. */
  readonly #offset: ServerClockOffset;
  /** With a host list (hosts.ts): where connections go, told when a host lost its connections or refused a write. */
  readonly #hosts: HostRouter | undefined;

  constructor(options: {
    pool: pg.Pool;
    target: string;
    limits: TransactionLimits;
    offset: ServerClockOffset;
    hosts?: HostRouter;
  }) {
    this.#pool = options.pool;
    this.#target = options.target;
    this.#limits = options.limits;
    this.#offset = options.offset;
    this.#hosts = options.hosts;
  }

  async init(): Promise<void> {}

  async acquireConnection(): Promise<DatabaseConnection> {
    let client: pg.PoolClient;
    for (;;) {
      try {
        client = await this.#pool.connect();
      } catch (error) {
        throw new DatabaseUnavailableError(this.#target, error, 'connect', true);
      }
      // An idle client of a host the router has since left (a failover) is closed, not reused.
      if (!this.#hosts || this.#hosts.serves(client)) break;
      client.release(new Error('taskfence: connection to a host that is no longer the current one'));
    }
    if (!this.#listened.has(client)) {
      this.#listened.add(client);
      // For the client's whole life, idle or checked out: a fault is reported by the failing query.
      // What the server said when it ended the session (25P03, 57P05, 57P01 …) arrives here, not
      // on the next query (pg then only says "not queryable"), so it is kept for that query's error.
      client.on('error', (error) => {
        if (driverCodeOf(error) !== undefined) this.#endedBy.set(client, error);
      });
    }
    return new FaultTolerantPostgresConnection({
      client,
      target: this.#target,
      queryTimeoutMs: clientQueryTimeoutMs(this.#limits.statementTimeoutMs),
      offset: this.#offset,
      endedBy: () => this.#endedBy.get(client),
      inRecovery: () => this.#inRecovery(client),
      hosts: this.#hosts,
    });
  }

  /** Whether the server is in recovery (a standby), asked on another connection; null if it cannot be asked. */
  async #inRecovery(client: pg.PoolClient): Promise<boolean | null> {
    // With a host list, the pool may already lead elsewhere: ask the server that refused.
    if (this.#hosts) return this.#hosts.inRecovery({ host: client.host, port: client.port });
    try {
      const client = await this.#pool.connect();
      try {
        const { rows } = await client.query<{ r: boolean }>('select pg_is_in_recovery() as r');
        return rows[0]?.r === true;
      } finally {
        client.release();
      }
    } catch {
      return null;
    }
  }

  async beginTransaction(connection: DatabaseConnection, settings: TransactionSettings): Promise<void> {
    const c = connection as FaultTolerantPostgresConnection;
    let begin = 'begin';
    if (settings.isolationLevel) begin += ` isolation level ${settings.isolationLevel}`;
    if (settings.accessMode) begin += ` ${settings.accessMode}`;
    const locks = BEGIN_LOCKS.getStore();
    if (!locks || locks.taken) {
      await c.begin(begin, this.#limits);
      return;
    }
    const results = await c.begin(begin, this.#limits, locks.keys, locks.first, locks.commit);
    locks.first.forEach((statement, i) => locks.results.set(statement, results[i]!));
    locks.committed = locks.commit;
    locks.taken = true;
  }

  async commitTransaction(connection: DatabaseConnection): Promise<void> {
    const begun = BEGIN_LOCKS.getStore();
    if (begun?.committed) return;
    await (connection as FaultTolerantPostgresConnection).commit(begun?.taken ? begun.trailing : undefined);
  }

  async rollbackTransaction(connection: DatabaseConnection): Promise<void> {
    // A transaction BEGIN's round trip committed has nothing left to roll back.
    if (BEGIN_LOCKS.getStore()?.committed) return;
    await (connection as FaultTolerantPostgresConnection).rollback();
  }

  async savepoint(connection: DatabaseConnection, name: string): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw(`savepoint ${quoteIdentifier(name)}`));
  }

  async rollbackToSavepoint(connection: DatabaseConnection, name: string): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw(`rollback to savepoint ${quoteIdentifier(name)}`));
  }

  async releaseSavepoint(connection: DatabaseConnection, name: string): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw(`release savepoint ${quoteIdentifier(name)}`));
  }

  async releaseConnection(connection: DatabaseConnection): Promise<void> {
    (connection as FaultTolerantPostgresConnection).release();
  }

  async destroy(): Promise<void> {
    // A host's pool is wrapped (host-pool.ts): its end() only detaches taskfence and leaves the pool open.
    await this.#pool.end();
  }
}

class FaultTolerantPostgresConnection implements DatabaseConnection {
  readonly #client: pg.PoolClient;
  /** A COMMIT (with its trailing statements) is in flight: its outcome is unknown if the connection dies. */
  #committing = false;
  /** BEGIN's round trip committed (`commit`): until the next BEGIN, the connection sends nothing. */
  #sealed = false;
  /** Every result of the last query (a multi-statement simple query answers with one per statement). */
  #results: pg.QueryResult[] = [];
  readonly #target: string;
  readonly #defaultQueryTimeoutMs: number;
  /** Raised for the rest of a transaction that sets its own `statement_timeout` (a migration). */
  #queryTimeoutMs: number;
  #inTransaction = false;
  /** Lost its connection, timed out or failed to roll back: destroyed on release. */
  #broken = false;

  readonly #offset: ServerClockOffset;
  readonly #endedBy: () => Error | undefined;
  readonly #inRecovery: () => Promise<boolean | null>;
  readonly #hosts: HostRouter | undefined;

  constructor(options: {
    readonly client: pg.PoolClient;
    /** The server, redacted, for the typed errors. */
    readonly target: string;
    /** The client-side query timeout (`clientQueryTimeoutMs`); 0: none. */
    readonly queryTimeoutMs: number;
    readonly offset: ServerClockOffset;
    /** The error the server ended this client's session with, if it did. */
    readonly endedBy: () => Error | undefined;
    /** Whether the server is in recovery, asked on another connection (a refused write's cause). */
    readonly inRecovery: () => Promise<boolean | null>;
    readonly hosts: HostRouter | undefined;
  }) {
    this.#offset = options.offset;
    this.#endedBy = options.endedBy;
    this.#inRecovery = options.inRecovery;
    this.#hosts = options.hosts;
    this.#client = options.client;
    this.#target = options.target;
    this.#defaultQueryTimeoutMs = options.queryTimeoutMs;
    this.#queryTimeoutMs = options.queryTimeoutMs;
  }

  // Transaction control goes through `executeQuery` (which Kysely wraps for `onQuery`), so every statement is reported.

  /**
   * Begins a transaction in one simple-protocol round trip: BEGIN, then one SELECT that sets the
   * transaction's own limits (set_config(…, true) is SET LOCAL), takes the advisory locks the
   * transaction asked to begin with (after lock_timeout is set, in order) and reads the server's
   * clock; then the `first` statements, with their values written as literals, and COMMIT when
   * `commit` is set (the whole query is then a COMMIT in flight). Returns `first`'s results.
   */
  async begin(
    begin: string,
    limits: TransactionLimits,
    lockKeys: readonly string[] = [],
    first: readonly CompiledQuery[] = [],
    commit = false,
  ): Promise<QueryResult<unknown>[]> {
    const locks = lockKeys.map(
      (key) => `pg_advisory_xact_lock(hashtextextended(${this.#client.escapeLiteral(key)}, 0)), `,
    );
    const text =
      `${begin}; select set_config('lock_timeout', '${Math.trunc(limits.lockTimeoutMs)}', true), ` +
      `set_config('statement_timeout', '${Math.trunc(limits.statementTimeoutMs)}', true), ${locks.join('')}${SERVER_NOW_EXPRESSION} as server_now` +
      first.map((q) => `; ${this.#inline(q)}`).join('') +
      (commit ? `; ${COMMIT_SQL}` : '');
    this.#sealed = false;
    const sent = this.#offset.host.now();
    this.#committing = commit;
    try {
      await this.executeQuery(CompiledQuery.raw(text));
    } catch (error) {
      // BEGIN ran and a later statement failed (a lock timeout, a deadlock, a constraint): end the
      // aborted transaction here, since Kysely rolls back only a transaction whose begin succeeded.
      if (lockKeys.length > 0 || first.length > 0) await this.rollback();
      throw error;
    } finally {
      this.#committing = false;
    }
    const results = this.#results;
    // PostgreSQL answers COMMIT of an aborted transaction with ROLLBACK: nothing was written.
    if (commit && results.at(-1)?.command === 'ROLLBACK') throw new TransactionAbortedError();
    this.#inTransaction = !commit;
    this.#sealed = commit;
    this.#offset.observe(sent, (results[1]?.rows[0] as { server_now?: number } | undefined)?.server_now);
    return results.slice(2, 2 + first.length).map((r) => ({
      numAffectedRows:
        r.command === 'INSERT' || r.command === 'UPDATE' || r.command === 'DELETE' || r.command === 'MERGE'
          ? BigInt(r.rowCount ?? 0)
          : undefined,
      rows: Array.isArray(r.rows) ? r.rows : [],
    }));
  }

  /**
   * `query`'s text with each `$n` replaced by its value as a literal, for a multi-statement
   * simple query (which takes no parameters). Strings go through `escapeLiteral`; negative
   * numbers are parenthesized (never `--`).
   */
  #inline(query: CompiledQuery): string {
    return query.sql.replace(/\$(\d+)/g, (_, n: string) => {
      const value: unknown = query.parameters[Number(n) - 1];
      if (value === null) return 'null';
      if (typeof value === 'string') return this.#client.escapeLiteral(value);
      if (typeof value === 'boolean') return String(value);
      if ((typeof value === 'number' && Number.isFinite(value)) || typeof value === 'bigint')
        return value < 0 ? `(${String(value)})` : String(value);
      throw new TypeError(
        `A statement sent with BEGIN takes strings, finite numbers, booleans or null, not ${typeof value}.`,
      );
    });
  }

  /**
   * COMMIT, in one simple-protocol round trip with `trailing` before it (`commitWith`), their
   * values written as literals. A trailing statement that fails stops the query before COMMIT
   * (the caller rolls back); a connection lost while the query is in flight is a COMMIT in flight.
   */
  async commit(trailing: readonly CompiledQuery[] = []): Promise<void> {
    const text =
      trailing.length === 0 ? COMMIT_SQL : `${trailing.map((q) => this.#inline(q)).join('; ')}; ${COMMIT_SQL}`;
    this.#committing = true;
    let rows: { command?: string }[];
    try {
      ({ rows } = await this.executeQuery<{ command?: string }>(CompiledQuery.raw(text)));
    } finally {
      this.#committing = false;
    }
    // PostgreSQL answers COMMIT of an aborted transaction with ROLLBACK: nothing was written.
    if (rows[0]?.command === 'ROLLBACK') throw new TransactionAbortedError();
  }

  async rollback(): Promise<void> {
    if (this.#broken) {
      this.#inTransaction = false;
      this.#queryTimeoutMs = this.#defaultQueryTimeoutMs;
      return; // the server rolls back a transaction whose connection died
    }
    try {
      await this.executeQuery(CompiledQuery.raw('rollback'));
    } catch {
      // The original error is what the caller needs; this client is not reused.
      this.#broken = true;
    }
    this.#inTransaction = false;
    this.#queryTimeoutMs = this.#defaultQueryTimeoutMs;
  }

  release(): void {
    this.#sealed = false;
    this.#client.release(this.#broken ? new Error('taskfence: connection discarded after a fault') : undefined);
  }

  async executeQuery<R>(compiledQuery: CompiledQuery): Promise<QueryResult<R>> {
    const text = compiledQuery.sql;
    // A statement after a BEGIN that committed would run outside any transaction: a bug, never sent.
    if (this.#sealed && !/^begin\b/i.test(text))
      throw new TypeError('taskfence: a statement was sent in a transaction that BEGIN already committed');
    const config: pg.QueryConfig & { query_timeout?: number } = { text };
    // pg falls back to the client's own query_timeout when a query's is 0: "none" is the longest
    // timer Node allows instead (a statement_timeout of 0, as a migration's index build states).
    if (this.#queryTimeoutMs > 0) config.query_timeout = this.#queryTimeoutMs;
    else if (this.#defaultQueryTimeoutMs > 0) config.query_timeout = NO_QUERY_TIMEOUT_MS;
    if (compiledQuery.parameters.length > 0) config.values = [...compiledQuery.parameters];
    let result: pg.QueryResult;
    try {
      result = await this.#client.query(config);
    } catch (error) {
      throw await this.#translate(error, text);
    } finally {
      if (text === COMMIT_SQL || this.#committing) {
        this.#inTransaction = false;
        this.#queryTimeoutMs = this.#defaultQueryTimeoutMs;
      }
    }
    // The client-side timeout follows the statement_timeout the connection states: SET LOCAL until
    // COMMIT, a session SET (a migration's index build, 0: none) until RESET.
    const raised = SET_STATEMENT_TIMEOUT.exec(text);
    if (raised) this.#queryTimeoutMs = clientQueryTimeoutMs(Number(raised[1]));
    else if (RESET_STATEMENT_TIMEOUT.test(text)) this.#queryTimeoutMs = this.#defaultQueryTimeoutMs;
    // A multi-statement simple query (BEGIN's) answers with one result per statement: the last one counts.
    this.#results = Array.isArray(result) ? (result as pg.QueryResult[]) : [result];
    const last: pg.QueryResult = this.#results.at(-1)!;
    const { command, rowCount, rows } = last;
    if (command === 'COMMIT' || command === 'ROLLBACK') return { rows: [{ command } as R] };
    return {
      numAffectedRows:
        command === 'INSERT' || command === 'UPDATE' || command === 'DELETE' || command === 'MERGE'
          ? BigInt(rowCount ?? 0)
          : undefined,
      rows: (Array.isArray(rows) ? rows : []) as R[],
    };
  }

  // eslint-disable-next-line require-yield
  async *streamQuery<R>(): AsyncIterableIterator<QueryResult<R>> {
    throw new TypeError('taskfence does not stream PostgreSQL queries.');
  }

  /**
   * Connection faults and timeouts become typed errors here; everything else (constraint errors,
   * serialization failures) stays raw for the dialect's retry loop and the repositories.
   */
  async #translate(raw: unknown, text: string): Promise<unknown> {
    if (raw instanceof TaskfenceError) return raw;
    const kind = classifyPostgresError(raw);
    const operation = describeStatement(text);
    if (kind === 'storage_full') return new StorageFullError(this.#target, operation, raw);
    if (kind === 'permission_denied') {
      const { object, privilege } = missingPrivilege(raw instanceof Error ? raw.message : '', text);
      return new PermissionDeniedError(this.#target, operation, object, privilege, raw);
    }
    if (kind === 'read_only') {
      // The server stopped accepting writes (demoted, or read-only by setting): with a host list,
      // look for the writable host again, and never hand this connection out again.
      this.#broken = true;
      this.#hosts?.suspect();
      const target = this.#hosts
        ? `${this.#target} (server ${formatHost({ host: this.#client.host, port: this.#client.port })})`
        : this.#target;
      return new ReadOnlyError(target, operation, await this.#inRecovery(), raw);
    }
    if (kind === 'connection_lost') {
      this.#broken = true;
      this.#hosts?.suspect();
      // "not queryable" says only that the connection is gone; the server's own reason is better.
      const error = driverCodeOf(raw) === undefined ? (this.#endedBy() ?? raw) : raw;
      // pg refuses to send anything on a connection it already knows is dead: such a statement never ran.
      const neverSent = NEVER_SENT.test(raw instanceof Error ? raw.message : '');
      // COMMIT in flight, or a write in its own implicit transaction: it may have committed.
      const committing = text === COMMIT_SQL || this.#committing;
      const mayHaveCommitted =
        committing || (!this.#inTransaction && !READ_ONLY_STATEMENT.test(text) && !/^begin\b/i.test(text));
      if (mayHaveCommitted && !neverSent) {
        return new CommitOutcomeUnknownError(committing ? 'a write transaction' : operation, error);
      }
      return new DatabaseUnavailableError(this.#target, error, operation, true);
    }
    if (kind === 'lock_timeout') return new LockTimeoutError(operation, raw);
    if (kind === 'statement_timeout') return new StatementTimeoutError(operation, raw);
    return raw;
  }
}

const SET_STATEMENT_TIMEOUT = /^\s*set\s+(?:local\s+)?statement_timeout\s*(?:=|to)\s*'?(\d+)'?\s*;?\s*$/i;
/** The longest delay setTimeout takes (about 24.8 days). */
const NO_QUERY_TIMEOUT_MS = 2_147_483_647;
const RESET_STATEMENT_TIMEOUT = /^\s*reset\s+statement_timeout\s*;?\s*$/i;
const NEVER_SENT = /is not queryable/;
const READ_ONLY_STATEMENT = /^\s*(select|show|rollback)\b/i;

/** Reads the server's clock in epoch milliseconds. */
const SERVER_NOW_EXPRESSION = '(extract(epoch from clock_timestamp()) * 1000)::float8';
export const SERVER_NOW_SQL = `select ${SERVER_NOW_EXPRESSION} as server_now`;

/** A clock sample's round trip may exceed twice the quickest by this much and still count. */
const SLOW_SAMPLE_SLACK_MS = 5;

/**
 * The server's clock as seen from this host: the host clock plus the offset measured at the start
 * of every transaction (half the round trip is attributed to each direction; a round trip that
 * waited is not used). Lease, lock and heartbeat times are then the server's time on every host,
 * whatever their own clocks say.
 */
export class ServerClockOffset {
  #offsetMs = 0;
  /** The quickest round trip a sample came back in; Infinity before the first. */
  #bestRttMs = Infinity;
  /** Samples skipped in a row for a slow round trip. */
  #skipped = 0;
  constructor(readonly host: { now(): number }) {}

  /** Records a server reading taken between `sentAt` (host time) and now. */
  observe(sentAt: number, serverNow: unknown): void {
    if (typeof serverNow !== 'number' || !Number.isFinite(serverNow)) return;
    const receivedAt = this.host.now();
    const rtt = receivedAt - sentAt;
    // The midpoint is off by half of any wait inside the round trip: a BEGIN that waited for a
    // lock (lockKeys, first) or a busy server. Such a sample is skipped, so the offset's error
    // stays within about the quickest round trip; after 50 slow samples in a row the route
    // itself is slower (another host), and the next one counts.
    if (rtt > 2 * this.#bestRttMs + SLOW_SAMPLE_SLACK_MS && this.#skipped < 50) {
      this.#skipped++;
      return;
    }
    this.#skipped = 0;
    this.#bestRttMs = Math.min(this.#bestRttMs, rtt);
    this.#offsetMs = serverNow - (sentAt + receivedAt) / 2;
  }

  /** The server's time now, in epoch ms. */
  now(): number {
    return Math.round(this.host.now() + this.#offsetMs);
  }

  get offsetMs(): number {
    return this.#offsetMs;
  }
}

/** COMMIT completed as ROLLBACK: an earlier statement failed and the error was swallowed (now in errors.ts). */
export { TransactionAbortedError };

/**
 * What a "permission denied for <kind> <name>" refused, and the privilege `statement` needed on
 * it: USAGE for a sequence (`nextval` of a column default), the statement's verb for a table,
 * CREATE or USAGE for a schema, EXECUTE for a function.
 */
export function missingPrivilege(
  message: string,
  statement: string,
): { object: string | null; privilege: string | null } {
  const match = /permission denied for (\w+) ("[^"]+"|\S+)/.exec(message);
  if (!match) return { object: null, privilege: null };
  const [, kind, name] = match as unknown as [string, string, string];
  const object = `${kind} ${name}`;
  const verb = /^\s*(?:with\b[\s\S]*?\)\s*)?(select|insert|update|delete)\b/i.exec(statement)?.[1];
  switch (kind) {
    case 'sequence':
      return { object, privilege: 'USAGE' };
    case 'table':
    case 'relation':
    case 'view':
      return { object, privilege: verb ? verb.toUpperCase() : null };
    case 'schema':
      return { object, privilege: /^\s*create\b/i.test(statement) ? 'CREATE' : 'USAGE' };
    case 'function':
      return { object, privilege: 'EXECUTE' };
    default:
      return { object, privilege: null };
  }
}

function describeStatement(sql: string): string {
  const flat = sql.replace(/\s+/g, ' ').trim();
  return `statement "${flat.length > 60 ? `${flat.slice(0, 57)}…` : flat}"`;
}

function quoteIdentifier(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}
