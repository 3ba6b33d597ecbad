import { RerunBehavior, Umzug } from 'umzug';
import {
  BaselineMismatchError,
  BaselineRequiredError,
  MigrationChecksumMismatchError,
  MigrationFailedError,
  MigrationLockTimeoutError,
  TaskfenceError,
  UnknownMigrationsError,
  UnknownVersionError,
  WriteTimeoutError,
  formatVersion,
} from '../errors.js';
import { inlineParameters } from '../dialects/recording.js';
import type { Kysely } from 'kysely';
import type { StoreDialect } from '../dialects/types.js';
import type { Database } from '../schema/database.js';
import { MIGRATIONS } from '../migrations/index.js';
import type { MigrationDefinition } from '../migrations/types.js';
import { migrationChecksum, recordMigration } from './checksum.js';
import { expectedTablesAt } from './reference.js';

export const HISTORY_TABLE = 'taskfence_migrations';
const DEFAULT_LOCK_TIMEOUT_MS = 60_000;

export interface AppliedMigration {
  readonly version: number;
  readonly name: string;
  readonly checksum: string;
  readonly appliedAt: number;
  readonly durationMs: number;
}

export interface MigrationStatus {
  /** The highest applied version, 0 for an empty database. */
  readonly currentVersion: number;
  readonly latestVersion: number;
  readonly applied: readonly AppliedMigration[];
  readonly pending: readonly { version: number; name: string }[];
  /** Applied migrations whose code changed since (checksum differs). */
  readonly modified: readonly { version: number; name: string; recordedChecksum: string; currentChecksum: string }[];
  /** In the database, not in this code. */
  readonly unknown: readonly { version: number; name: string }[];
  /** The database has taskfence tables but no history: adopt it with a baseline first. */
  readonly baselineRequired: boolean;
}

/** What happened during `migrate`, reported as it happens. */
export type MigrationEvent =
  | { readonly type: 'baseline'; readonly version: number }
  | { readonly type: 'applying' | 'reverting'; readonly version: number; readonly name: string }
  | { readonly type: 'applied' | 'reverted'; readonly version: number; readonly name: string; readonly durationMs: number }
  | { readonly type: 'skipped'; readonly version: number; readonly name: string; readonly reason: string }
  | { readonly type: 'progress'; readonly version: number; readonly message: string };

export interface MigrateOptions {
  /** Target version: up or down to it. Default: the latest. 0 reverts everything. */
  readonly to?: number;
  /** Adopt a database without history as being at this version (its tables are verified first). */
  readonly baseline?: number;
  /** How long to wait for another migrator (default 60 000 ms). */
  readonly lockTimeoutMs?: number;
  readonly onEvent?: (event: MigrationEvent) => void;
  /** Epoch ms used by data backfills (default: now). */
  readonly now?: number;
}

export interface MigrateResult {
  readonly fromVersion: number;
  readonly toVersion: number;
  readonly applied: readonly number[];
  readonly reverted: readonly number[];
}

export interface PlanStep {
  readonly version: number;
  readonly name: string;
  readonly direction: 'up' | 'down';
  readonly statements: readonly string[];
}

/**
 * Runs the migration chain against one store's database. Each migration and its history row
 * commit in one transaction; concurrent migrators serialize (PostgreSQL: advisory lock;
 * SQLite: the history is re-read inside each migration's `BEGIN IMMEDIATE` transaction), so each
 * migration is applied exactly once however many deploys race.
 */
export class Migrator {
  readonly #dialect: StoreDialect;
  readonly #migrations: readonly MigrationDefinition[];
  #checksums: Map<number, string> | undefined;

  constructor(dialect: StoreDialect, migrations: readonly MigrationDefinition[] = MIGRATIONS) {
    assertWellFormedChain(migrations);
    this.#dialect = dialect;
    this.#migrations = migrations;
  }

  get latestVersion(): number {
    return this.#migrations.at(-1)?.version ?? 0;
  }

