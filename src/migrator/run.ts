import { Umzug } from 'umzug';
import { DataLossError, LockTimeoutError, MigrationFailedError, TaskfenceError } from '../errors.js';
import type { MigrationDefinition } from '../migrations/types.js';
import type { Chain } from './chain.js';
import { droppedRows } from './data-loss.js';
import { HISTORY_TABLE, HistoryStorage, createHistoryTable, migrationName, type UnitOutcome } from './history.js';
import type { LockSettings } from './lock.js';
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
}

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
 * `done` is false when another migrator already did it.
 */
async function applyOne(
  chain: Chain,
  m: MigrationDefinition,
  direction: 'up' | 'down',
  run: ChainRun,
): Promise<UnitOutcome> {
  const { dialect } = chain;
  const { emit, lock } = run;
  let done = false;
  const started = Date.now();
  try {
    await dialect.withMigrationLock(
      async (trx) => {
        done = false;
        await createHistoryTable(trx, dialect.columnTypes);
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
  return { direction, done, durationMs: Date.now() - started };
}
