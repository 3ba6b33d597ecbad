import { RerunBehavior, Umzug } from 'umzug';
import {
  BaselineMismatchError,
  BaselineRequiredError,
  MigrationChecksumMismatchError,
  DataLossError,
  LockTimeoutError,
  MigrationFailedError,
  MigrationHistoryDamagedError,
  type DataLoss,
  TaskfenceError,
  UnknownMigrationsError,
  UnknownVersionError,
  formatVersion,
} from '../errors.js';
import { inlineParameters } from './recording-driver.js';
import { sql, type CompiledQuery, type Kysely } from 'kysely';
import type { SchemaDescription } from '../schema/describe.js';
import type { MigrationLockHolder, StoreDialect } from '../dialects/types.js';
import type { Database } from '../schema/database.js';
import { MIGRATIONS } from '../migrations/index.js';
import type { MigrationDefinition } from '../migrations/types.js';
import { migrationChecksum, recordMigration } from './checksum.js';
import { expectedTablesAt } from './reference.js';
import { tableIn } from '../dialects/schema.js';

export const HISTORY_TABLE = 'taskfence_migrations';
const HISTORY_COLUMNS = ['version', 'name', 'checksum', 'applied_at', 'duration_ms'] as const;
const DEFAULT_LOCK_WAIT_MS = 60_000;
const DEFAULT_DDL_LOCK_TIMEOUT_MS = 10_000;

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
  | {
      readonly type: 'applied' | 'reverted';
      readonly version: number;
      readonly name: string;
      readonly durationMs: number;
    }
  | { readonly type: 'skipped'; readonly version: number; readonly name: string; readonly reason: string }
  | {
      readonly type: 'progress';
      readonly version: number;
      readonly message: string;
      /** Rows done so far and, when the migration can tell, the total (see `MigrationDefinition.workRows`). */
      readonly done?: number;
      readonly total?: number;
    }
  | { readonly type: 'waiting'; readonly waitedMs: number; readonly holder: MigrationLockHolder | null };

export interface MigrateOptions {
  /** Target version: up or down to it. Default: the latest. 0 reverts everything. */
  readonly to?: number;
  /** Adopt a database without history as being at this version (its tables are verified first). */
  readonly baseline?: number;
  /** How long to wait for another migrator to release the migration lock (default 60 000 ms). */
  readonly migrationLockWaitMs?: number;
  /** PostgreSQL `lock_timeout` for migration DDL, e.g. waiting for a table a long transaction uses (default 10 000 ms; 0 disables). */
  readonly ddlLockTimeoutMs?: number;
  /** @deprecated The old name of `migrationLockWaitMs`. */
  readonly lockTimeoutMs?: number;
  /** Allow down steps that drop tables or columns holding rows (default false: refuse, changing nothing). */
  readonly allowDataLoss?: boolean;
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
  /** Tables and columns holding rows that this (down) step drops. */
  readonly destructive: readonly DataLoss[];
  /** Where a value comes from: read from the database now, or known only at run time. */
  readonly notes: readonly string[];
}

