import { AsyncLocalStorage } from 'node:async_hooks';
import { sql, type CompiledQuery, type Expression, type Kysely, type KyselyPlugin, type Transaction } from 'kysely';
import type {
  DialectCapabilities,
  DialectCoordination,
  DialectDriver,
  DialectSchema,
  StoreDialect,
  WriteTransactionFn,
} from './dialects/types.js';
import { ForeignTransactionError, InvalidArgumentError, TransactionEndedError } from './errors.js';
import type { EventHub } from './events.js';
import type { Database } from './schema/database.js';
import { runBound } from './query/prepared.js';
import { createStoreContext, type Clock, type StoreSettings } from './repositories/context.js';
import { createRepositories, type Repositories } from './repositories/index.js';
import { guardSchemaVersion } from './repositories/schema-guard.js';
import { resourceLockKey } from './protocol.js';
import { LeaseLostError, requireLease, requireLeaseKind, type Lease } from './repositories/shared/lease.js';
import type { LeaseFences } from './repositories/shared/fence.js';
import { fenceTaskLease, fenceWorkspaceLock } from './repositories/locks.js';
import { fenceCoordinatorRun } from './repositories/shared/running-run.js';
import { fenceSemaphore } from './repositories/semaphores/index.js';
import { fenceDispatch } from './repositories/dispatches/index.js';
import { fencePathLease, requirePathGrant } from './repositories/paths/grants.js';
import { fenceCleanupClaim } from './repositories/ownership/cleanup.js';

/**
 * A transaction shared by the host and taskfence: the host's own statements on `db`, taskfence's
 * repository groups bound to the same transaction. Everything commits or rolls back together.
 */
export interface StoreTransaction extends Repositories {
  /**
   * The open transaction, for the host's own statements. Typed with taskfence's tables; for the
   * host's tables use `tx.db.withTables<HostTables>()` (or cast). With a PostgreSQL `schema`, it
   * qualifies tables with that schema: use `tx.db.withSchema('public')` for tables elsewhere.
   */
  readonly db: Transaction<Database>;
  /**
   * Takes a transaction-scoped lock on every resource name ("box"), in one canonical order
   * (sorted, duplicates dropped), released at commit or rollback. Taking a name the transaction
   * already holds is a no-op. PostgreSQL: advisory transaction locks under `taskfence:resource:`
   * (schema-qualified); SQLite: `BEGIN IMMEDIATE` already serializes writers, so names are only
   * validated and recorded. Take resource locks before other taskfence calls in the transaction.
   */
  lockResources(names: readonly string[]): Promise<void>;
  /** The resource names this transaction holds, sorted. */
  readonly heldResources: readonly string[];
  /**
   * Fences the host's writes in this transaction on `lease` (any grant a claim returned, or
   * `coordinatorRunLease(run)`): checks that it is still the live grant of its resource and holds
   * it so until the transaction ends, so a takeover (a claim by someone else after expiry, or a
   * release) waits for this transaction to commit or roll back. PostgreSQL: the lease row is
   * locked `FOR SHARE`; SQLite: the write transaction already serializes every writer. A lost
   * lease throws its `LeaseLostError` subclass (`STALE_WORKSPACE_LOCK`, `STALE_TASK_LEASE`, …);
   * from then on every statement of the transaction (`tx.db`, `tx.*`) throws it too, and
   * `store.transaction` rolls back even if the callback caught it. Assert before the host's first
   * fenced write; renew the lease through `tx` (a renewal on another connection waits for this
   * transaction).
   *
   * @example
   * await store.transaction(async (tx) => {
   *   await tx.assertLease(claim.lease);
   *   await tx.db.withTables<Host>().insertInto('results').values({ taskId, token: claim.lease.token }).execute();
   * });
   */
  assertLease(lease: Lease): Promise<void>;
}

/** Options of `store.transaction(fn, options)`. */
export interface TransactionOptions {
  /** Give up retrying SQLITE_BUSY / serialization failures / deadlocks after this long (default: the store's writeDeadlineMs). */
  readonly deadlineMs?: number;
}

const RESOURCE_NAME_MAX = 512;
const SAVEPOINT = sql.raw('savepoint taskfence_call');
const RELEASE = sql.raw('release savepoint taskfence_call');
const ROLLBACK_TO = sql.raw('rollback to savepoint taskfence_call');

/** Which binding's call the current async context runs inside (nested calls skip the queue). */
const INSIDE = new AsyncLocalStorage<Binding>();

/**
 * One host transaction seen by taskfence. Repository calls on it run one at a time, each in a
 * savepoint: a call that fails undoes only its own writes and leaves the transaction usable (on
 * PostgreSQL a failed statement otherwise aborts the whole transaction), exactly like a
 * stand-alone call that rolls back.
 */
