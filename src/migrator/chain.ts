import type { Kysely } from 'kysely';
import {
  MigrationChecksumMismatchError,
  UnknownMigrationsError,
  UnknownVersionError,
  formatVersion,
} from '../errors.js';
import type { StoreDialect } from '../dialects/types.js';
import type { Database } from '../schema/database.js';
import type { MigrationDefinition } from '../migrations/types.js';
import { readHistory } from './history.js';
import { expectedTablesAt } from './reference.js';
import { compareReleases } from '../release.js';
import { readStates, type VersionState } from './state.js';
import { pendingSteps, readDoneSteps } from './steps.js';
import type { CompatibilityWindow, MigrationStatus } from './types.js';

/** One chain of migrations against one store's database: what the migrator's modules share. */
export interface Chain {
  readonly dialect: StoreDialect;
  readonly migrations: readonly MigrationDefinition[];
  /** The last version of the chain (0 when it is empty). */
  readonly latestVersion: number;
}

/** Throws a `TypeError` unless versions increase and every migration has both directions. */
export function assertWellFormedChain(migrations: readonly MigrationDefinition[]): void {
  let previous = 0;
  for (const m of migrations) {
    if (!Number.isInteger(m.version) || m.version <= previous) {
      throw new TypeError(`Migration versions must be increasing positive integers; ${m.version} follows ${previous}.`);
    }
    if (typeof m.up !== 'function' || typeof m.down !== 'function') {
      throw new TypeError(`Migration ${formatVersion(m.version)} ${m.name} must define both up and down.`);
    }
    previous = m.version;
  }
}

/** An explicit target must name a version of the chain (or 0); throws `UnknownVersionError` otherwise. */
export function assertKnownVersion(chain: Chain, version: number): void {
  if (version !== 0 && !chain.migrations.some((m) => m.version === version)) {
    throw new UnknownVersionError(
      version,
      chain.migrations.map((m) => m.version),
    );
  }
}

/** The chain's tables present in the database (in the configured schema only). */
async function existingTaskfenceTables(chain: Chain, db: Kysely<Database>): Promise<string[]> {
  const known = new Set((await expectedTablesAt(chain.latestVersion, chain.migrations)).keys());
  const tables = await db.introspection.getTables();
  return tables.map((t) => t.name).filter((name) => known.has(name));
}

/** Applied, pending, modified and unknown migrations as `db` (a transaction, for one snapshot) sees them. */
export async function statusIn(
  chain: Chain,
  db: Kysely<Database>,
  checksums: ReadonlyMap<number, string>,
): Promise<MigrationStatus> {
  const history = await readHistory(db);
  const byVersion = new Map(chain.migrations.map((m) => [m.version, m]));
  const appliedVersions = new Set(history.map((h) => h.version));
  const modified = history
    .filter((h) => {
      const m = byVersion.get(h.version);
      return m !== undefined && !checksumMatches(m, chain.dialect.kind, checksums.get(h.version)!, h.checksum);
    })
    .map((h) => ({
      version: h.version,
      name: h.name,
      recordedChecksum: h.checksum,
      currentChecksum: checksums.get(h.version)!,
    }));
  const unknown = history.filter((h) => !byVersion.has(h.version)).map((h) => ({ version: h.version, name: h.name }));
  const baselineRequired =
    history.length === 0 &&
    ((await existingTaskfenceTables(chain, db)).length > 0 || ((await chain.dialect.readUserVersion(db)) ?? 0) > 0);
  const states = await readStates(db);
  const backfills = states
    .filter((st) => st.backfill === 'running' && byVersion.get(st.version)?.backfill !== undefined)
    .map((st) => ({ version: st.version, name: byVersion.get(st.version)!.name, done: st.done, changed: st.changed }));
  const steps = pendingSteps(
    chain.migrations,
    appliedVersions,
    new Set(states.map((st) => st.version)),
    await readDoneSteps(db),
  );
  return {
    currentVersion: history.at(-1)?.version ?? 0,
    latestVersion: chain.latestVersion,
    applied: history,
    pending: chain.migrations
      .filter((m) => !appliedVersions.has(m.version))
      .map((m) => ({ version: m.version, name: m.name })),
    modified,
    unknown,
    baselineRequired,
    backfills,
    steps,
    window: windowOf(states.filter((st) => appliedVersions.has(st.version))),
  };
}

/**
 * Is `recorded` this migration's checksum: today's, or one an earlier taskfence recorded for the
 * same change run another way (`MigrationDefinition.acceptedChecksums`)?
 */
export function checksumMatches(
  m: MigrationDefinition,
  kind: StoreDialect['kind'],
  current: string,
  recorded: string,
): boolean {
  return recorded === current || (m.acceptedChecksums?.[kind]?.includes(recorded) ?? false);
}

/** The compatibility window of the applied versions' recorded states. */
export function windowOf(states: readonly VersionState[]): CompatibilityWindow {
  let oldestWriterRelease: string | null = null;
  let setByVersion: number | null = null;
  for (const st of states) {
    if (st.minWriterRelease === null) continue;
    if (oldestWriterRelease === null || compareReleases(st.minWriterRelease, oldestWriterRelease) > 0) {
      oldestWriterRelease = st.minWriterRelease;
      setByVersion = st.version;
    }
  }
  return { oldestWriterRelease, setByVersion, newestAppliedByRelease: states.at(-1)?.appliedByRelease ?? null };
}

/** Refuses to go on when the history and the code disagree (unknown or edited migrations). */
export function verifyHistory(status: MigrationStatus): void {
  if (status.unknown.length > 0) throw new UnknownMigrationsError(status.unknown.map((u) => u.version));
  const first = status.modified[0];
  if (first)
    throw new MigrationChecksumMismatchError(first.version, first.name, first.recordedChecksum, first.currentChecksum);
}
