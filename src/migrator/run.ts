import type { Transaction } from 'kysely';
import { firstBatchSize, nextBatchSize, type BatchSizing } from './batching.js';
import { Backoff } from '../dialects/backoff.js';
import { DataLossError, LockTimeoutError, MigrationFailedError, TaskfenceError, formatVersion } from '../errors.js';
import type { Database } from '../schema/database.js';
import type { MigrationDefinition } from '../migrations/types.js';
import type { Chain } from './chain.js';
import { droppedRows } from './data-loss.js';
import { HISTORY_TABLE, HistoryStorage, createHistoryTable, migrationName, type UnitOutcome } from './history.js';
import type { LockSettings } from './lock.js';
import { createReleasesTable } from './releases.js';
import { createStateTable, deleteState, insertState, readState, recordBatch } from './state.js';
import { createStepsTable, deleteSteps, runConcurrentSteps } from './steps.js';
import type { AppliedMigration, MigrationEvent } from './types.js';

/** What `runChain` needs besides the chain: the target, and how this `migrate` call runs. */
export interface ChainRun {
  readonly target: number;
  /** The history as read under the migration lock at the start of this run. */
  readonly history: readonly AppliedMigration[];
  readonly checksums: ReadonlyMap<number, string>;
  readonly now: number;
  readonly emit: (event: MigrationEvent) => void;
  readonly lock: LockSettings;
  readonly allowDataLoss: boolean;
  /** How big each backfill batch is (fixed, or sized by the time the last one took). */
  readonly sizing: BatchSizing;
  /**
   * Pause between backfill batches, in ms; null: none on PostgreSQL (a batch locks only its own
   * rows), as long as the batch took on SQLite (a batch holds the one write lock, and a writer
   * waiting in its busy handler only gets it if the lock stays free for a moment).
   */
  readonly pauseMs: number | null;
  /** The taskfence release running this migrate (recorded beside each version it applies). */
  readonly release: string;
}

/** The first pause before a DDL retry, and the longest, in ms (jittered, doubling). */
const RETRY_PAUSE_MS = 50;
const RETRY_PAUSE_MAX_MS = 1_000;

/**
 * Runs the chain up or down to `run.target` with umzug: umzug reads the applied set from the
 * history (`HistoryStorage.executed`, as read under the migration lock), decides what is pending and in which order, slices
 * it at the target, and calls each migration's `up`/`down`, which is one `applyOne` transaction
 * (the migration and its history row together, under the migration lock, re-checked there).
 * umzug's `migrated` / `reverted` events become taskfence's `applied` / `reverted` (or `skipped`
 * when another migrator had done it) events. Returns the versions this call applied and reverted.
 */
export async function runChain(chain: Chain, run: ChainRun): Promise<{ applied: number[]; reverted: number[] }> {
  const byName = new Map(chain.migrations.map((m) => [migrationName(m), m]));
  const outcomes = new Map<string, UnitOutcome>();
  const unit = (m: MigrationDefinition, direction: 'up' | 'down') => async () => {
    outcomes.set(migrationName(m), await applyOne(chain, m, direction, run));
  };
  // Loaded here, not at the module's top: umzug brings its own CLI's dependencies (about 0.3 s of
  // CPU per process start), which a process that never migrates (a worker, a race test's child)
  // should not pay.
  const { Umzug } = await import('umzug');
  const umzug = new Umzug<object>({
    migrations: chain.migrations.map((m) => ({ name: migrationName(m), up: unit(m, 'up'), down: unit(m, 'down') })),
    context: {},
    storage: new HistoryStorage(run.history, outcomes),
    logger: undefined,
  });
  const applied: number[] = [];
  const reverted: number[] = [];
  const settled =
    (direction: 'up' | 'down') =>
    async ({ name }: { name: string }) => {
      const m = byName.get(name)!;
      const outcome = outcomes.get(name)!;
      if (outcome.done) {
        (direction === 'up' ? applied : reverted).push(m.version);
        run.emit({
          type: direction === 'up' ? 'applied' : 'reverted',
          version: m.version,
          name: m.name,
          durationMs: outcome.durationMs,
        });
      } else {
        run.emit({
          type: 'skipped',
          version: m.version,
          name: m.name,
          reason: `another migrator already ${direction === 'up' ? 'applied' : 'reverted'} it`,
        });
      }
    };
  umzug.on('migrated', settled('up'));
  umzug.on('reverted', settled('down'));

  const versionOf = (name: string) => byName.get(name)!.version;
  try {
    // Up: every pending migration at or below the target, in chain order.
    const upTo = (await umzug.pending()).filter((p) => versionOf(p.name) <= run.target).at(-1);
    if (upTo) await umzug.up({ to: upTo.name });
    // Down: every applied migration above the target, newest first (down to and including the lowest).
    const above = (await umzug.executed()).filter((e) => versionOf(e.name) > run.target);
    if (above.length > 0) await umzug.down(run.target === 0 ? { to: 0 } : { to: above[0]!.name });
  } catch (error) {
    // umzug wraps what the migration threw; surface our own error.
    const cause = (error as { cause?: unknown }).cause;
    if (cause instanceof TaskfenceError) throw cause;
    throw error;
  }
  return { applied, reverted };
}

