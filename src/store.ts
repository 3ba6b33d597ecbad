import type { Kysely, Transaction } from 'kysely';
import { defaultDatabaseUrl, parseDatabaseUrl, type DatabaseLocation } from './config.js';
import { runDoctor, type DoctorOptions } from './doctor/doctor.js';
import type { DoctorReport } from './doctor/report.js';
import { openPostgresDialect } from './dialects/postgres/postgres-dialect.js';
import { openSqliteDialect } from './dialects/sqlite/sqlite-dialect.js';
import type { DialectObservers, DialectOptions, StoreDialect } from './dialects/types.js';
import { driverCodeOf, InvalidArgumentError } from './errors.js';
import {
  Migrator,
  type MigrationEvent,
  type MigrateOptions,
  type MigrateResult,
  type MigrationStatus,
  type PlanStep,
} from './migrator/migrator.js';
import type { Database } from './schema/database.js';
import type { SchemaDescription } from './schema/describe.js';
import {
  createStoreContext,
  DEFAULT_SETTINGS,
  type Clock,
  type StoreContext,
  type StoreSettings,
} from './repositories/context.js';
import { createRepositories, type Repositories } from './repositories/index.js';
import { bindTransaction, lostLeaseOf, type StoreTransaction, type TransactionOptions } from './transaction.js';
import { openRegistration } from './migrator/releases.js';
import { LATEST_VERSION } from './migrations/index.js';
import { TASKFENCE_RELEASE } from './release.js';
import { guardSchemaVersion } from './repositories/schema-guard.js';
import { EventHub, type StoreStats, type TaskfenceEvent } from './events.js';
import { LEASE_AUDIT_MODES, type LeaseAuditMode } from './repositories/shared/audit.js';
import { checkRenewBatch, renewLeasesIn, type RenewedLeases } from './repositories/shared/renew-leases.js';
import type { Lease } from './repositories/shared/lease.js';
import { requireInput } from './repositories/validate.js';
import { extend } from './objects.js';

/** What `openStore` takes: the URL, the dialect's settings (`DialectOptions`) and the store's own. */
export interface StoreOptions extends DialectOptions {
  /** A database URL; default `TASKFENCE_DATABASE_URL`, else `sqlite:./taskfence.db`. */
  readonly url?: string;
  /**
   * Overrides the clock repositories judge leases, TTLs and heartbeats on (epoch ms); tests pass a
   * fake one. Default: the database's clock on PostgreSQL (so hosts whose clocks disagree still
   * agree on every lease), the host's on SQLite.
   */
  readonly clock?: Clock;
  /** Called with every event the store reports (see `TASKFENCE_CHANNELS`); the same events go to `node:diagnostics_channel`. */
  readonly onEvent?: (event: TaskfenceEvent) => void;
  /**
   * How many times a message is handed out (`messages.receiveMessages`) before it moves to
   * `dead` with its last error: an integer from 1 to 1 000, default 5.
   */
  readonly maxAttempts?: number;
  /**
   * The audit trail (`audit_events`, read with `readAuditTrail`). `leases`: which lease acts it
   * records, in the same transaction as the act: `'grants'` (every grant, ownership transfer and
   * takeover of a lapsed lease), `'all'` (also every renewal and release) or `'off'` (the
   * default: the trail cost more than 10 % of the lease cycle, see the README's benchmarks).
   * Operator actions are recorded whatever it says.
   */
  readonly audit?: { readonly leases?: LeaseAuditMode };
}