  async #checksumsByVersion(): Promise<Map<number, string>> {
    if (!this.#checksums) {
      const entries = await Promise.all(
        this.#migrations.map(async (m) => [m.version, await migrationChecksum(m, this.#dialect.kind)] as const),
      );
      this.#checksums = new Map(entries);
    }
    return this.#checksums;
  }

  async #readHistory(db: Kysely<Database> = this.#dialect.db): Promise<AppliedMigration[]> {
    const tables = await db.introspection.getTables();
    if (!tables.some((t) => t.name === HISTORY_TABLE)) return [];
    const rows = await db.selectFrom(HISTORY_TABLE).selectAll().orderBy('version').execute();
    return rows.map((r) => ({
      version: Number(r.version),
      name: r.name,
      checksum: r.checksum,
      appliedAt: Number(r.applied_at),
      durationMs: Number(r.duration_ms),
    }));
  }

  async #existingTaskfenceTables(db: Kysely<Database> = this.#dialect.db): Promise<string[]> {
    const known = new Set((await expectedTablesAt(this.latestVersion, this.#migrations)).keys());
    const tables = await db.introspection.getTables();
    return tables.map((t) => t.name).filter((name) => known.has(name));
  }

  /** Applied, pending, modified and unknown migrations, without changing anything. */
  async status(): Promise<MigrationStatus> {
    const checksums = await this.#checksumsByVersion();
    // One read transaction, so history and tables come from the same snapshot.
    return this.#dialect.readTransaction((trx) => this.#statusIn(trx, checksums));
  }

  async #statusIn(db: Kysely<Database>, checksums: Map<number, string>): Promise<MigrationStatus> {
    const history = await this.#readHistory(db);
    const byVersion = new Map(this.#migrations.map((m) => [m.version, m]));
    const appliedVersions = new Set(history.map((h) => h.version));
    const modified = history
      .filter((h) => byVersion.has(h.version) && checksums.get(h.version) !== h.checksum)
      .map((h) => ({ version: h.version, name: h.name, recordedChecksum: h.checksum, currentChecksum: checksums.get(h.version)! }));
    const unknown = history.filter((h) => !byVersion.has(h.version)).map((h) => ({ version: h.version, name: h.name }));
    const baselineRequired =
      history.length === 0 &&
      ((await this.#existingTaskfenceTables(db)).length > 0 || ((await this.#dialect.readUserVersion(db)) ?? 0) > 0);
    return {
      currentVersion: history.at(-1)?.version ?? 0,
      latestVersion: this.latestVersion,
      applied: history,
      pending: this.#migrations.filter((m) => !appliedVersions.has(m.version)).map((m) => ({ version: m.version, name: m.name })),
      modified,
      unknown,
      baselineRequired,
    };
  }

  /** Refuses to go on when the history and the code disagree. */
  #verify(status: MigrationStatus): void {
    if (status.unknown.length > 0) throw new UnknownMigrationsError(status.unknown.map((u) => u.version));
    const first = status.modified[0];
    if (first) throw new MigrationChecksumMismatchError(first.version, first.name, first.recordedChecksum, first.currentChecksum);
  }

  #assertKnownVersion(version: number): void {
    if (version !== 0 && !this.#migrations.some((m) => m.version === version)) {
      throw new UnknownVersionError(version, this.#migrations.map((m) => m.version));
    }
  }

  /** The exact SQL the pending migrations up (or down) to `to` would run on this dialect; applies nothing. */
  async plan(options: { to?: number } = {}): Promise<PlanStep[]> {
    const status = await this.status();
    this.#verify(status);
    const target = options.to ?? this.latestVersion;
    this.#assertKnownVersion(target);
    const applied = new Set(status.applied.map((a) => a.version));
    const steps: PlanStep[] = [];
    const render = async (m: MigrationDefinition, direction: 'up' | 'down') => ({
      version: m.version,
      name: m.name,
      direction,
      statements: (await recordMigration(m, direction, this.#dialect.kind)).map((q) => inlineParameters(this.#dialect.kind, q)),
    });
    for (const m of this.#migrations) {
      if (!applied.has(m.version) && m.version <= target) steps.push(await render(m, 'up'));
    }
    for (const m of [...this.#migrations].reverse()) {
      if (applied.has(m.version) && m.version > target) steps.push(await render(m, 'down'));
    }
    return steps;
  }

  /** Migrates up or down to `options.to` (default: latest), adopting a baseline first if asked. */
  async migrate(options: MigrateOptions = {}): Promise<MigrateResult> {
    const lockTimeoutMs = options.lockTimeoutMs ?? DEFAULT_LOCK_TIMEOUT_MS;
    const target = options.to ?? this.latestVersion;
    this.#assertKnownVersion(target);
    if (options.baseline !== undefined) this.#assertKnownVersion(options.baseline);
    try {
      return await this.#dialect.withMigrationLock(() => this.#migrateLocked(target, options, lockTimeoutMs), lockTimeoutMs);
    } catch (error) {
      if (error instanceof WriteTimeoutError) throw new MigrationLockTimeoutError(lockTimeoutMs);
      throw error;
    }
  }

  async #migrateLocked(target: number, options: MigrateOptions, lockTimeoutMs: number): Promise<MigrateResult> {
    const emit = options.onEvent ?? (() => {});
    const checksumsForStatus = await this.#checksumsByVersion();
    let status = await this.#dialect.writeTransaction(async (trx) => {
      await trx.schema
        .createTable(HISTORY_TABLE)
        .ifNotExists()
        .addColumn('version', 'integer', (c) => c.primaryKey())
        .addColumn('name', 'text', (c) => c.notNull())
        .addColumn('checksum', 'text', (c) => c.notNull())
        .addColumn('applied_at', this.#dialect.columnTypes.epochMs, (c) => c.notNull())
        .addColumn('duration_ms', 'integer', (c) => c.notNull())
        .execute();
      // Decide on history and tables inside the write transaction: another migrator may be
      // committing version 0005 right now, and its tables and history row appear together.
      return this.#statusIn(trx, checksumsForStatus);
    }, { deadlineMs: lockTimeoutMs });
    this.#verify(status);
    if (options.baseline !== undefined) {
      await this.#adoptBaseline(options.baseline, status, lockTimeoutMs);
      emit({ type: 'baseline', version: options.baseline });
      status = await this.status();
    } else if (status.baselineRequired) {
      throw new BaselineRequiredError(await this.#existingTaskfenceTables(), await this.#dialect.readUserVersion());
    }

    const fromVersion = status.currentVersion;
    const checksums = await this.#checksumsByVersion();
    const now = options.now ?? Date.now();
    const applied: number[] = [];
    const reverted: number[] = [];
    const byName = new Map(this.#migrations.map((m) => [migrationName(m), m]));

    const umzug = new Umzug<object>({
      migrations: this.#migrations.map((m) => ({
        name: migrationName(m),
        up: async () => {
          if (await this.#apply(m, 'up', checksums.get(m.version)!, now, emit, lockTimeoutMs)) applied.push(m.version);
        },
        down: async () => {
          if (await this.#apply(m, 'down', checksums.get(m.version)!, now, emit, lockTimeoutMs)) reverted.push(m.version);
        },
      })),
      context: {},
      storage: {
        executed: async () => (await this.#readHistory()).map((h) => `${formatVersion(h.version)}_${h.name}`).filter((n) => byName.has(n)),
        logMigration: async () => {}, // written inside the migration's own transaction
        unlogMigration: async () => {},
      },
      logger: undefined,
    });

    const appliedNow = new Set(status.applied.map((a) => a.version));
    const ups = this.#migrations.filter((m) => !appliedNow.has(m.version) && m.version <= target).map(migrationName);
    const downs = [...this.#migrations].reverse().filter((m) => appliedNow.has(m.version) && m.version > target).map(migrationName);
    try {
      if (ups.length > 0) await umzug.up({ migrations: ups, rerun: RerunBehavior.SKIP });
      if (downs.length > 0) await umzug.down({ migrations: downs, rerun: RerunBehavior.SKIP });
    } catch (error) {
      // umzug wraps what the migration threw; surface our own error.
      const cause = (error as { cause?: unknown }).cause;
      if (cause instanceof TaskfenceError) throw cause;
      throw error;
    }
    return { fromVersion, toVersion: (await this.status()).currentVersion, applied, reverted };
  }

  /** Applies or reverts one migration together with its history row; false if another migrator already did. */
  async #apply(
    m: MigrationDefinition,
    direction: 'up' | 'down',
    checksum: string,
    now: number,
    emit: (event: MigrationEvent) => void,
    lockTimeoutMs: number,
  ): Promise<boolean> {
    let done = false;
    const started = Date.now();
    try {
      await this.#dialect.writeTransaction(async (trx) => {
        done = false;
        // Re-read inside the write transaction: across SQLite processes this is what makes the
        // run exactly-once; on PostgreSQL the advisory lock already serializes migrators.
        const recorded = await trx.selectFrom(HISTORY_TABLE).select('version').where('version', '=', m.version).executeTakeFirst();
        if (direction === 'up' ? recorded !== undefined : recorded === undefined) return;
        emit({ type: direction === 'up' ? 'applying' : 'reverting', version: m.version, name: m.name });
        await m[direction]({
          db: trx,
          types: this.#dialect.columnTypes,
          now,
          progress: (message) => emit({ type: 'progress', version: m.version, message }),
        });
        if (direction === 'up') {
          await trx
            .insertInto(HISTORY_TABLE)
            .values({ version: m.version, name: m.name, checksum, applied_at: Date.now(), duration_ms: Date.now() - started })
            .execute();
        } else {
          await trx.deleteFrom(HISTORY_TABLE).where('version', '=', m.version).execute();
        }
        done = true;
      }, { deadlineMs: lockTimeoutMs, bulk: true });
    } catch (error) {
      if (error instanceof TaskfenceError) throw error;
      throw new MigrationFailedError(m.version, m.name, direction, error);
    }
    if (done) {
      emit({ type: direction === 'up' ? 'applied' : 'reverted', version: m.version, name: m.name, durationMs: Date.now() - started });
    } else {
      emit({ type: 'skipped', version: m.version, name: m.name, reason: `another migrator already ${direction === 'up' ? 'applied' : 'reverted'} it` });
    }
    return done;
  }

  /** Records versions up to `version` as applied after checking that the database has their tables and columns. */
  async #adoptBaseline(version: number, status: MigrationStatus, lockTimeoutMs: number): Promise<void> {
    if (version === 0) throw new UnknownVersionError(0, this.#migrations.map((m) => m.version));
    if (status.applied.length > 0) {
      throw new BaselineMismatchError(version, [
        `the database already has migration history up to ${formatVersion(status.currentVersion)}; --baseline only adopts a database without history`,
      ]);
    }
    const expected = await expectedTablesAt(version, this.#migrations);
    const actual = await this.#dialect.describeSchema();
    const problems: string[] = [];
    for (const [table, columns] of expected) {
      const found = actual.tables[table];
      if (!found) {
        problems.push(`table ${table} is missing`);
        continue;
      }
      for (const column of columns) if (!(column in found.columns)) problems.push(`column ${table}.${column} is missing`);
    }
    // Tables that only later versions create mean the database is newer than claimed.
    const later = await expectedTablesAt(this.latestVersion, this.#migrations);
    for (const table of later.keys()) {
      if (!expected.has(table) && actual.tables[table]) problems.push(`table ${table} belongs to a later version`);
    }
    if (problems.length > 0) throw new BaselineMismatchError(version, problems);
    const checksums = await this.#checksumsByVersion();
    await this.#dialect.writeTransaction(async (trx) => {
      const existing = await trx.selectFrom(HISTORY_TABLE).select('version').executeTakeFirst();
      if (existing) return; // another migrator adopted it meanwhile
      for (const m of this.#migrations.filter((m) => m.version <= version)) {
        await trx
          .insertInto(HISTORY_TABLE)
          .values({ version: m.version, name: m.name, checksum: checksums.get(m.version)!, applied_at: Date.now(), duration_ms: 0 })
          .execute();
      }
    }, { deadlineMs: lockTimeoutMs });
  }
}

function migrationName(m: MigrationDefinition): string {
  return `${formatVersion(m.version)}_${m.name}`;
}

function assertWellFormedChain(migrations: readonly MigrationDefinition[]): void {
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
