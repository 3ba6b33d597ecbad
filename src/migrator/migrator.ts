import { sql } from 'kysely';
import { DEFAULT_BATCH_SIZE, DEFAULT_BATCH_TIME_MS, type BatchSizing } from './batching.js';
import { DataLossError, InvalidArgumentError, ReleaseStillRunningError, type DataLoss } from '../errors.js';
import { instanceOf, runningReleasesAbove } from './releases.js';
import type { StoreDialect } from '../dialects/types.js';
import { MIGRATIONS } from '../migrations/index.js';
import type { MigrationDefinition } from '../migrations/types.js';
import { adoptBaseline, baselineRequiredError } from './baseline.js';
import { assertKnownVersion, assertWellFormedChain, statusIn, verifyHistory, type Chain } from './chain.js';
import { migrationChecksum } from './checksum.js';
import { droppedRowsOf } from './data-loss.js';
import { ensureConfiguredSchema } from './history.js';
import { lockSettings } from './lock.js';
import { planSteps } from './plan.js';
import { runChain, runDeferred, type ChainRun } from './run.js';
import { TASKFENCE_RELEASE } from '../release.js';
import type { MigrateOptions, MigrateResult, MigrationStatus, PlanStep } from './types.js';

export { HISTORY_TABLE } from './history.js';
export { STATE_TABLE } from './state.js';
export { STEPS_TABLE } from './steps.js';

export type {
  AppliedMigration,
  CompatibilityWindow,
  MigrateOptions,
  MigrateResult,
  MigrationEvent,
  MigrationStatus,
  PlanStep,
} from './types.js';

/**
 * Runs the migration chain against one store's database. umzug runs the chain (what is pending,
 * in which order, up or down to the target, and the events), with its storage backed by the
 * history table; each migration and its history row commit in one transaction that first takes
 * the migration lock (PostgreSQL: a transaction-scoped advisory lock; SQLite: `BEGIN IMMEDIATE`)
 * and re-reads the history inside it, so each migration is applied exactly once however many
 * deploys race, and no session lock is needed for it. Checksums are verified before anything runs.
 */
export class Migrator {
  readonly #chain: Chain;
  #checksums: Map<number, string> | undefined;

  readonly #release: string;

  /**
   * @param dialect The store's dialect (`store.dialect`).
   * @param migrations The chain (default: taskfence's own).
   * @param options `release`: the taskfence release recorded beside each version applied (default: this one's).
   */
  constructor(
    dialect: StoreDialect,
    migrations: readonly MigrationDefinition[] = MIGRATIONS,
    options: { readonly release?: string } = {},
  ) {
    assertWellFormedChain(migrations);
    this.#chain = { dialect, migrations, latestVersion: migrations.at(-1)?.version ?? 0 };
    this.#release = options.release ?? TASKFENCE_RELEASE;
  }

  /** The last version of the chain. */
  get latestVersion(): number {
    return this.#chain.latestVersion;
  }