class Binding {
  #queue: Promise<unknown> = Promise.resolve();
  readonly held = new Set<string>();
  /** Set by a failed `assertLease`: the transaction must not commit host writes any more. */
  lost: LeaseLostError | null = null;

  #verified: Promise<void> | undefined;

  constructor(
    readonly trx: Transaction<Database>,
    readonly isActive: () => boolean,
    /** The joined transaction's statement-level check (`JoinedTransaction.verify`), run once. */
    private readonly verify?: () => Promise<void>,
  ) {}

  assertActive(): void {
    if (!this.isActive()) throw new TransactionEndedError();
    if (this.lost) throw this.lost;
  }

  /** Runs `fn(trx)` inside a savepoint, after every earlier call on this transaction has finished. */
  run<T>(fn: WriteTransactionFn<T>): Promise<T> {
    this.assertActive();
    if (INSIDE.getStore() === this) return this.#savepoint(fn);
    const result = this.#queue.then(() => INSIDE.run(this, () => this.#savepoint(fn)));
    this.#queue = result.catch(() => {});
    return result;
  }

  /** The join check, once; a refusal sticks, a failed read (connection lost) is tried again. */
  #verifyOnce(): Promise<void> | undefined {
    if (!this.verify) return undefined;
    this.#verified ??= this.verify().catch((error: unknown) => {
      if (!(error instanceof ForeignTransactionError)) this.#verified = undefined;
      throw error;
    });
    return this.#verified;
  }

  async #savepoint<T>(fn: WriteTransactionFn<T>): Promise<T> {
    this.assertActive();
    await this.#verifyOnce();
    await SAVEPOINT.execute(this.trx);
    let result: T;
    try {
      result = await fn(this.trx);
    } catch (error) {
      // The transaction may be gone already (connection lost, SQLite rolled back by itself).
      await ROLLBACK_TO.execute(this.trx)
        .then(() => RELEASE.execute(this.trx))
        .catch(() => {});
      throw error;
    }
    await RELEASE.execute(this.trx);
    return result;
  }
}

/**
 * A dialect whose transactions are `binding`'s: joined, never begun, committed or retried here.
 * Its capabilities and coordination are the store dialect's; its driver is the binding; its
 * schema side reads inside the transaction and refuses to migrate.
 */
function boundDialect(dialect: StoreDialect, binding: Binding): StoreDialect {
  const capabilities: DialectCapabilities = {
    kind: dialect.kind,
    columnTypes: dialect.columnTypes,
    supportsSkipLocked: dialect.supportsSkipLocked,
    insertReturnsSeq: dialect.insertReturnsSeq,
    writableCtes: dialect.writableCtes,
  };
  const coordination: DialectCoordination = {
    lockKey: (trx: Transaction<Database>, key: string) => dialect.lockKey(trx, key),
    lockKeyExpression: (key: Expression<string>) => dialect.lockKeyExpression(key),
    lockKeyText: (key: string) => dialect.lockKeyText(key),
    // A joined transaction was begun by the host: the caller sends `first` itself.
    beginResult: () => undefined,
    // Host code may read what the statement writes before its transaction ends: send it now.
    commitWith: async (trx: Transaction<Database>, statement: CompiledQuery) => {
      await runBound(trx, statement);
    },
    // Waiting calls (acquirePaths with a wait, waitForMessages) wait while this transaction holds
    // its locks: see the README (Embedding).
    wakeups: dialect.wakeups,
    clock: dialect.clock,
  };
  const driver: DialectDriver = {
    db: binding.trx,
    stats: dialect.stats,
    writeTransaction: <T>(fn: WriteTransactionFn<T>) => binding.run(fn),
    readTransaction: <T>(fn: WriteTransactionFn<T>) => binding.run(fn),
    joinTransaction: (trx: Transaction<Database>) => dialect.joinTransaction(trx),
    classifyError: (error: unknown) => dialect.classifyError(error),
    close: () => Promise.reject(new Error('Close the store, not a transaction.')),
  };
  const schema: DialectSchema = {
    withMigrationLock: () =>
      Promise.reject(new Error('Migrations cannot run inside a host transaction; call store.migrate().')),
    withMigrationSession: () =>
      Promise.reject(new Error('Migrations cannot run inside a host transaction; call store.migrate().')),
    indexState: (db: Kysely<Database>, name: string) => dialect.indexState(db, name),
    constraintValidated: (db: Kysely<Database>, table: string, name: string) =>
      dialect.constraintValidated(db, table, name),
    describeSchema: () => dialect.describeSchema(),
    readSchemaVersion: () => dialect.readSchemaVersion(),
    readUserVersion: () => dialect.readUserVersion(binding.trx),
  };
  return Object.freeze({ ...capabilities, ...coordination, ...driver, ...schema });
}