/**
 * Runs the migration chain against one store's database. Each migration and its history row
 * commit in one transaction that first takes the migration lock (PostgreSQL: a transaction-scoped
 * advisory lock; SQLite: `BEGIN IMMEDIATE`) and re-reads the history inside it, so each migration
 * is applied exactly once however many deploys race, and no session lock is needed for it.
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
    const table = tables.find((t) => t.name === HISTORY_TABLE);
    if (!table) return [];
    const columns = new Set(table.columns.map((c) => c.name));
    const missing = HISTORY_COLUMNS.filter((c) => !columns.has(c));
    if (missing.length > 0) {
      throw new MigrationHistoryDamagedError(
        `column${missing.length > 1 ? 's' : ''} ${missing.join(', ')} ${missing.length > 1 ? 'are' : 'is'} missing (it has ${[...columns].join(', ')})`,
      );
    }
    const rows = await db.selectFrom(HISTORY_TABLE).selectAll().orderBy('version').execute();
    return rows.map((r) => {
      const version = Number(r.version);
      const bad =
        !Number.isInteger(version) || version <= 0
          ? 'version'
          : typeof r.name !== 'string' || r.name === ''
            ? 'name'
            : typeof r.checksum !== 'string' || r.checksum === ''
              ? 'checksum'
              : r.applied_at === null || !Number.isFinite(Number(r.applied_at))
                ? 'applied_at'
                : undefined;
      if (bad) {
        throw new MigrationHistoryDamagedError(
          `the row for version ${String(r.version)} has ${r[bad as keyof typeof r] === null ? 'a NULL' : 'an invalid'} ${bad}`,
        );
      }
      return {
        version,
        name: r.name,
        checksum: r.checksum,
        appliedAt: Number(r.applied_at),
        durationMs: Number(r.duration_ms),
      };
    });
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
      .map((h) => ({
        version: h.version,
        name: h.name,
        recordedChecksum: h.checksum,
        currentChecksum: checksums.get(h.version)!,
      }));
    const unknown = history.filter((h) => !byVersion.has(h.version)).map((h) => ({ version: h.version, name: h.name }));
    const baselineRequired =
      history.length === 0 &&
      ((await this.#existingTaskfenceTables(db)).length > 0 || ((await this.#dialect.readUserVersion(db)) ?? 0) > 0);
    return {
      currentVersion: history.at(-1)?.version ?? 0,
      latestVersion: this.latestVersion,
      applied: history,
      pending: this.#migrations
        .filter((m) => !appliedVersions.has(m.version))
        .map((m) => ({ version: m.version, name: m.name })),
      modified,
      unknown,
      baselineRequired,
    };
  }

  /** Refuses to go on when the history and the code disagree. */
  #verify(status: MigrationStatus): void {
    if (status.unknown.length > 0) throw new UnknownMigrationsError(status.unknown.map((u) => u.version));
    const first = status.modified[0];
    if (first)
      throw new MigrationChecksumMismatchError(
        first.version,
        first.name,
        first.recordedChecksum,
        first.currentChecksum,
      );
  }

  #assertKnownVersion(version: number): void {
    if (version !== 0 && !this.#migrations.some((m) => m.version === version)) {
      throw new UnknownVersionError(
        version,
        this.#migrations.map((m) => m.version),
      );
    }
  }

  /**
   * The exact SQL the pending migrations up (or down) to `to` would run on this dialect, with the
   * values they will run with: the reads a migration makes (0052's role list and keyset batches)
   * run against the live database, and a value that is only known at run time (the time a backfill
   * compares with) is named in `notes`. Down steps list the rows they would drop. Applies nothing.
   */
  async plan(options: { to?: number; now?: number } = {}): Promise<PlanStep[]> {
    const status = await this.status();
    this.#verify(status);
    if (status.baselineRequired) throw await this.#baselineRequiredError();
    const target = options.to ?? this.latestVersion;
    this.#assertKnownVersion(target);
    const now = options.now ?? Date.now();
    const applied = new Set(status.applied.map((a) => a.version));
    const steps: PlanStep[] = [];
    const render = async (
      m: MigrationDefinition,
      direction: 'up' | 'down',
      destructive: readonly DataLoss[],
    ): Promise<PlanStep> => {
      let reads = 0;
      let failedReads = 0;
      const answer = async (query: CompiledQuery) => {
        if (!/^\s*select\b/i.test(query.sql)) return undefined;
        try {
          const result = await this.#dialect.db.executeQuery(query);
          reads++;
          return result;
        } catch {
          failedReads++;
          return undefined;
        }
      };
      const queries = await recordMigration(m, direction, this.#dialect.kind, { now, answer });
      const statements = queries
        .filter((q) => !/^\s*select\b/i.test(q.sql))
        .map((q) => inlineParameters(this.#dialect.kind, q));
      const notes: string[] = [];
      // A statement that changes with `now` depends on the time migrate starts.
      const later = await recordMigration(m, direction, this.#dialect.kind, {
        now: now + 1,
        answer: async () => undefined,
      });
      const early = await recordMigration(m, direction, this.#dialect.kind, { now, answer: async () => undefined });
      if (later.some((q, i) => JSON.stringify(q.parameters) !== JSON.stringify(early[i]?.parameters))) {
        notes.push(
          `uses the time migrate starts, known only at run time; shown with the time of this plan, ${new Date(now).toISOString()} (${now})`,
        );
      }
      if (reads > 0)
        notes.push(
          `values read from the database now (${reads} reads); they change if the data changes before migrate runs`,
        );
      if (failedReads > 0)
        notes.push(`${failedReads} reads need tables that earlier steps create; shown as on empty tables`);
      return { version: m.version, name: m.name, direction, statements, destructive, notes };
    };
    for (const m of this.#migrations) {
      if (!applied.has(m.version) && m.version <= target) steps.push(await render(m, 'up', []));
    }
    const downs = [...this.#migrations].reverse().filter((m) => applied.has(m.version) && m.version > target);
    for (const m of downs) {
      const losses = await this.#dialect.readTransaction((trx) => this.#droppedRows(trx, m));
      steps.push(await render(m, 'down', losses));
    }
    return steps;
  }

  /** Migrates up or down to `options.to` (default: latest), adopting a baseline first if asked. */
  async migrate(options: MigrateOptions = {}): Promise<MigrateResult> {
    const target = options.to ?? this.latestVersion;
    this.#assertKnownVersion(target);
    if (options.baseline !== undefined) this.#assertKnownVersion(options.baseline);
    const emit = options.onEvent ?? (() => {});
    const lock: LockSettings = {
      waitMs: options.migrationLockWaitMs ?? options.lockTimeoutMs ?? DEFAULT_LOCK_WAIT_MS,
      ddlLockTimeoutMs: options.ddlLockTimeoutMs ?? DEFAULT_DDL_LOCK_TIMEOUT_MS,
      onWaiting: (holder, waitedMs) => emit({ type: 'waiting', holder, waitedMs }),
    };
    // Both dialects' withMigrationLock throw MigrationLockTimeoutError when the wait runs out.
    return this.#migrate(target, options, lock, emit);
  }

  async #migrate(
    target: number,
    options: MigrateOptions,
    lock: LockSettings,
    emit: (event: MigrationEvent) => void,
  ): Promise<MigrateResult> {
    const checksums = await this.#checksumsByVersion();
    // Decide on history and tables under the migration lock: another migrator may be committing
    // version 0005 right now, and its tables and history row appear together. Nothing is created
    // here, so a refusal leaves the database exactly as it was.
    let status = await this.#dialect.withMigrationLock((trx) => this.#statusIn(trx, checksums), lock);
    this.#verify(status);
    if (options.baseline !== undefined) {
      await this.#adoptBaseline(options.baseline, status, lock);
      emit({ type: 'baseline', version: options.baseline });
      status = await this.status();
      this.#verify(status);
    } else if (status.baselineRequired) {
      throw await this.#baselineRequiredError();
    }

    const fromVersion = status.currentVersion;
    const now = options.now ?? Date.now();
    const applied: number[] = [];
    const reverted: number[] = [];
    const byName = new Map(this.#migrations.map((m) => [migrationName(m), m]));
    const appliedNow = new Set(status.applied.map((a) => a.version));
    const upSteps = this.#migrations.filter((m) => !appliedNow.has(m.version) && m.version <= target);
    const downSteps = [...this.#migrations].reverse().filter((m) => appliedNow.has(m.version) && m.version > target);
    if (downSteps.length > 0 && !options.allowDataLoss) {
      // Count before changing anything, so a refusal changes nothing; each down re-checks under the lock.
      const losses = await this.#dialect.readTransaction(async (trx) => {
        const found: DataLoss[] = [];
        for (const m of downSteps) found.push(...(await this.#droppedRows(trx, m)));
        return found;
      });
      if (losses.length > 0) throw new DataLossError(losses);
    }

    const umzug = new Umzug<object>({
      migrations: this.#migrations.map((m) => ({
        name: migrationName(m),
        up: async () => {
          if (await this.#apply(m, 'up', checksums.get(m.version)!, now, emit, lock, options)) applied.push(m.version);
        },
        down: async () => {
          if (await this.#apply(m, 'down', checksums.get(m.version)!, now, emit, lock, options))
            reverted.push(m.version);
        },
      })),
      context: {},
      storage: {
        executed: async () =>
          (await this.#readHistory()).map((h) => `${formatVersion(h.version)}_${h.name}`).filter((n) => byName.has(n)),
        logMigration: async () => {}, // written inside the migration's own transaction
        unlogMigration: async () => {},
      },
      logger: undefined,
    });

    try {
      if (upSteps.length > 0) await umzug.up({ migrations: upSteps.map(migrationName), rerun: RerunBehavior.SKIP });
      if (downSteps.length > 0)
        await umzug.down({ migrations: downSteps.map(migrationName), rerun: RerunBehavior.SKIP });
    } catch (error) {
      // umzug wraps what the migration threw; surface our own error.
      const cause = (error as { cause?: unknown }).cause;
      if (cause instanceof TaskfenceError) throw cause;
      throw error;
    }
    return { fromVersion, toVersion: (await this.status()).currentVersion, applied, reverted };
  }

  /** The error for a database with tables but no history: lists what is there, suggests only a taskfence version that fits. */
  async #baselineRequiredError(): Promise<BaselineRequiredError> {
    const actual = await this.#dialect.describeSchema();
    const tables = Object.keys(actual.tables)
      .filter((t) => t !== HISTORY_TABLE)
      .sort();
    let suggestion: number | null = null;
    for (const m of [...this.#migrations].reverse()) {
      if ((await this.#baselineProblems(m.version, actual)).length === 0) {
        suggestion = m.version;
        break;
      }
    }
    return new BaselineRequiredError(tables, await this.#dialect.readUserVersion(), suggestion);
  }

  /** Tables and columns that reverting `m` drops, with the rows they hold (only those holding rows). */
  async #droppedRows(db: Kysely<Database>, m: MigrationDefinition): Promise<DataLoss[]> {
    const index = this.#migrations.indexOf(m);
    const before = await expectedTablesAt(m.version, this.#migrations);
    const after =
      index > 0
        ? await expectedTablesAt(this.#migrations[index - 1]!.version, this.#migrations)
        : new Map<string, string[]>();
    const existing = new Set((await db.introspection.getTables()).map((t) => t.name));
    const losses: DataLoss[] = [];
    for (const [table, columns] of before) {
      if (!existing.has(table)) continue;
      const kept = after.get(table);
      const dropped = kept ? columns.filter((c) => !kept.includes(c)) : [];
      if (kept && dropped.length === 0) continue;
      // A dropped table loses its rows; a dropped column the rows where it holds a value.
      const targets = kept ? dropped : [undefined];
      for (const column of targets) {
        const counted = column === undefined ? sql`count(*)` : sql`count(${sql.ref(column)})`;
        const { rows } = await sql<{ n: number | string }>`select ${counted} as n from ${tableIn(db, table)}`.execute(
          db,
        );
        const count = Number(rows[0]?.n ?? 0);
        if (count > 0)
          losses.push({ version: m.version, name: m.name, table, ...(column ? { column } : {}), rows: count });
      }
    }
    return losses;
  }

  /** What reverting the applied migrations above `to` would drop, with row counts (for `plan`). */
  async dataLoss(to: number): Promise<DataLoss[]> {
    const status = await this.status();
    const applied = new Set(status.applied.map((a) => a.version));
    const downs = [...this.#migrations].reverse().filter((m) => applied.has(m.version) && m.version > to);
    return this.#dialect.readTransaction(async (trx) => {
      const found: DataLoss[] = [];
      for (const m of downs) found.push(...(await this.#droppedRows(trx, m)));
      return found;
    });
  }

  /** Applies or reverts one migration together with its history row; false if another migrator already did. */
  async #apply(
    m: MigrationDefinition,
    direction: 'up' | 'down',
    checksum: string,
    now: number,
    emit: (event: MigrationEvent) => void,
    lock: LockSettings,
    options: MigrateOptions,
  ): Promise<boolean> {
    let done = false;
    const started = Date.now();
    try {
      await this.#dialect.withMigrationLock(
        async (trx) => {
          done = false;
          // Re-read under the migration lock, inside the transaction that applies: whoever held the
          // lock before committed (or rolled back) everything, so this run is exactly-once on both
          // dialects, whether or not an earlier migrator lost its connection.
          await this.#createHistoryTable(trx);
          const recorded = await trx
            .selectFrom(HISTORY_TABLE)
            .select('version')
            .where('version', '=', m.version)
            .executeTakeFirst();
          if (direction === 'up' ? recorded !== undefined : recorded === undefined) return;
          if (direction === 'down' && !options.allowDataLoss) {
            const losses = await this.#droppedRows(trx, m);
            if (losses.length > 0) throw new DataLossError(losses);
          }
          emit({ type: direction === 'up' ? 'applying' : 'reverting', version: m.version, name: m.name });
          const total = direction === 'up' && m.workRows ? await m.workRows(trx) : undefined;
          await m[direction]({
            db: trx,
            types: this.#dialect.columnTypes,
            now,
            progress: (message, counts) =>
              emit({
                type: 'progress',
                version: m.version,
                message,
                ...(counts ? { done: total === undefined ? counts.done : Math.min(counts.done, total) } : {}),
                ...(counts && total !== undefined ? { total } : {}),
              }),
          });
          if (direction === 'up') {
            await trx
              .insertInto(HISTORY_TABLE)
              .values({
                version: m.version,
                name: m.name,
                checksum,
                applied_at: Date.now(),
                duration_ms: Date.now() - started,
              })
              .execute();
          } else {
            await trx.deleteFrom(HISTORY_TABLE).where('version', '=', m.version).execute();
          }
          done = true;
        },
        { ...lock, bulk: true },
      );
    } catch (error) {
      if (error instanceof LockTimeoutError) {
        // The DDL waited for a table another session uses: name the migration's own setting.
        throw new MigrationFailedError(
          m.version,
          m.name,
          direction,
          new Error(
            `its DDL waited longer than ddlLockTimeoutMs (${lock.ddlLockTimeoutMs} ms, --ddl-lock-timeout) for a table lock another session holds; migrate when the table is less busy, or raise it`,
          ),
        );
      }
      if (error instanceof TaskfenceError) throw error;
      throw new MigrationFailedError(m.version, m.name, direction, error);
    }
    if (done) {
      emit({
        type: direction === 'up' ? 'applied' : 'reverted',
        version: m.version,
        name: m.name,
        durationMs: Date.now() - started,
      });
    } else {
      emit({
        type: 'skipped',
        version: m.version,
        name: m.name,
        reason: `another migrator already ${direction === 'up' ? 'applied' : 'reverted'} it`,
      });
    }
    return done;
  }

  async #createHistoryTable(trx: Kysely<Database>): Promise<void> {
    await trx.schema
      .createTable(HISTORY_TABLE)
      .ifNotExists()
      .addColumn('version', 'integer', (c) => c.primaryKey())
      .addColumn('name', 'text', (c) => c.notNull())
      .addColumn('checksum', 'text', (c) => c.notNull())
      .addColumn('applied_at', this.#dialect.columnTypes.epochMs, (c) => c.notNull())
      .addColumn('duration_ms', 'integer', (c) => c.notNull())
      .execute();
  }

  /** What keeps the database from being adopted as `version` (empty when it matches). */
  async #baselineProblems(version: number, actual: SchemaDescription): Promise<string[]> {
    const expected = await expectedTablesAt(version, this.#migrations);
    const problems: string[] = [];
    for (const [table, columns] of expected) {
      const found = actual.tables[table];
      if (!found) {
        problems.push(`table ${table} is missing`);
        continue;
      }
      for (const column of columns)
        if (!(column in found.columns)) problems.push(`column ${table}.${column} is missing`);
    }
    // Tables that only later versions create mean the database is newer than claimed.
    const later = await expectedTablesAt(this.latestVersion, this.#migrations);
    for (const table of later.keys()) {
      if (!expected.has(table) && actual.tables[table]) problems.push(`table ${table} belongs to a later version`);
    }
    return problems;
  }

  /** Records versions up to `version` as applied after checking that the database has their tables and columns. */
  async #adoptBaseline(version: number, status: MigrationStatus, lock: LockSettings): Promise<void> {
    if (version === 0)
      throw new UnknownVersionError(
        0,
        this.#migrations.map((m) => m.version),
      );
    if (status.applied.length > 0) {
      throw new BaselineMismatchError(version, [
        `the database already has migration history up to ${formatVersion(status.currentVersion)}; --baseline only adopts a database without history`,
      ]);
    }
    const problems = await this.#baselineProblems(version, await this.#dialect.describeSchema());
    if (problems.length > 0) throw new BaselineMismatchError(version, problems);
    const checksums = await this.#checksumsByVersion();
    await this.#dialect.withMigrationLock(async (trx) => {
      await this.#createHistoryTable(trx);
      const existing = await trx.selectFrom(HISTORY_TABLE).select('version').executeTakeFirst();
      if (existing) return; // another migrator adopted it meanwhile
      for (const m of this.#migrations.filter((m) => m.version <= version)) {
        await trx
          .insertInto(HISTORY_TABLE)
          .values({
            version: m.version,
            name: m.name,
            checksum: checksums.get(m.version)!,
            applied_at: Date.now(),
            duration_ms: 0,
          })
          .execute();
      }
    }, lock);
  }
}

interface LockSettings {
  readonly waitMs: number;
  readonly ddlLockTimeoutMs: number;
  readonly onWaiting: (holder: MigrationLockHolder | null, waitedMs: number) => void;
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