  async #checksumsByVersion(): Promise<Map<number, string>> {
    if (!this.#checksums) {
      const { migrations, dialect } = this.#chain;
      const entries = await Promise.all(
        migrations.map(async (m) => [m.version, await migrationChecksum(m, dialect.kind)] as const),
      );
      this.#checksums = new Map(entries);
    }
    return this.#checksums;
  }

  /** Applied, pending, modified and unknown migrations, without changing anything. */
  async status(): Promise<MigrationStatus> {
    const checksums = await this.#checksumsByVersion();
    // One read transaction, so history and tables come from the same snapshot.
    return this.#chain.dialect.readTransaction((trx) => statusIn(this.#chain, trx, checksums));
  }

  /**
   * The exact SQL the pending migrations up (or down) to `to` would run on this dialect, with the
   * values they will run with: the reads a migration makes (0052's role list and keyset batches)
   * run against the live database, and a value that is only known at run time (the time a backfill
   * compares with) is named in `notes`. With a configured PostgreSQL schema the statements name it,
   * as `migrate` sends them. Down steps list the rows they would drop. Applies nothing.
   */
  async plan(
    options: { to?: number; now?: number; batchSize?: number; batchTimeMs?: number } = {},
  ): Promise<PlanStep[]> {
    const status = await this.status();
    verifyHistory(status);
    if (status.baselineRequired) throw await baselineRequiredError(this.#chain);
    const target = options.to ?? this.latestVersion;
    assertKnownVersion(this.#chain, target);
    return planSteps(this.#chain, status, target, options.now ?? Date.now(), batchSizing(options));
  }

  /**
   * Migrates up or down to `options.to` (default: latest), adopting a baseline first if asked.
   * With a configured PostgreSQL schema, creates it first if it is missing.
   */
  async migrate(options: MigrateOptions = {}): Promise<MigrateResult> {
    const chain = this.#chain;
    const target = options.to ?? this.latestVersion;
    assertKnownVersion(chain, target);
    const sizing = batchSizing(options);
    const pauseMs = options.pauseMs ?? null;
    if (pauseMs !== null && (!Number.isFinite(pauseMs) || pauseMs < 0))
      throw new InvalidArgumentError('pauseMs', `must be a number of ms, 0 or more (got ${String(options.pauseMs)})`);
    if (options.baseline !== undefined) assertKnownVersion(chain, options.baseline);
    const emit = options.onEvent ?? (() => {});
    // Both dialects' withMigrationLock throw MigrationLockTimeoutError when the wait runs out.
    const lock = lockSettings(options, emit);
    const checksums = await this.#checksumsByVersion();
    await ensureConfiguredSchema(chain.dialect);
    // Decide on history and tables under the migration lock: another migrator may be committing
    // version 0005 right now, and its tables and history row appear together. Nothing is created
    // here, so a refusal leaves the database exactly as it was.
    let status = await chain.dialect.withMigrationLock((trx) => statusIn(chain, trx, checksums), lock);
    verifyHistory(status);
    if (options.baseline !== undefined) {
      await adoptBaseline(chain, options.baseline, status, checksums, lock);
      emit({ type: 'baseline', version: options.baseline });
      status = await this.status();
      verifyHistory(status);
    } else if (status.baselineRequired) {
      throw await baselineRequiredError(chain);
    }
    // Decided to migrate: a SQLite file opened in its own journal mode (it had tables and no
    // history, see openSqliteDialect) is switched to WAL only now, never before a refusal.
    if (chain.dialect.kind === 'sqlite') await sql`pragma journal_mode = WAL`.execute(chain.dialect.db);

    const appliedNow = new Set(status.applied.map((a) => a.version));
    const downSteps = [...chain.migrations].reverse().filter((m) => appliedNow.has(m.version) && m.version > target);
    if (downSteps.length > 0 && !options.force) {
      // Stores of a running release registered the version they need: reverting it would break them.
      const running = await runningReleasesAbove(chain.dialect.db, target, instanceOf(chain.dialect));
      if (running.length > 0) throw new ReleaseStillRunningError(target, running);
    }
    if (downSteps.length > 0 && !options.allowDataLoss) {
      // Count before changing anything, so a refusal changes nothing; each down re-checks under the lock.
      const losses = await droppedRowsOf(chain, downSteps);
      if (losses.length > 0) throw new DataLossError(losses);
    }
    const run: ChainRun = {
      target,
      history: status.applied,
      checksums,
      now: options.now ?? Date.now(),
      emit,
      lock,
      allowDataLoss: options.allowDataLoss === true,
      sizing,
      pauseMs,
      release: this.#release,
    };
    // Concurrent steps and backfills that a crash (or a deploy still running) left unfinished go
    // first, in version order, from where they stopped.
    const unfinished = new Set([...status.steps, ...status.backfills].map((p) => p.version));
    for (const m of chain.migrations) {
      if (unfinished.has(m.version) && m.version <= target) await runDeferred(chain, m, run);
    }
    const { applied, reverted } = await runChain(chain, run);
    return { fromVersion: status.currentVersion, toVersion: (await this.status()).currentVersion, applied, reverted };
  }

  /** What reverting the applied migrations above `to` would drop, with row counts (for `plan`). */
  async dataLoss(to: number): Promise<DataLoss[]> {
    const status = await this.status();
    const applied = new Set(status.applied.map((a) => a.version));
    return droppedRowsOf(
      this.#chain,
      [...this.#chain.migrations].reverse().filter((m) => applied.has(m.version) && m.version > to),
    );
  }
}

/**
 * The backfill batch sizing `options` ask for: a fixed `batchSize` when one is given (and no
 * `batchTimeMs`), else batches sized to take `batchTimeMs` (default 100 ms) with at most
 * `batchSize` (default 5 000) rows. Validated before anything runs.
 */
function batchSizing(options: { readonly batchSize?: number; readonly batchTimeMs?: number }): BatchSizing {
  const batchSize = options.batchSize ?? DEFAULT_BATCH_SIZE;
  if (!Number.isSafeInteger(batchSize) || batchSize < 1)
    throw new InvalidArgumentError('batchSize', `must be a positive integer (got ${String(options.batchSize)})`);
  const batchTimeMs = options.batchTimeMs ?? (options.batchSize === undefined ? DEFAULT_BATCH_TIME_MS : 0);
  if (!Number.isFinite(batchTimeMs) || batchTimeMs < 0)
    throw new InvalidArgumentError(
      'batchTimeMs',
      `must be a number of ms, 0 or more (got ${String(options.batchTimeMs)})`,
    );
  return { batchSize, batchTimeMs };
}