/**
 * Applies or reverts one migration together with its history row, in one transaction holding the
 * migration lock, after re-reading the history inside it: whoever held the lock before committed
 * (or rolled back) everything, so each migration runs exactly once however many deploys race.
 * `done` is false when another migrator already did it. Then, after that transaction committed,
 * its concurrent steps and its backfill run (`runDeferred`).
 */
async function applyOne(
  chain: Chain,
  m: MigrationDefinition,
  direction: 'up' | 'down',
  run: ChainRun,
): Promise<UnitOutcome> {
  const { dialect } = chain;
  const { emit } = run;
  let done = false;
  const started = Date.now();
  await underMigrationLock(chain, m, direction, run, async (trx) => {
    done = false;
    await createHistoryTable(trx, dialect.columnTypes);
    await createStateTable(trx, dialect.columnTypes);
    await createReleasesTable(trx, dialect.columnTypes);
    await createStepsTable(trx, dialect.columnTypes);
    const recorded = await trx
      .selectFrom(HISTORY_TABLE)
      .select('version')
      .where('version', '=', m.version)
      .executeTakeFirst();
    if (direction === 'up' ? recorded !== undefined : recorded === undefined) return;
    if (direction === 'down' && !run.allowDataLoss) {
      const losses = await droppedRows(chain, trx, m);
      if (losses.length > 0) throw new DataLossError(losses);
    }
    emit({ type: direction === 'up' ? 'applying' : 'reverting', version: m.version, name: m.name });
    const total = direction === 'up' && m.workRows ? await m.workRows(trx) : undefined;
    await m[direction]({
      db: trx,
      types: dialect.columnTypes,
      now: run.now,
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
          checksum: run.checksums.get(m.version)!,
          applied_at: Date.now(),
          duration_ms: Date.now() - started,
        })
        .execute();
      await insertState(trx, {
        version: m.version,
        minWriterRelease: m.minWriterRelease ?? null,
        appliedByRelease: run.release,
        backfillNow: m.backfill ? run.now : null,
        at: Date.now(),
      });
    } else {
      await trx.deleteFrom(HISTORY_TABLE).where('version', '=', m.version).execute();
      await deleteState(trx, m.version);
      await deleteSteps(trx, m.version);
    }
    done = true;
  });
  // Another migrator may have committed the DDL and still be running its steps or backfilling (or
  // have crashed): join in.
  if (direction === 'up') await runDeferred(chain, m, run);
  return { direction, done, durationMs: Date.now() - started };
}

/**
 * What `m` does after its DDL committed, each part resumable: its concurrent steps not yet
 * recorded (`runConcurrentSteps`: indexes built and constraints validated without blocking
 * writes), then its backfill from the recorded cursor (`runBackfill`).
 */
export async function runDeferred(chain: Chain, m: MigrationDefinition, run: ChainRun): Promise<void> {
  await runConcurrentSteps(chain, m, run);
  await runBackfill(chain, m, run);
}

/**
 * Runs (or resumes) `m`'s backfill to the end: one batch per transaction under the migration
 * lock, which reads the recorded cursor, runs the batch after it and records the next cursor and
 * the counts in the same transaction. A crash loses at most the batch in flight (rolled back);
 * the next `migrate` resumes after the last committed one, with the `now` recorded at the start.
 * Two deploys backfilling at once take turns batch by batch. Pauses between batches (see
 * `ChainRun.pauseMs`). Nothing to do when the version's backfill is complete (or it is not applied).
 */