/** The schema version as this transaction sees it (0 when the history table is missing). */
async function readVersionIn(trx: Transaction<Database>): Promise<number> {
  try {
    const { rows } = await sql<{ version: number | null }>`select max(version) as version from ${sql.table(
      'taskfence_migrations',
    )}`.execute(trx);
    return Number(rows[0]?.version ?? 0);
  } catch (error) {
    if (/no such table/i.test(error instanceof Error ? error.message : '')) return 0;
    throw error;
  }
}

/** The fence of every lease kind `tx.assertLease` accepts. */
const FENCES: LeaseFences = {
  workspace_lock: fenceWorkspaceLock,
  task_lease: fenceTaskLease,
  coordinator_run: fenceCoordinatorRun,
  semaphore: fenceSemaphore,
  dispatch: fenceDispatch,
  path_lease: fencePathLease,
  cleanup_claim: fenceCleanupClaim,
};

const LOST = new WeakMap<object, Binding>();

/** The lease a `tx.assertLease` on `tx` found lost, if any (`store.transaction` rolls back on it). */
export function lostLeaseOf(tx: StoreTransaction): LeaseLostError | null {
  return LOST.get(tx)?.lost ?? null;
}

/** Makes `db` throw `TransactionEndedError` once the transaction is over, instead of running statements on a reused connection. */
function endGuard(binding: Binding): KyselyPlugin {
  return {
    transformQuery: (args) => {
      binding.assertActive();
      return args.node;
    },
    transformResult: (args) => Promise.resolve(args.result),
  };
}

/**
 * Binds taskfence's repositories to an open transaction `trx` of `dialect` (already checked to be
 * joinable). `isActive` says whether the transaction is still open. Calls on the result report
 * to `events` like the store's own calls (see `EventHub.observe`).
 */
export function bindTransaction(
  dialect: StoreDialect,
  trx: Transaction<Database>,
  isActive: () => boolean,
  clock: Clock | undefined,
  events: EventHub,
  settings?: StoreSettings,
  verify?: () => Promise<void>,
): StoreTransaction {
  const binding = new Binding(trx, isActive, verify);
  const context = createStoreContext(boundDialect(dialect, binding), clock, settings);
  // The same schema-version guard as the store's calls (a raw "no such table" on an unmigrated
  // database becomes SchemaOutOfDateError). PostgreSQL reads the version on a fresh connection;
  // SQLite's one connection is this transaction's, so the version is read through it.
  const readVersion =
    dialect.kind === 'postgres' ? () => dialect.readSchemaVersion() : () => readVersionIn(binding.trx);
  const repositories = guardSchemaVersion(events.observe(createRepositories(context)), readVersion);
  // The areas spread last: a literal that starts with a spread is slow on Node 20 (src/objects.ts).
  const tx: StoreTransaction = Object.freeze({
    db: trx.withPlugin(endGuard(binding)),
    get heldResources() {
      return [...binding.held].sort();
    },
    lockResources: (names: readonly string[]) =>
      binding.run(async (t) => {
        const taken: string[] = [];
        for (const name of canonicalResourceNames(names)) {
          if (binding.held.has(name)) continue;
          await dialect.lockKey(t, resourceLockKey(name));
          taken.push(name);
        }
        // Only now: a failure rolls back to the savepoint, which releases the locks it took.
        for (const name of taken) binding.held.add(name);
      }),
    assertLease: async (lease: Lease) => {
      const fence = FENCES[requireLeaseKind(lease)];
      if (!fence)
        throw new InvalidArgumentError('lease.kind', `'${lease.kind}' leases cannot be asserted in a transaction yet`);
      // A path-lease grant also carries its keys and task (what a dynamic claim's fence reads).
      const checked = lease.kind === 'path_lease' ? requirePathGrant(lease) : requireLease(lease.kind, lease);
      return binding.run(async (t) => {
        try {
          await fence(context, t, checked);
        } catch (error) {
          if (error instanceof LeaseLostError) binding.lost = error;
          throw error;
        }
      });
    },
    ...repositories,
  });
  LOST.set(tx, binding);
  return tx;
}

/** Validates resource names and puts them in the one order every transaction takes them in. */
export function canonicalResourceNames(names: readonly string[]): string[] {
  if (!Array.isArray(names)) throw new InvalidArgumentError('resource names', 'expected an array of strings');
  for (const name of names) {
    if (typeof name !== 'string' || name.length === 0)
      throw new InvalidArgumentError('resource name', 'expected a non-empty string');
    if (name.length > RESOURCE_NAME_MAX)
      throw new InvalidArgumentError('resource name', `longer than ${RESOURCE_NAME_MAX} characters`);
    if (name.includes('\0')) throw new InvalidArgumentError('resource name', 'contains a NUL character');
  }
  // Sorted by UTF-16 code units, the same on every process and platform.
  return [...new Set<string>(names)].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
}