/** An open database: the typed Kysely instance, the migrator, and the repository groups. */
export interface Store extends Repositories {
  /** The typed query builder on this store's connection(s). */
  readonly db: Kysely<Database>;
  /** The store's dialect: `dialect.kind` is `'sqlite'` or `'postgres'`. */
  readonly dialect: StoreDialect;
  /** Where the store's database is, as parsed from its URL (`parseDatabaseUrl`). */
  readonly location: DatabaseLocation;
  /** Schema drift, a live self-test of the engine's guarantees, and the environment; changes nothing. See `runDoctor`. */
  doctor(options?: DoctorOptions): Promise<DoctorReport>;
  /** Migrates up or down to `options.to` (default: latest). See `Migrator.migrate`. */
  migrate(options?: MigrateOptions): Promise<MigrateResult>;
  /** Applied, pending, modified and unknown migrations. */
  migrationStatus(): Promise<MigrationStatus>;
  /** The SQL pending migrations would run; applies nothing. */
  plan(options?: { to?: number }): Promise<PlanStep[]>;
  /** A normalized description of the current schema. */
  describeSchema(): Promise<SchemaDescription>;
  /**
   * Runs `fn` in one taskfence write transaction (SQLite `BEGIN IMMEDIATE`; PostgreSQL READ
   * COMMITTED) shared with the host: `tx.db` for the host's own statements, `tx.locks`,
   * `tx.tasks`, … bound to it, `tx.lockResources` for named resource locks. Everything commits
   * when `fn` resolves and rolls back when it throws. Like every write transaction, it is retried
   * whole on SQLITE_BUSY, serialization failures and deadlocks, so `fn` may run more than once:
   * keep side effects outside the database (HTTP calls, queue publishes, …) out of it.
   * On SQLite, a non-`tx` store call (or a `store.db` query) inside `fn` throws
   * `TransactionReentryError` instead of waiting forever for the connection `fn` holds.
   * Calls on `tx` report events and count in `stats()` like the store's own calls, as they
   * return: a retried `fn` reports its calls again, once per attempt (see `StoreStats`).
   *
   * @example
   * await store.transaction(async (tx) => {
   *   await tx.db.withTables<{ orders: { id: string } }>().insertInto('orders').values({ id }).execute();
   *   const claim = await tx.locks.claimWorkspaceLock(workspaceId, { holder, runId, ttlMs: 60_000 });
   * });
   */
  transaction<T>(fn: (tx: StoreTransaction) => Promise<T>, options?: TransactionOptions): Promise<T>;
  /**
   * Binds the repositories to a transaction the host already opened. PostgreSQL: any Kysely
   * transaction on a connection to this store's database (the host's Kysely and pool are fine;
   * taskfence ignores the host's plugins). SQLite: only a transaction of this store's own
   * connection (`store.db.transaction()`, or `tx.db`), used inside its callback; anything else
   * throws `ForeignTransactionError`. No retry here: the host's transaction is the host's to retry.
   * Calls on the result report events and count in `stats()` like the store's own calls.
   */
  withTransaction<DB>(trx: Transaction<DB>): StoreTransaction;
  /**
   * A heartbeat: renews every lease in `leases` (a worker's task lease, dispatch, path grants,
   * semaphore slots, workspace lock, run; at most `MAX_RENEW_BATCH`) in one write transaction,
   * one commit. Each is renewed by its own renewal (`locks.renewTaskLease`,
   * `dispatches.heartbeatDispatch`, `paths.renewPaths`, `semaphores.renew`,
   * `locks.renewWorkspaceLock`, `runs.heartbeatCoordinatorRun`), with its guarantees, in the
   * protocol's lock order (so crossing heartbeats never deadlock). **Per item**: a lost lease is
   * reported in `lost` with the error its renewal throws, and the others are still renewed; any
   * other error fails the whole call and renews nothing. `ttlMs` applies to every lease that takes
   * one (default: each kind's own). A cleanup claim is refused (`INVALID_ARGUMENT`): renew it with
   * `ownership.renewCleanupClaim(claim)`. A retry renews again, as a repeated renewal does.
   *
   * @example
   * const { renewed, lost } = await store.renewLeases([taskLease, dispatch.lease, paths.lease, slot], { ttlMs: 60_000 });
   * for (const { lease, error } of lost) stopWorkUnder(lease, error.reason);
   */
  renewLeases(leases: readonly Lease[], options?: { readonly ttlMs?: number }): Promise<RenewedLeases>;
  /** Counters since the store opened: transactions, retries by kind, conflicts, refusals, leases lost, runs reconciled, pool usage. */
  stats(): StoreStats;
  /**
   * Closes the store: unregisters its release, stops its wake-up listener and closes the
   * connection (SQLite) or the pool it opened (PostgreSQL; a host's pool is left open).
   */
  close(): Promise<void>;
}

/**
 * Opens a store on a database URL (or options with `url`).
 *
 * @example
 * const store = await openStore('sqlite:./taskfence.db');
 * await store.migrate();
 * const run = await store.runs.startCoordinatorRun({ targetKey: null });
 * await store.close();
 */
