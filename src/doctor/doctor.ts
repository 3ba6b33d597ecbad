import { sql } from 'kysely';
import { redactDatabaseUrl, type DatabaseLocation } from '../config.js';
import type { StoreDialect } from '../dialects/types.js';
import { MIGRATIONS } from '../migrations/index.js';
import type { MigrationDefinition } from '../migrations/types.js';
import { HISTORY_TABLE, type MigrationStatus } from '../migrator/migrator.js';
import { STATE_TABLE } from '../migrator/state.js';
import { RELEASES_TABLE } from '../migrator/releases.js';
import { STEPS_TABLE } from '../migrator/steps.js';
import { formatVersion } from '../errors.js';
import { diffSchemas, historyCheck } from './drift.js';
import { postgresEnvironmentChecks, postgresGuaranteeChecks } from './postgres-probes.js';
import { errorMessage, taskfenceSchema } from './probe-support.js';
import { referenceSchemas, scratchSchemaReference } from './reference.js';
import type { SchemaDescription } from '../schema/describe.js';
import { check, worst, type DoctorCheck, type DoctorReport } from './report.js';
import { sqliteEnvironmentChecks, sqliteGuaranteeChecks } from './sqlite-probes.js';

export interface DoctorOptions {
  /** PostgreSQL: how long to wait for a second connection from the store's pool (default 5 000 ms). */
  readonly connectionWaitMs?: number;
  /** PostgreSQL: warn when the server's clock differs from this host's by more (default 1 000 ms). */
  readonly clockSkewWarnMs?: number;
  /**
   * Where the reference schema for drift comes from: `sqlite` (default) migrates a scratch
   * in-memory SQLite database; `database` (PostgreSQL) runs the migrations in a scratch schema
   * inside a rolled-back transaction on the live database, which needs CREATE on it. Without
   * better-sqlite3 installed, PostgreSQL falls back to `database` by itself.
   */
  readonly referenceSource?: 'sqlite' | 'database';
}

/** What doctor examines: a store, or (in tests) a store's parts with a dialect swapped for a faulty one. */
export interface DoctorTarget {
  readonly dialect: StoreDialect;
  readonly location: DatabaseLocation;
  migrationStatus(): Promise<MigrationStatus>;
}

/**
 * Checks that the database in front of it keeps taskfence's promises: the schema matches what
 * the recorded version should have (drift), the engine provides what the guarantees rest on
 * (probed live, inside rolled-back transactions), and nothing around it voids them (a
 * transaction-mode pooler, clock skew). Changes nothing; `ok` is false when any check fails.
 *
 * @example
 * const report = await store.doctor();
 * if (!report.ok) console.error(formatDoctorReport(report));
 */
export async function runDoctor(
  target: DoctorTarget,
  options: DoctorOptions = {},
  migrations: readonly MigrationDefinition[] = MIGRATIONS,
): Promise<DoctorReport> {
  const { dialect, location } = target;
  const status = await target.migrationStatus();
  const live = await dialect.describeSchema();
  const checks: DoctorCheck[] = [historyCheck(status), await schemaCheck(status, live, dialect, migrations, options)];
  if (location.dialect === 'postgres') {
    const probeOptions = {
      connectionWaitMs: options.connectionWaitMs ?? 5_000,
      clockSkewWarnMs: options.clockSkewWarnMs ?? 1_000,
    };
    checks.push(...(await postgresGuaranteeChecks(dialect, live, probeOptions)));
    checks.push(...(await postgresEnvironmentChecks(dialect, probeOptions)));
  } else {
    checks.push(...(await sqliteGuaranteeChecks(dialect, location.filename, live)));
    checks.push(...(await sqliteEnvironmentChecks(dialect)));
  }
  return {
    ok: checks.every((c) => c.status !== 'fail'),
    dialect: location.dialect,
    database: redactDatabaseUrl(location.url),
    schemaVersion: status.currentVersion,
    checks,
  };
}

/** Where the reference schemas come from; see `DoctorOptions.referenceSource`. */
interface ReferenceSource {
  at(version: number): Promise<SchemaDescription | undefined>;
  /** Every table any version of the chain creates. */
  chainTables(): Promise<Set<string>>;
  /** Whether the reference includes the migration history table. */
  readonly hasHistoryTable: boolean;
}

function sqliteReference(migrations: readonly MigrationDefinition[]): ReferenceSource {
  return {
    at: async (version) => (await referenceSchemas(migrations)).get(version),
    chainTables: async () =>
      new Set([...(await referenceSchemas(migrations)).values()].flatMap((s) => Object.keys(s.tables))),
    hasHistoryTable: true,
  };
}

