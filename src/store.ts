import type { Kysely } from 'kysely';
import { defaultDatabaseUrl, parseDatabaseUrl, type DatabaseLocation } from './config.js';
import { runDoctor, type DoctorOptions } from './doctor/doctor.js';
import type { DoctorReport } from './doctor/report.js';
import { openPostgresDialect } from './dialects/postgres.js';
import { openSqliteDialect } from './dialects/sqlite.js';
import type { DialectOptions, StoreDialect } from './dialects/types.js';
import { Migrator, type MigrationEvent, type MigrateOptions, type MigrateResult, type MigrationStatus, type PlanStep } from './migrator/migrator.js';
import type { Database } from './schema/database.js';
import type { SchemaDescription } from './schema/describe.js';
import { createStoreContext, type Clock, type StoreContext } from './repositories/context.js';
import { createRepositories, type Repositories } from './repositories/index.js';
import { guardSchemaVersion } from './repositories/schema-guard.js';
import { EventHub, type StoreStats, type TaskfenceEvent } from './events.js';

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
}

/** An open database: the typed Kysely instance, the migrator, and the repository groups. */
export interface Store extends Repositories {
  /** The typed query builder on this store's connection(s). */
  readonly db: Kysely<Database>;
  readonly dialect: StoreDialect;
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
  /** Counters since the store opened: transactions, retries by kind, conflicts, refusals, leases lost, runs reconciled, pool usage. */
  stats(): StoreStats;
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
  const location = parseDatabaseUrl(options.url ?? defaultDatabaseUrl());
  const dialect =
    location.dialect === 'sqlite'
      ? await openSqliteDialect(location.filename, options)
      : await openPostgresDialect(location.connectionString, options);
  const migrator = new Migrator(dialect);
  const context: StoreContext = createStoreContext(dialect, options.clock ?? dialect.clock);
  const events = new EventHub(options.onEvent);
  dialect.stats.onRetry = (kind, attempt, delayMs) => events.emit({ type: 'transaction.retry', kind, attempt, delayMs: Math.round(delayMs) });
  return Object.freeze({
    db: dialect.db,
    dialect,
    location,
    ...guardSchemaVersion(events.observe(createRepositories(context)), dialect.db),
    migrate: (migrateOptions?: MigrateOptions) =>
      migrator.migrate({
        now: context.clock.now(),
        ...migrateOptions,
        onEvent: (event: MigrationEvent) => {
          events.emit({ type: 'migration', event });
          migrateOptions?.onEvent?.(event);
        },
      }),
    migrationStatus: () => migrator.status(),
    doctor: (doctorOptions?: DoctorOptions) => runDoctor({ dialect, location, migrationStatus: () => migrator.status() }, doctorOptions),
    plan: (planOptions?: { to?: number }) => migrator.plan(planOptions),
    describeSchema: () => dialect.describeSchema(),
    stats: (): StoreStats => ({
      ...events.counters,
      retries: { ...events.counters.retries },
      transactions: dialect.stats.transactions ?? 0,
      pool: dialect.connectionStats?.() ?? null,
    }),
    close: () => dialect.close(),
  });
}
