import { redactDatabaseUrl, type DatabaseLocation } from '../config.js';
import type { StoreDialect } from '../dialects/types.js';
import { MIGRATIONS } from '../migrations/index.js';
import type { MigrationDefinition } from '../migrations/types.js';
import { HISTORY_TABLE, type MigrationStatus } from '../migrator/migrator.js';
import { formatVersion } from '../errors.js';
import { diffSchemas, historyCheck } from './drift.js';
import { postgresEnvironmentChecks, postgresGuaranteeChecks } from './postgres-probes.js';
import { errorMessage } from './probe-support.js';
import { referenceSchemas } from './reference.js';
import { check, worst, type DoctorCheck, type DoctorReport } from './report.js';
import { sqliteEnvironmentChecks, sqliteGuaranteeChecks } from './sqlite-probes.js';

export interface DoctorOptions {
  /** PostgreSQL: how long to wait for a second connection from the store's pool (default 5 000 ms). */
  readonly connectionWaitMs?: number;
  /** PostgreSQL: warn when the server's clock differs from this host's by more (default 1 000 ms). */
  readonly clockSkewWarnMs?: number;
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
  const checks: DoctorCheck[] = [historyCheck(status), await schemaCheck(status, live, migrations)];
  if (location.dialect === 'postgres') {
    const probeOptions = { connectionWaitMs: options.connectionWaitMs ?? 5_000, clockSkewWarnMs: options.clockSkewWarnMs ?? 1_000 };
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

/** `drift.schema`: the live schema against the chain's reference at the recorded version. */
async function schemaCheck(
  status: MigrationStatus,
  live: Awaited<ReturnType<StoreDialect['describeSchema']>>,
  migrations: readonly MigrationDefinition[],
): Promise<DoctorCheck> {
  if (status.unknown.length > 0 || status.baselineRequired) {
    return check('drift.schema', 'fail', 'not compared: the recorded history does not name a version of this chain (see drift.history)');
  }
  let references;
  try {
    references = await referenceSchemas(migrations);
  } catch (error) {
    return check('drift.schema', 'fail', `could not build the reference schema: ${errorMessage(error)}`);
  }
  let expected = references.get(status.currentVersion);
  const history = references.get(migrations[0]?.version ?? 0)?.tables[HISTORY_TABLE];
  if (status.currentVersion === 0 && history && live.tables[HISTORY_TABLE]) {
    // Migrated down to 0 (or never up): the history table stays behind, empty.
    expected = { tables: { [HISTORY_TABLE]: history } };
  }
  if (!expected) return check('drift.schema', 'fail', `no reference schema for version ${formatVersion(status.currentVersion)}`);
  const chainTables = new Set([...references.values()].flatMap((s) => Object.keys(s.tables)));
  const differences = diffSchemas(expected, live, chainTables);
  const items = differences.map((d) => d.text);
  const verdict = worst(differences.map((d) => d.severity));
  const failures = differences.filter((d) => d.severity === 'fail').length;
  const tables = Object.keys(expected.tables).length;
  if (verdict === 'pass') return check('drift.schema', 'pass', `the schema matches version ${formatVersion(status.currentVersion)} (${tables} tables)`);
  if (verdict === 'warn') return check('drift.schema', 'warn', `taskfence's ${tables} tables match version ${formatVersion(status.currentVersion)}; other tables present`, items);
  return check('drift.schema', 'fail', `${failures} difference${failures === 1 ? '' : 's'} from the schema of version ${formatVersion(status.currentVersion)}`, items);
}