function databaseReference(dialect: StoreDialect, migrations: readonly MigrationDefinition[]): ReferenceSource {
  let chainTables = new Set<string>();
  return {
    at: async (version) => {
      const built = await scratchSchemaReference(dialect, migrations, version);
      chainTables = new Set([HISTORY_TABLE, ...built.chainTables]);
      return built.schema;
    },
    chainTables: async () => chainTables,
    hasHistoryTable: false,
  };
}

/**
 * PostgreSQL: the functions the chain's migrations up to `version` create (`functions`) that the
 * store's schema lacks. A call of a missing one would fail raw ("function does not exist").
 */
async function missingFunctions(
  dialect: StoreDialect,
  migrations: readonly MigrationDefinition[],
  version: number,
): Promise<{ severity: 'fail'; text: string }[]> {
  const wanted = migrations
    .filter((m) => m.version <= version)
    .flatMap((m) => (m.functions ?? []).map((name) => ({ name, by: `${formatVersion(m.version)} ${m.name}` })));
  if (wanted.length === 0) return [];
  const schema = await taskfenceSchema(dialect.db);
  const { rows } = await sql<{ name: string }>`select p.proname as name from pg_proc p
    join pg_namespace n on n.oid = p.pronamespace where n.nspname = ${schema}`.execute(dialect.db);
  const present = new Set(rows.map((r) => r.name));
  return wanted
    .filter((f) => !present.has(f.name))
    .map((f) => ({ severity: 'fail' as const, text: `missing function ${f.name} (installed by ${f.by})` }));
}

/** `drift.schema`: the live schema against the chain's reference at the recorded version. */
async function schemaCheck(
  status: MigrationStatus,
  live: SchemaDescription,
  dialect: StoreDialect,
  migrations: readonly MigrationDefinition[],
  options: DoctorOptions,
): Promise<DoctorCheck> {
  if (status.unknown.length > 0 || status.baselineRequired) {
    return check(
      'drift.schema',
      'fail',
      'not compared: the recorded history does not name a version of this chain (see drift.history)',
    );
  }
  const version = status.currentVersion;
  let source =
    options.referenceSource === 'database' ? databaseReference(dialect, migrations) : sqliteReference(migrations);
  let expected: SchemaDescription | undefined;
  let chainTables: Set<string>;
  try {
    try {
      expected = await source.at(version);
    } catch (error) {
      // No better-sqlite3 (a PostgreSQL-only install): build the reference on the live database.
      if (options.referenceSource !== undefined || dialect.kind !== 'postgres') throw error;
      source = databaseReference(dialect, migrations);
      expected = await source.at(version);
    }
    chainTables = await source.chainTables();
  } catch (error) {
    return check('drift.schema', 'fail', `could not build the reference schema: ${errorMessage(error)}`);
  }
  if (!expected) return check('drift.schema', 'fail', `no reference schema for version ${formatVersion(version)}`);
  const liveHistory = live.tables[HISTORY_TABLE];
  if (version === 0 || !source.hasHistoryTable) {
    // At 0 the history table may stay behind, empty, after migrating down; the database-built
    // reference has none of its own (the migrator creates it): take the live one as it is.
    const { [HISTORY_TABLE]: _ignored, ...rest } = expected.tables;
    expected = { tables: liveHistory ? { ...rest, [HISTORY_TABLE]: liveHistory } : rest };
  }
  if (!source.hasHistoryTable) {
    // The migrator's other bookkeeping tables (backfill cursors, open releases) are not in a
    // reference built without the migrator either: taken as they are, like the history.
    const bookkeeping = Object.fromEntries(
      [STATE_TABLE, RELEASES_TABLE, STEPS_TABLE].flatMap((name) =>
        live.tables[name] ? [[name, live.tables[name]]] : [],
      ),
    );
    expected = { tables: { ...expected.tables, ...bookkeeping } };
    chainTables = new Set([...chainTables, STATE_TABLE, RELEASES_TABLE, STEPS_TABLE]);
  }
  const differences = [
    ...diffSchemas(expected, live, chainTables),
    ...(dialect.kind === 'postgres' ? await missingFunctions(dialect, migrations, version) : []),
  ];
  const items = differences.map((d) => d.text);
  const verdict = worst(differences.map((d) => d.severity));
  const failures = differences.filter((d) => d.severity === 'fail').length;
  const tables = Object.keys(expected.tables).length;
  if (verdict === 'pass')
    return check('drift.schema', 'pass', `the schema matches version ${formatVersion(version)} (${tables} tables)`);
  if (verdict === 'warn')
    return check(
      'drift.schema',
      'warn',
      `taskfence's ${tables} tables match version ${formatVersion(version)}; other tables present`,
      items,
    );
  return check(
    'drift.schema',
    'fail',
    `${failures} difference${failures === 1 ? '' : 's'} from the schema of version ${formatVersion(version)}`,
    items,
  );
}