export async function openStore(urlOrOptions?: string | StoreOptions): Promise<Store> {
  const options: StoreOptions = typeof urlOrOptions === 'string' ? { url: urlOrOptions } : (urlOrOptions ?? {});
  const location = storeLocation(options);
  const settings = storeSettings(options);
  const events = new EventHub(options.onEvent);
  // The dialect reports to the event hub from the moment it opens; nothing is attached to it later.
  const observers: DialectObservers = {
    onRetry: (kind, attempt, delayMs) =>
      events.emit({ type: 'transaction.retry', kind, attempt, delayMs: Math.round(delayMs) }),
    onIdleConnectionLost: (error) =>
      events.emit({ type: 'connection.lost', code: driverCodeOf(error) ?? null, message: error.message }),
  };
  const dialect =
    location.dialect === 'sqlite'
      ? await openSqliteDialect(location.filename, options, observers)
      : await openPostgresDialect(location.connectionString, extend(options, { schema: location.schema }), observers);
  const migrator = new Migrator(dialect);
  // The compatibility window (a refusal closes the dialect again), and this store in the registry `migrate --to` reads.
  const unregister = await openRegistration(dialect, TASKFENCE_RELEASE, LATEST_VERSION).catch(
    async (error: unknown) => {
      await dialect.close().catch(() => {});
      throw error;
    },
  );
  const context: StoreContext = createStoreContext(dialect, options.clock ?? dialect.clock, settings);
  const store: Store = Object.freeze({
    db: dialect.db,
    dialect,
    location,
    ...guardSchemaVersion(events.observe(createRepositories(context)), () => dialect.readSchemaVersion()),
    migrate: async (migrateOptions?: MigrateOptions) => {
      return migrator.migrate({
        now: context.clock.now(),
        ...migrateOptions,
        onEvent: (event: MigrationEvent) => {
          events.emit({ type: 'migration', event });
          migrateOptions?.onEvent?.(event);
        },
      });
    },
    migrationStatus: () => migrator.status(),
    doctor: (doctorOptions?: DoctorOptions) =>
      runDoctor({ dialect, location, migrationStatus: () => migrator.status() }, doctorOptions),
    plan: (planOptions?: { to?: number }) => migrator.plan(planOptions),
    describeSchema: () => dialect.describeSchema(),
    transaction: <T>(fn: (tx: StoreTransaction) => Promise<T>, transactionOptions?: TransactionOptions) =>
      dialect.writeTransaction(
        async (trx) => {
          let open = true;
          try {
            const tx = bindTransaction(dialect, trx, () => open, context.clock, events, settings);
            const result = await fn(tx);
            // A lease `tx.assertLease` found lost fails the transaction even if `fn` caught the error.
            const lost = lostLeaseOf(tx);
            if (lost) throw lost;
            return result;
          } finally {
            open = false;
          }
        },
        extend(transactionOptions ?? {}, { hostCode: true }),
      ),
    withTransaction: <DB>(trx: Transaction<DB>) => {
      const joined = dialect.joinTransaction(trx as unknown as Transaction<Database>);
      return bindTransaction(
        dialect,
        joined.db,
        () => joined.isActive(),
        context.clock,
        events,
        settings,
        joined.verify,
      );
    },
    renewLeases: async (leases: readonly Lease[], renewOptions?: { readonly ttlMs?: number }) => {
      const batch = checkRenewBatch(leases, renewOptions);
      if (batch.leases.length === 0) return { renewed: [], lost: [] };
      return store.transaction((tx) => renewLeasesIn(tx, batch.leases, batch.ttlMs));
    },
    stats: (): StoreStats =>
      extend(events.counters, {
        retries: { ...events.counters.retries },
        transactions: dialect.stats.transactions ?? 0,
        pool: dialect.connectionStats?.() ?? null,
      }),
    close: async () => {
      await unregister();
      await dialect.close();
    },
  });
  return store;
}

/** The repositories' settings from `options`, validated before anything opens. */
function storeSettings(options: StoreOptions): StoreSettings {
  const maxAttempts = options.maxAttempts ?? DEFAULT_SETTINGS.maxAttempts;
  if (!Number.isInteger(maxAttempts) || maxAttempts < 1 || maxAttempts > 1_000) {
    throw new InvalidArgumentError('maxAttempts', 'must be an integer from 1 to 1000');
  }
  const audit = options.audit === undefined ? {} : requireInput('audit', options.audit);
  const auditLeases = audit.leases ?? DEFAULT_SETTINGS.auditLeases;
  if (!LEASE_AUDIT_MODES.includes(auditLeases))
    throw new InvalidArgumentError('audit.leases', `must be one of ${LEASE_AUDIT_MODES.join(', ')}`);
  return Object.freeze({ maxAttempts, auditLeases });
}

/** Where `options` point: the URL (with its `?schema=`), or the host's pool; `schema` must agree with the URL's. */
function storeLocation(options: StoreOptions): DatabaseLocation {
  if (options.pool) {
    if (options.url !== undefined && parseDatabaseUrl(options.url).dialect !== 'postgres') {
      throw new InvalidArgumentError('pool', 'a pg.Pool only goes with a PostgreSQL url (or no url)');
    }
    const parsed = options.url === undefined ? undefined : parseDatabaseUrl(options.url);
    const fromUrl = parsed?.dialect === 'postgres' ? parsed.schema : undefined;
    const schema = mergeSchema(options.schema, fromUrl);
    return {
      dialect: 'postgres',
      connectionString: '',
      url: options.url ?? 'postgres://(host pool)',
      ...(schema === undefined ? {} : { schema }),
    };
  }
  const location = parseDatabaseUrl(options.url ?? defaultDatabaseUrl());
  if (location.dialect === 'sqlite') {
    if (options.schema !== undefined)
      throw new InvalidArgumentError('schema', 'schemas are a PostgreSQL option; SQLite has one schema per file');
    if (options.listenUrl !== undefined)
      throw new InvalidArgumentError('listenUrl', 'a PostgreSQL option; SQLite wakes its waiters without a connection');
    return location;
  }
  const schema = mergeSchema(options.schema, location.schema);
  return schema === undefined ? location : extend(location, { schema });
}

function mergeSchema(option: string | undefined, fromUrl: string | undefined): string | undefined {
  if (option !== undefined && fromUrl !== undefined && option !== fromUrl) {
    throw new InvalidArgumentError(
      'schema',
      `the option says ${JSON.stringify(option)} but the URL says ${JSON.stringify(fromUrl)}`,
    );
  }
  return option ?? fromUrl;
}
