import { redactDatabaseUrl } from './database-url-redaction.js';

/**
 * Every error taskfence throws on purpose is a `TaskfenceError` with a stable `code`,
 * the ids involved as fields, and a message that tells the operator what to do.
 */
export abstract class TaskfenceError extends Error {
  abstract readonly code: string;
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** The database URL is malformed or names a dialect taskfence does not support. */
export class InvalidDatabaseUrlError extends TaskfenceError {
  readonly code = 'INVALID_DATABASE_URL';
  /** The URL as given, its passwords redacted. */
  readonly url: string;
  constructor(
    url: string,
    readonly reason: string,
  ) {
    super(
      `Invalid database URL ${JSON.stringify(redactDatabaseUrl(url))}: ${reason}. ` +
        'Use sqlite:<path>, sqlite::memory:, postgres://… or postgresql://….',
    );
    this.url = redactDatabaseUrl(url);
  }
}

/**
 * The base of the database faults (`DatabaseUnavailableError`, `StorageFullError`,
 * `ReadOnlyError`, `PermissionDeniedError`, `CommitOutcomeUnknownError`, `LockTimeoutError`, `StatementTimeoutError`): the driver's error is the `cause`, its code is
 * `driverCode`, and `retrySafe` says whether the failed call is known to have changed nothing.
 */
export abstract class DatabaseFaultError extends TaskfenceError {
  /** The driver's error code (`57P01`, `ECONNRESET`, `SQLITE_BUSY`, …), when it gave one. */
  readonly driverCode: string | undefined;
  /** True when the failed call is known to have changed nothing, so retrying it is safe. */
  readonly retrySafe: boolean;
  constructor(message: string, cause: unknown, retrySafe: boolean) {
    super(message, { cause });
    this.driverCode = driverCodeOf(cause);
    this.retrySafe = retrySafe;
  }
}

/**
 * The database could not be reached, or the connection dropped (terminated backend, server
 * restarting, network reset or silent past the timeouts). `retrySafe` says whether the failed
 * operation is known to have changed nothing: true for every failure before COMMIT was sent.
 */
export class DatabaseUnavailableError extends DatabaseFaultError {
  readonly code = 'DATABASE_UNAVAILABLE';
  constructor(
    readonly target: string,
    cause: unknown,
    readonly operation: string = 'connect',
    retrySafe: boolean = true,
  ) {
    super(
      `Cannot reach the database at ${target} (${operation}): ${describeCause(cause)}. ` +
        (serverTimeoutOf(cause) !== undefined
          ? `The server ended the session after its ${serverTimeoutOf(cause)} (${SERVER_TIMEOUTS[driverCodeOf(cause)!]}); ` +
            (retrySafe
              ? 'nothing was changed. Keep host code inside a transaction from pausing that long, or ask the DBA to raise the setting.'
              : 'the outcome is unknown.')
          : target.startsWith('sqlite:')
            ? 'Check the file path, that its directory exists, and its permissions.'
            : 'Check that the server is running and the URL (host, port, database, credentials) is right; ' +
              (retrySafe ? 'nothing was changed, so the call is safe to retry.' : 'the outcome is unknown.')),
      cause,
      retrySafe,
    );
    this.serverTimeout = serverTimeoutOf(cause);
  }
  /**
   * The server setting that ended the session, when that is why the connection is gone:
   * `idle_in_transaction_session_timeout` (25P03) or `idle_session_timeout` (57P05).
   */
  readonly serverTimeout: 'idle_in_transaction_session_timeout' | 'idle_session_timeout' | undefined;
}

/** The sessions a PostgreSQL server ends by its own timeouts, by SQLSTATE. */
const SERVER_TIMEOUTS: Readonly<Record<string, string>> = {
  '25P03': 'SQLSTATE 25P03, an open transaction sat idle too long',
  '57P05': 'SQLSTATE 57P05, an idle connection was closed',
};

function serverTimeoutOf(cause: unknown): DatabaseUnavailableError['serverTimeout'] {
  const code = driverCodeOf(cause);
  return code === '25P03'
    ? 'idle_in_transaction_session_timeout'
    : code === '57P05'
      ? 'idle_session_timeout'
      : undefined;
}

/**
 * The disk under the database is full (SQLite `SQLITE_FULL`, PostgreSQL 53100 "could not extend
 * file"): the statement failed and its transaction rolled back, so nothing was changed
 * (`retrySafe`). Retrying helps only once space is freed.
 */
export class StorageFullError extends DatabaseFaultError {
  readonly code = 'STORAGE_FULL';
  declare readonly retrySafe: true;
  constructor(
    /** The database, redacted (`sqlite:/var/lib/app.db`, `postgres://app@db1:5432/app`). */
    readonly target: string,
    readonly operation: string,
    cause: unknown,
  ) {
    super(
      `The disk under the database at ${target} is full (${operation}): ${describeCause(cause)}. ` +
        'Nothing was changed. Free space on the volume that holds ' +
        (target.startsWith('sqlite:') ? 'the file and its -wal file' : "the server's data directory or tablespace") +
        ' (or grow it), then retry.',
      cause,
      true,
    );
  }
}

/**
 * The database accepts no writes: a PostgreSQL hot standby (in recovery) or a server or database
 * set to `default_transaction_read_only` (25006), an SQLite file or directory this process may
 * not write (`SQLITE_READONLY*`). Nothing was changed (`retrySafe`): retry against the primary.
 */
export class ReadOnlyError extends DatabaseFaultError {
  readonly code = 'READ_ONLY';
  declare readonly retrySafe: true;
  constructor(
    /** The database, redacted. */
    readonly target: string,
    readonly operation: string,
    /** PostgreSQL: whether the server is in recovery (a standby); `null` when it could not be asked, or on SQLite. */
    readonly inRecovery: boolean | null,
    cause: unknown,
  ) {
    super(
      `The database at ${target} is read-only (${operation}): ${describeCause(cause)}. ` +
        (inRecovery === true
          ? 'The server is in recovery (a hot standby): point writers at the primary. '
          : inRecovery === false
            ? 'The server is not in recovery, so the session or database is set read-only (default_transaction_read_only, or transaction_read_only): ask the DBA, or point writers at a writable server. '
            : target.startsWith('sqlite:')
              ? 'Check the permissions of the file, its -wal and -shm files, and its directory. '
              : '') +
        'Nothing was changed.',
      cause,
      true,
    );
  }
}

/**
 * The database role may not do what a statement needs (PostgreSQL 42501 "permission denied for
 * …"): the statement failed and its transaction rolled back, so nothing was changed (`retrySafe`,
 * though retrying helps only once the grant is made). `object` is what the server named
 * (`sequence tasks_seq_seq`, `table tasks`, `schema app`) and `privilege` the one to grant
 * (`USAGE` for a sequence's `nextval`); the README's "Least privilege" lists every grant the
 * runtime needs.
 */
export class PermissionDeniedError extends DatabaseFaultError {
  readonly code = 'PERMISSION_DENIED';
  declare readonly retrySafe: true;
  constructor(
    /** The database, redacted. */
    readonly target: string,
    readonly operation: string,
    /** What the server refused, as it named it (`sequence tasks_seq_seq`), or `null` when it named nothing. */
    readonly object: string | null,
    /** The privilege to grant on `object` (`USAGE`, `INSERT`, `CREATE`, …), or `null` when unknown. */
    readonly privilege: string | null,
    cause: unknown,
  ) {
    super(
      `The database role lacks ${privilege ?? 'a privilege'} on ${object ?? 'an object'} at ${target} (${operation}): ` +
        `${describeCause(cause)}. Nothing was changed. ` +
        (privilege && object
          ? `Grant it (GRANT ${privilege} ON ${grantTarget(object)} TO <the role>), `
          : 'Grant it, ') +
        'or see the README\'s "Least privilege" for every grant the runtime needs.',
      cause,
      true,
    );
  }
}

/** `sequence tasks_seq_seq` as GRANT names it: `SEQUENCE tasks_seq_seq`. */
function grantTarget(object: string): string {
  const space = object.indexOf(' ');
  return space < 0 ? object : `${object.slice(0, space).toUpperCase()}${object.slice(space)}`;
}

/**
 * The connection died while COMMIT was in flight: the transaction may or may not have committed.
 * Never retried blindly. Retry with the same ids (creates are idempotent), or read back what the
 * call would have written (for claims: the holder and token).
 */
export class CommitOutcomeUnknownError extends DatabaseFaultError {
  readonly code = 'COMMIT_OUTCOME_UNKNOWN';
  declare readonly retrySafe: false;
  constructor(
    readonly operation: string,
    cause: unknown,
  ) {
    super(
      `The connection was lost while ${operation} was committing (${describeCause(cause)}), so it may or may not have committed. ` +
        'Retry with the same ids (creates are idempotent), or read back what it would have written (for a claim: the holder and token).',
      cause,
      false,
    );
  }
}

/** PostgreSQL's `lock_timeout` fired (SQLSTATE 55P03): a row or table lock was held by another session too long. Nothing was changed. */
export class LockTimeoutError extends DatabaseFaultError {
  readonly code = 'LOCK_TIMEOUT';
  declare readonly retrySafe: true;
  constructor(
    readonly operation: string,
    cause: unknown,
  ) {
    super(
      `${operation} waited longer than lock_timeout for a lock another session holds (${describeCause(cause)}). ` +
        'Nothing was changed; retry later, find the long-running transaction, or raise lockTimeoutMs.',
      cause,
      true,
    );
  }
}

/** PostgreSQL's `statement_timeout` (57014), or the client-side query timeout, fired. Nothing was changed. */
export class StatementTimeoutError extends DatabaseFaultError {
  readonly code = 'STATEMENT_TIMEOUT';
  declare readonly retrySafe: true;
  constructor(
    readonly operation: string,
    cause: unknown,
  ) {
    super(
      `${operation} ran longer than the statement timeout (${describeCause(cause)}). ` +
        'Nothing was changed; check the database load, or raise statementTimeoutMs.',
      cause,
      true,
    );
  }
}

/** A create named an id that already exists with different content: the create is not a retry of the earlier one. */
export class AlreadyExistsError extends TaskfenceError {
  readonly code = 'ALREADY_EXISTS';
  constructor(
    readonly entity: string,
    readonly id: string,
    readonly differences: readonly string[] = [],
  ) {
    super(
      `A ${entity} with id ${JSON.stringify(id)} already exists` +
        (differences.length > 0 ? ` with different ${differences.join(', ')}` : '') +
        '. Nothing was changed. A retry with the same id and the same input returns the existing row; use a new id for a new one.',
    );
  }
}

/**
 * An idempotency key was used before with other input (for the same operation). Nothing was
 * changed. A retry passes the same key with the same input; a new request needs a new key.
 */
export class IdempotencyKeyConflictError extends TaskfenceError {
  readonly code = 'IDEMPOTENCY_KEY_CONFLICT';
  constructor(
    readonly operation: string,
    readonly key: string,
  ) {
    super(
      `Idempotency key ${JSON.stringify(key)} of ${operation} was used before with other input. Nothing was changed. ` +
        'A retry passes the same key with the same input; use a new key for a new request.',
    );
  }
}

/**
 * A message was sent to a handle no run's coordinator and no dispatch's terminal has: nobody
 * would ever read it (a misspelt handle, say). Nothing was sent. Pass `allowUnknownRecipient:
 * true` to send to a handle that will exist later.
 */
export class UnknownRecipientError extends TaskfenceError {
  readonly code = 'UNKNOWN_RECIPIENT';
  constructor(readonly to: string) {
    super(
      `No coordinator run or dispatched terminal has the handle ${JSON.stringify(to)}, so nobody would read this message. ` +
        'Nothing was sent. Check the handle, or pass allowUnknownRecipient: true for a recipient that will exist later.',
    );
  }
}

/** `gates.consumeResolution` on a gate that is not resolved yet: there is no decision to take. Nothing was changed. */
export class GateNotResolvedError extends TaskfenceError {
  readonly code = 'GATE_NOT_RESOLVED';
  constructor(
    readonly gateId: string,
    readonly status: string,
  ) {
    super(
      status === 'timeout'
        ? `Decision gate ${gateId} timed out without a decision: there is nothing to consume. Open a new gate to decide again.`
        : `Decision gate ${gateId} is ${status}, not resolved: there is no decision to consume yet. Wait for its resolution.`,
    );
  }
}

/**
 * A resolved gate's decision was already taken by `consumer`: exactly one caller acts on a
 * decision. Nothing was changed. The consumer's own retry passes the same idempotency key.
 */
export class ResolutionAlreadyConsumedError extends TaskfenceError {
  readonly code = 'RESOLUTION_ALREADY_CONSUMED';
  constructor(
    readonly gateId: string,
    readonly consumer: string,
    readonly consumedAt: number,
  ) {
    super(
      `The resolution of decision gate ${gateId} was already consumed by ${JSON.stringify(consumer)}. Nothing was changed. ` +
        'Only one consumer acts on a decision; a consumer retrying its own call passes the same idempotencyKey.',
    );
  }
}

/** A write transaction could not get the write lock (SQLITE_BUSY) or commit before its deadline. */
export class WriteTimeoutError extends TaskfenceError {
  readonly code = 'WRITE_TIMEOUT';
  constructor(
    readonly deadlineMs: number,
    readonly attempts: number,
    cause: unknown,
  ) {
    super(
      `A write transaction did not complete within ${deadlineMs} ms after ${attempts} attempts ` +
        `(${describeCause(cause)}). Another writer holds the database too long; raise writeDeadlineMs or find the long writer.`,
      { cause },
    );
  }
}

/** Another migrator held the migration lock for longer than the lock timeout. */
export class MigrationLockTimeoutError extends TaskfenceError {
  readonly code = 'MIGRATION_LOCK_TIMEOUT';
  constructor(readonly timeoutMs: number) {
    super(
      `Another process held the migration lock for more than ${timeoutMs} ms. ` +
        'Nothing was changed. Wait for the other deploy to finish, or raise --lock-wait (migrationLockWaitMs).',
    );
  }
}

/** An applied migration's checksum differs from the code: someone edited a migration that already ran. */
export class MigrationChecksumMismatchError extends TaskfenceError {
  readonly code = 'MIGRATION_CHECKSUM_MISMATCH';
  constructor(
    readonly version: number,
    readonly migrationName: string,
    readonly recordedChecksum: string,
    readonly currentChecksum: string,
  ) {
    super(
      `Migration ${formatVersion(version)} ${migrationName} was edited after it was applied ` +
        `(recorded checksum ${recordedChecksum.slice(0, 12)}…, code has ${currentChecksum.slice(0, 12)}…). ` +
        'Restore the original migration and put the change in a new migration.',
    );
  }
}

/** The database holds migrations this version of taskfence does not know (applied by newer code). */
export class UnknownMigrationsError extends TaskfenceError {
  readonly code = 'UNKNOWN_MIGRATIONS';
  constructor(readonly versions: number[]) {
    super(
      `The database has migrations this taskfence does not know: ${versions.map(formatVersion).join(', ')}. ` +
        'It was migrated by a newer release; upgrade taskfence before migrating.',
    );
  }
}

/** The database has taskfence tables but no migration history, so its version is unknown. */
export class BaselineRequiredError extends TaskfenceError {
  readonly code = 'BASELINE_REQUIRED';
  constructor(
    readonly existingTables: string[],
    readonly userVersion: number | null,
    /** The taskfence version whose tables and columns the database has, if any. */
    readonly suggestedVersion: number | null = null,
  ) {
    super(
      `The database already has tables (${existingTables.slice(0, 10).join(', ')}${existingTables.length > 10 ? `, and ${existingTables.length - 10} more` : ''}) ` +
        `but no taskfence migration history${userVersion ? ` (PRAGMA user_version = ${userVersion})` : ''}. ` +
        (suggestedVersion !== null
          ? `They match taskfence schema version ${formatVersion(suggestedVersion)}: adopt it with \`taskfence migrate --baseline ${suggestedVersion}\` (verified first).`
          : "They match no taskfence schema version, so this may be another application's database: check --db. Nothing was changed."),
    );
  }
}

/** `--baseline V` was asked for but the database does not have the tables and columns of version V. */
export class BaselineMismatchError extends TaskfenceError {
  readonly code = 'BASELINE_MISMATCH';
  constructor(
    readonly version: number,
    readonly problems: string[],
  ) {
    super(
      `The database does not match schema version ${formatVersion(version)}: ${problems.slice(0, 8).join('; ')}` +
        `${problems.length > 8 ? `; and ${problems.length - 8} more` : ''}. Pick the version it really is, or repair it first.`,
    );
  }
}

/** A `--to` or `--baseline` version that is not in the migration chain. */
export class UnknownVersionError extends TaskfenceError {
  readonly code = 'UNKNOWN_VERSION';
  constructor(
    readonly version: number,
    readonly known: number[],
  ) {
    super(
      `There is no migration ${formatVersion(version)}. Known versions: 0 (empty), ${known.map(formatVersion).join(', ')}.`,
    );
  }
}

/** A migration failed; the database stays at the previous version. */
export class MigrationFailedError extends TaskfenceError {
  readonly code = 'MIGRATION_FAILED';
  constructor(
    readonly version: number,
    readonly migrationName: string,
    readonly direction: 'up' | 'down',
    cause: unknown,
  ) {
    super(
      `Migration ${formatVersion(version)} ${migrationName} failed (${direction}): ${describeCause(cause)}. ` +
        'Its transaction was rolled back, so the database is still at the previous version; fix the cause and run migrate again.',
      { cause },
    );
  }
}

/**
 * This taskfence release is older than the database's compatibility window: a migration applied
 * since (`version`) records that releases before `oldestRelease` must no longer write.
 */
export class ReleaseOutsideWindowError extends TaskfenceError {
  readonly code = 'RELEASE_OUTSIDE_WINDOW';
  constructor(
    readonly release: string,
    readonly oldestRelease: string,
    readonly version: number,
  ) {
    super(
      `This is taskfence ${release}, but the database's schema (migration ${formatVersion(version)}) may only be written by taskfence ${oldestRelease} or newer. ` +
        `Upgrade this application to taskfence ${oldestRelease} or newer; nothing was read or written.`,
    );
  }
}

/**
 * `migrate --to` would revert versions that stores of a running release still need (they
 * registered when they opened, and were seen recently). Roll them back first, or pass `force`.
 */
export class ReleaseStillRunningError extends TaskfenceError {
  readonly code = 'RELEASE_STILL_RUNNING';
  constructor(
    readonly target: number,
    readonly running: readonly {
      readonly release: string;
      readonly needsVersion: number;
      readonly host: string;
      readonly pid: number;
      readonly seenAt: number;
    }[],
  ) {
    super(
      `Refusing to migrate down to ${formatVersion(target)}: ${running
        .map(
          (r) =>
            `taskfence ${r.release} (pid ${r.pid} on ${r.host}, seen ${new Date(r.seenAt).toISOString()}) needs ${formatVersion(r.needsVersion)}`,
        )
        .join(
          '; ',
        )}. Nothing was changed. Roll those processes back to a release that works at ${formatVersion(target)} first, or pass --force (force: true).`,
    );
  }
}

/** The store's schema is not at the version this code expects. */
export class SchemaOutOfDateError extends TaskfenceError {
  readonly code = 'SCHEMA_OUT_OF_DATE';
  constructor(
    readonly currentVersion: number,
    readonly expectedVersion: number,
  ) {
    super(
      `The database is at schema version ${formatVersion(currentVersion)}, this taskfence needs ${formatVersion(expectedVersion)}. ` +
        'Run `taskfence migrate` (or store.migrate()) first.',
    );
  }
}

/** Input a caller passed is invalid; `field` names it. */
export class InvalidArgumentError extends TaskfenceError {
  readonly code = 'INVALID_ARGUMENT';
  constructor(
    readonly field: string,
    readonly reason: string,
  ) {
    super(`Invalid ${field}: ${reason}.`);
  }
}

/** A row the operation needs does not exist. */
export class NotFoundError extends TaskfenceError {
  readonly code = 'NOT_FOUND';
  constructor(
    readonly entity: string,
    readonly id: string,
  ) {
    super(`No ${entity} with id ${JSON.stringify(id)}.`);
  }
}

/** The migration history table exists but is not in the shape taskfence writes (hand-edited or damaged). */
export class MigrationHistoryDamagedError extends TaskfenceError {
  readonly code = 'MIGRATION_HISTORY_DAMAGED';
  constructor(readonly problem: string) {
    super(
      `The migration history table taskfence_migrations is damaged: ${problem}. Nothing was changed; restore it from a backup or repair it by hand.`,
    );
  }
}

/** One table or column a down step would drop, with the rows it holds. */
export interface DataLoss {
  readonly version: number;
  readonly name: string;
  readonly table: string;
  readonly column?: string;
  readonly rows: number;
}

/** Down steps would drop tables or columns that hold rows, and `allowDataLoss` was not given. */
export class DataLossError extends TaskfenceError {
  readonly code = 'DATA_LOSS';
  constructor(readonly losses: readonly DataLoss[]) {
    super(
      `Refusing to drop data: ${losses
        .map(
          (l) =>
            `${formatVersion(l.version)} ${l.name} drops ${l.column ? `column ${l.table}.${l.column}` : `table ${l.table}`} (${l.rows} row${l.rows === 1 ? '' : 's'})`,
        )
        .join('; ')}. Nothing was changed; back up first and pass --allow-data-loss (allowDataLoss: true) to go ahead.`,
    );
  }
}

// --- Embedding (host transactions, host pools, schemas, resource locks) ---

/**
 * A taskfence call on SQLite would wait for the store's one connection while the caller's own
 * transaction on that connection holds it (a store call inside `store.db.transaction()`, or a
 * non-`tx` store call inside `store.transaction`'s callback): it could never finish.
 */
export class TransactionReentryError extends TaskfenceError {
  readonly code = 'TRANSACTION_REENTRY';
  constructor(readonly operation: string) {
    super(
      `${operation} was called inside a transaction that holds this SQLite store's only connection, ` +
        'so it would wait forever. Inside store.transaction(async (tx) => …) use tx.db and the repositories on tx ' +
        '(tx.locks, tx.tasks, …); to join a transaction you opened with store.db.transaction(), use store.withTransaction(trx).',
    );
  }
}

/** `store.withTransaction(trx)` was given something it cannot join. */
export class ForeignTransactionError extends TaskfenceError {
  readonly code = 'FOREIGN_TRANSACTION';
  constructor(readonly reason: string) {
    super(`store.withTransaction() cannot join this transaction: ${reason}.`);
  }
}

/**
 * COMMIT completed as ROLLBACK (PostgreSQL): an earlier statement of the transaction failed and
 * its error was swallowed, so nothing was written. A host that catches errors inside
 * `store.transaction` reaches it.
 */
export class TransactionAbortedError extends TaskfenceError {
  readonly code = 'TRANSACTION_ABORTED';
  constructor() {
    super(
      'The transaction was aborted by an earlier error, so COMMIT rolled it back; nothing was written. ' +
        'Do not swallow errors inside the transaction (use a savepoint, or rethrow) and run it again.',
    );
  }
}

/** A transaction-bound repository (`tx.locks`, `tx.db`'s store view, …) was used after its transaction ended. */
export class TransactionEndedError extends TaskfenceError {
  readonly code = 'TRANSACTION_ENDED';
  constructor() {
    super('This transaction has already committed or rolled back; use the store (or a new store.transaction) instead.');
  }
}

export function formatVersion(version: number): string {
  return String(version).padStart(4, '0');
}

export function describeCause(cause: unknown): string {
  if (cause instanceof Error) return cause.message;
  return String(cause);
}

/** The driver's error code (`57P01`, `ECONNRESET`, `SQLITE_BUSY`, …) of `cause`, if any. */
export function driverCodeOf(cause: unknown): string | undefined {
  const code = (cause as { code?: unknown } | null | undefined)?.code;
  return typeof code === 'string' ? code : undefined;
}

/** The database driver a URL needs is an optional peer dependency that is not installed. */
export class DriverNotInstalledError extends TaskfenceError {
  readonly code = 'DRIVER_NOT_INSTALLED';
  constructor(
    readonly driver: string,
    readonly target: string,
    cause?: unknown,
  ) {
    super(`${target} needs the ${driver} package, which is not installed: run \`npm install ${driver}\` in your app.`, {
      cause,
    });
  }
}