export async function runBackfill(chain: Chain, m: MigrationDefinition, run: ChainRun): Promise<void> {
  const backfill = m.backfill;
  if (!backfill) return;
  const { dialect } = chain;
  let total: number | undefined;
  let first = true;
  let size = firstBatchSize(run.sizing);
  for (;;) {
    const batchStarted = Date.now();
    let tookMs = 0;
    const step = await underMigrationLock(chain, m, 'up', run, async (trx) => {
      const state = await readState(trx, m.version);
      if (!state || state.backfill !== 'running') return null;
      if (first && backfill.workRows) total = await backfill.workRows(trx);
      const batchAt = performance.now();
      const batch = await backfill.batch(
        { db: trx, types: dialect.columnTypes, now: state.backfillNow ?? run.now, batchSize: size },
        state.cursor,
      );
      tookMs = performance.now() - batchAt;
      const counts = { done: state.done + batch.visited, changed: state.changed + batch.changed };
      await recordBatch(trx, m.version, { cursor: batch.cursor, ...counts, at: Date.now() });
      return { resumedAfter: first ? state.done : 0, last: batch.cursor === null, ...counts };
    });
    if (!step) return;
    size = nextBatchSize(run.sizing, size, tookMs);
    if (first && step.resumedAfter > 0) {
      run.emit({
        type: 'progress',
        version: m.version,
        message: `${formatVersion(m.version)}: resuming the backfill after ${step.resumedAfter} rows`,
      });
    }
    first = false;
    if (step.last) {
      run.emit({
        type: 'progress',
        version: m.version,
        message:
          backfill.summary?.(step.changed) ??
          `${formatVersion(m.version)}: backfill complete, ${step.changed} rows changed`,
      });
      return;
    }
    const done = total === undefined ? step.done : Math.min(step.done, total);
    run.emit({
      type: 'progress',
      version: m.version,
      message: `${formatVersion(m.version)}: backfilled ${done} rows (${step.changed} changed)`,
      done,
      ...(total !== undefined ? { total } : {}),
    });
    const pauseMs = run.pauseMs ?? (dialect.kind === 'sqlite' ? Date.now() - batchStarted : 0);
    if (pauseMs > 0) await new Promise((resolve) => setTimeout(resolve, pauseMs));
  }
}

/**
 * Runs `fn` in a transaction holding the migration lock. On PostgreSQL each attempt's DDL waits
 * at most `ddlLockAttemptMs` (`lock_timeout`) for a table lock: waiting in a table's lock queue
 * would make every application query on that table wait behind it. When it gives up the
 * transaction rolls back (nothing done) and, after a jittered pause that lets the queue drain,
 * tries again, until `ddlLockTimeoutMs` has passed; then `MigrationFailedError` says so. Each
 * retry is a `lock-retry` event.
 */
async function underMigrationLock<T>(
  chain: Chain,
  m: MigrationDefinition,
  direction: 'up' | 'down',
  run: ChainRun,
  fn: (trx: Transaction<Database>) => Promise<T>,
): Promise<T> {
  const { lock } = run;
  const started = Date.now();
  const backoff = new Backoff(RETRY_PAUSE_MS, RETRY_PAUSE_MAX_MS);
  for (let attempt = 1; ; attempt++) {
    try {
      return await chain.dialect.withMigrationLock(fn, {
        waitMs: lock.waitMs,
        ddlLockTimeoutMs: lock.ddlLockAttemptMs,
        onWaiting: lock.onWaiting,
        bulk: true,
      });
    } catch (error) {
      const waitedMs = Date.now() - started;
      if (error instanceof LockTimeoutError) {
        if (lock.ddlLockTimeoutMs > 0 && waitedMs < lock.ddlLockTimeoutMs) {
          const delayMs = Math.round(backoff.next(lock.ddlLockTimeoutMs - waitedMs));
          run.emit({ type: 'lock-retry', version: m.version, name: m.name, attempt, waitedMs, delayMs });
          await new Promise((resolve) => setTimeout(resolve, delayMs));
          continue;
        }
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
  }
}
