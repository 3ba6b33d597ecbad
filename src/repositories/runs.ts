import { sql, type Kysely, type Transaction } from 'kysely';
import { InvalidArgumentError, NotFoundError, TaskfenceError } from '../errors.js';
import type { CoordinatorRunRow, CoordinatorRunStatus, Database } from '../schema/database.js';
import type { StoreContext } from './context.js';
import { prepared } from '../query/prepared.js';
import { requireSameCreate } from './idempotent.js';
import {
  optionalId,
  optionalInput,
  optionalKeyFilter,
  optionalStatusFilter,
  optionalString,
  requireId,
  requireInput,
  requireOneOf,
  requirePositiveMs,
  requireText,
} from './validate.js';
import { tableIn } from '../dialects/schema.js';
import { runTargetLockKey } from './shared/lock-keys.js';
import {
  CoordinatorRunNotRunningError,
  findRunningRun,
  requireRunningRunIn,
  SELECT_RUN,
} from './shared/running-run.js';

export interface CoordinatorRun {
  readonly id: string;
  /** Unique per run (`coordinator-<hex>` unless the caller chose one): the run's message inbox. */
  readonly coordinatorHandle: string;
  readonly status: CoordinatorRunStatus;
  /** The orchestration target (`worktree:<id>`); null runs share one slot. */
  readonly targetKey: string | null;
  readonly spec: string | null;
  readonly startedAt: number;
  readonly endedAt: number | null;
  readonly heartbeatAt: number | null;
}

export interface StartCoordinatorRunInput {
  /**
   * Default: a fresh id. Name the run yourself to make the start retryable: a start with the id of
   * an existing run with the same target, spec and handle returns that run (with
   * `adoptedTaskCount: 0`) instead of a conflict, so a retry after `COMMIT_OUTCOME_UNKNOWN` converges.
   */
  readonly id?: string;
  /** From `resolveOrchestrationTargetKey`; `null` is the shared null target. Required: the caller decides. */
  readonly targetKey: string | null;
  readonly spec?: string | null;
  /** Default: a fresh `coordinator-<hex>`. Must be unique across all runs. */
  readonly coordinatorHandle?: string;
}

export interface StartedCoordinatorRun extends CoordinatorRun {
  /** How many unowned tasks of the target the run adopted in its start transaction. */
  readonly adoptedTaskCount: number;
}

export type StoppedRunStatus = Exclude<CoordinatorRunStatus, 'running'>;
const STOPPED_STATUSES: readonly StoppedRunStatus[] = ['completed', 'failed', 'cancelled'];
const RUN_STATUSES: readonly CoordinatorRunStatus[] = ['running', ...STOPPED_STATUSES];

export interface ListCoordinatorRunsFilter {
  readonly status?: CoordinatorRunStatus | readonly CoordinatorRunStatus[];
  /** `null` selects null-target runs. */
  readonly targetKey?: string | null;
}

/** Another run is already running on the target; the database refused a second one. */
export class CoordinatorRunConflictError extends TaskfenceError {
  readonly code = 'COORDINATOR_RUN_CONFLICT';
  constructor(
    readonly targetKey: string | null,
    readonly runningRunId: string,
    readonly runningCoordinatorHandle: string,
  ) {
    super(
      `A coordinator run is already running on ${targetKey === null ? 'the null target' : `target ${JSON.stringify(targetKey)}`} ` +
        `(run ${runningRunId}, handle ${runningCoordinatorHandle}). Nothing was started. Stop that run by id, ` +
        'or, if its process died, let reconcileStaleRuns fail it once its heartbeat is stale; or pass a different --worktree.',
    );
  }
}

/** An explicitly chosen coordinator handle is already used by another run. */
export class CoordinatorHandleTakenError extends TaskfenceError {
  readonly code = 'COORDINATOR_HANDLE_TAKEN';
  constructor(
    readonly coordinatorHandle: string,
    readonly existingRunId: string,
  ) {
    super(
      `The coordinator handle ${JSON.stringify(coordinatorHandle)} already belongs to run ${existingRunId}. ` +
        'Handles are inboxes and must be unique per run: omit coordinatorHandle to get a fresh coordinator-<hex> one.',
    );
  }
}

/** Coordinator runs (SPEC §3): one running run per target, adoption, heartbeats and crash recovery. */
export interface RunRepository {
  /**
   * Starts a run on `targetKey` and, in the same transaction, adopts the target's unowned tasks.
   * The partial unique index on running runs decides: across processes and connections at most
   * one run is running per target (null targets share one slot); every loser gets
   * `CoordinatorRunConflictError` naming the running run, with its transaction rolled back.
   *
   * @example
   * const run = await store.runs.startCoordinatorRun({ targetKey: 'worktree:7f3a' });
   */
  startCoordinatorRun(input: StartCoordinatorRunInput): Promise<StartedCoordinatorRun>;
  /**
   * Gives the running run `runId` the target's unowned tasks (no run, or a run that is not
   * running) and re-points their dispatches and gates, atomically; never a live run's tasks or
   * another target's. Returns how many tasks it adopted.
   */
  adoptUnownedTasks(runId: string, targetKey: string | null): Promise<number>;
  /** The running run of a target (null targets share one), or null. */
  getActiveCoordinatorRunForTarget(targetKey: string | null): Promise<CoordinatorRun | null>;
  /** The run with this id in whatever status it is, or null; a plain read. */
  getCoordinatorRun(runId: string): Promise<CoordinatorRun | null>;
  /** Runs matching the filter, oldest first (by start time, then id). */
  listCoordinatorRuns(filter?: ListCoordinatorRunsFilter): Promise<CoordinatorRun[]>;
  /**
   * Stops the run with this id (never "the latest run") if it is still running; a run that
   * already stopped or was reconciled gets `CoordinatorRunNotRunningError`.
   */
  stopCoordinatorRun(runId: string, status: StoppedRunStatus): Promise<CoordinatorRun>;
  /**
   * Records that the run's holder is alive. Only a running run can heartbeat: once reconciled
   * or stopped, the call fails with `CoordinatorRunNotRunningError` and the run stays dead.
   */
  heartbeatCoordinatorRun(runId: string): Promise<CoordinatorRun>;
  /**
   * Fails, in one statement, every running run whose last heartbeat is older than
   * `staleAfterMs`, freeing its target; a heartbeat that commits first keeps its run alive.
   * Returns the runs it failed.
   */
  reconcileStaleRuns(options: { staleAfterMs: number }): Promise<CoordinatorRun[]>;
}

/** Maps a `coordinator_runs` row to the public shape. */
export function toCoordinatorRun(row: CoordinatorRunRow): CoordinatorRun {
  return {
    id: row.id,
    coordinatorHandle: row.coordinator_handle,
    status: row.status,
    targetKey: row.target_key,
    spec: row.spec,
    startedAt: row.started_at,
    endedAt: row.ended_at,
    heartbeatAt: row.heartbeat_at,
  };
}

/** @internal `null` or a non-empty key: '' would silently share the null slot of the unique index. */
export function checkTargetKey(targetKey: unknown): string | null {
  if (targetKey === null) return null;
  if (typeof targetKey !== 'string' || targetKey.trim() === '') {
    throw new InvalidArgumentError(
      'targetKey',
      'must be null (the shared null target) or a non-empty key such as worktree:<id>',
    );
  }
  return requireId('targetKey', targetKey);
}

/**
 * @internal Adoption, inside the caller's write transaction. Unowned = no run, or a run id that is not a
 * running run. Each UPDATE is one statement, so under READ COMMITTED it sees every run that
 * committed before it; a run that is running can only lose tasks after it stops.
 */
export async function adoptUnownedTasksIn(
  trx: Transaction<Database>,
  runId: string,
  targetKey: string | null,
  now: number,
): Promise<number> {
  const adopted = await ADOPT_TASKS.run(
    trx,
    { runId, targetKey: targetKey ?? '', now },
    targetKey === null ? 'null' : 'key',
  );
  // The run's tasks' dispatches and gates follow them (unless a live run holds them).
  await ADOPT_DISPATCHES.run(trx, { runId });
  await ADOPT_GATES.run(trx, { runId });
  return Number(adopted.numAffectedRows ?? 0n);
}

type RunOwnedColumn =
  | 'tasks.coordinator_run_id'
  | 'dispatch_contexts.coordinator_run_id'
  | 'decision_gates.coordinator_run_id';

const notOwnedByRunningRun = (db: Kysely<Database>, column: RunOwnedColumn) =>
  sql<boolean>`(${sql.ref(column)} is null or not exists (
      select 1 from ${tableIn(db, 'coordinator_runs')} r where r.id = ${sql.ref(column)} and r.status = 'running'))`;

const ADOPT_TASKS = prepared((db, p: { runId: string; targetKey: string; now: number }, target: 'null' | 'key') => {
  const adopt = db
    .updateTable('tasks')
    .set({ coordinator_run_id: p.runId, updated_at: p.now })
    .where(notOwnedByRunningRun(db, 'tasks.coordinator_run_id'));
  return target === 'null' ? adopt.where('target_key', 'is', null) : adopt.where('target_key', '=', p.targetKey);
});

const adoptFollowers = (table: 'dispatch_contexts' | 'decision_gates') =>
  prepared((db, p: { runId: string }) =>
    db
      .updateTable(table)
      .set({ coordinator_run_id: p.runId })
      .where('task_id', 'in', db.selectFrom('tasks').select('tasks.id').where('tasks.coordinator_run_id', '=', p.runId))
      .where(sql<boolean>`coalesce(coordinator_run_id, '') <> ${p.runId}`)
      .where(notOwnedByRunningRun(db, `${table}.coordinator_run_id`)),
  );
const ADOPT_DISPATCHES = adoptFollowers('dispatch_contexts');
const ADOPT_GATES = adoptFollowers('decision_gates');

const INSERT_RUN = prepared(
  (db, p: { id: string; handle: string; spec: string | null; now: number; targetKey: string | null }) =>
    db.insertInto('coordinator_runs').values({
      id: p.id,
      coordinator_handle: p.handle,
      status: 'running',
      spec: p.spec,
      started_at: p.now,
      ended_at: null,
      target_key: p.targetKey,
      heartbeat_at: p.now,
    }),
);

const START_ATTEMPTS = 5;

/** The run repository on a store context (wired as `store.runs`). */
export function createRunRepository(ctx: StoreContext): RunRepository {
  const { dialect } = ctx;
  const { db } = dialect;

  async function getRun(runId: string): Promise<CoordinatorRun | null> {
    requireId('runId', runId);
    const row = await SELECT_RUN.first(db, { id: runId });
    return row ? toCoordinatorRun(row) : null;
  }

  /** After a conditional UPDATE matched nothing: why. */
  async function notRunning(runId: string): Promise<never> {
    const run = await getRun(runId);
    if (!run) throw new NotFoundError('coordinator run', runId);
    throw new CoordinatorRunNotRunningError(runId, run.status);
  }

  const repo: RunRepository = {
    async startCoordinatorRun(input) {
      requireInput('input', input);
      checkTargetKey(input.targetKey);
      optionalId('coordinatorHandle', input.coordinatorHandle);
      optionalString('spec', input.spec);
      const targetKey = checkTargetKey(input.targetKey);
      const chosenHandle =
        input.coordinatorHandle === undefined ? null : requireText('coordinatorHandle', input.coordinatorHandle);
      const spec = input.spec ?? null;
      const chosenId = input.id === undefined ? null : requireText('id', input.id);
      /** The caller's own run, when a run with the chosen id exists: the same start → that run; another → AlreadyExistsError. */
      const ownRun = (row: CoordinatorRunRow | undefined): StartedCoordinatorRun | undefined => {
        if (!row) return undefined;
        requireSameCreate('coordinator run', row.id, {
          targetKey: [targetKey, row.target_key],
          spec: [spec, row.spec],
          ...(chosenHandle !== null ? { coordinatorHandle: [chosenHandle, row.coordinator_handle] } : {}),
        });
        return { ...toCoordinatorRun(row), adoptedTaskCount: 0 };
      };
      for (let attempt = 1; ; attempt++) {
        const id = chosenId ?? ctx.newId();
        const handle = chosenHandle ?? ctx.newHandle('coordinator');
        const now = ctx.clock.now();
        try {
          return await dialect.writeTransaction(async (trx): Promise<StartedCoordinatorRun> => {
            if (chosenId !== null) {
              const existing = ownRun(await SELECT_RUN.first(trx, { id: chosenId }));
              if (existing) return existing;
            }
            // The insert comes first and alone decides: a second running row for the target
            // violates coordinator_runs_one_running_per_target (PostgreSQL waits for the
            // in-flight winner, then fails; SQLite's writers are already serialized).
            await INSERT_RUN.run(trx, { id, handle, spec, now, targetKey });
            // Task creation takes the same key, so a task created meanwhile is stamped or adopted.
            await dialect.lockKey(trx, runTargetLockKey(targetKey));
            const adoptedTaskCount = await adoptUnownedTasksIn(trx, id, targetKey, now);
            // What the transaction wrote, not a read after it: a connection lost after COMMIT must not report a started run as failed.
            return {
              id,
              coordinatorHandle: handle,
              status: 'running',
              targetKey,
              spec,
              startedAt: now,
              endedAt: null,
              heartbeatAt: now,
              adoptedTaskCount,
            };
          });
        } catch (error) {
          if (dialect.classifyError(error) !== 'unique_violation') throw error;
          // The transaction is over (rolled back): read what won, outside it.
          if (chosenId !== null) {
            const existing = ownRun(await SELECT_RUN.first(db, { id: chosenId }));
            if (existing) return existing;
          }
          const running = await findRunningRun(db, targetKey);
          if (running) throw new CoordinatorRunConflictError(targetKey, running.id, running.coordinator_handle);
          if (chosenHandle !== null) {
            const owner = await db
              .selectFrom('coordinator_runs')
              .select('id')
              .where('coordinator_handle', '=', chosenHandle)
              .executeTakeFirst();
            if (owner) throw new CoordinatorHandleTakenError(chosenHandle, owner.id);
          }
          // The winner stopped before we looked (or a random handle collided): try again.
          if (attempt >= START_ATTEMPTS) throw error;
        }
      }
    },

    async adoptUnownedTasks(runId, targetKey) {
      requireId('runId', runId);
      const target = checkTargetKey(targetKey);
      return dialect.writeTransaction(async (trx) => {
        await dialect.lockKey(trx, runTargetLockKey(target));
        const run = await requireRunningRunIn(trx, runId);
        if ((run.target_key ?? null) !== target) {
          throw new InvalidArgumentError(
            'targetKey',
            `run ${runId} runs on ${JSON.stringify(run.target_key)}, not ${JSON.stringify(target)}; a run adopts only its own target's tasks`,
          );
        }
        return adoptUnownedTasksIn(trx, runId, target, ctx.clock.now());
      });
    },

    async getActiveCoordinatorRunForTarget(targetKey) {
      const row = await findRunningRun(db, checkTargetKey(targetKey));
      return row ? toCoordinatorRun(row) : null;
    },

    getCoordinatorRun: getRun,

    async listCoordinatorRuns(options) {
      const filter = optionalInput('filter', options);
      const statuses = optionalStatusFilter('status', filter.status, RUN_STATUSES);
      const targetKey = optionalKeyFilter('targetKey', filter.targetKey);
      if (statuses !== null && statuses.length === 0) return [];
      let query = db.selectFrom('coordinator_runs').selectAll();
      if (statuses !== null) query = query.where('status', 'in', statuses);
      if (targetKey !== undefined) {
        query = targetKey === null ? query.where('target_key', 'is', null) : query.where('target_key', '=', targetKey);
      }
      const rows = await query.orderBy('started_at').orderBy('id').execute();
      return rows.map(toCoordinatorRun);
    },

    async stopCoordinatorRun(runId, status) {
      requireId('runId', runId);
      requireOneOf('status', status, STOPPED_STATUSES);
      const row = await dialect.writeTransaction((trx) =>
        trx
          .updateTable('coordinator_runs')
          .set({ status, ended_at: ctx.clock.now() })
          .where('id', '=', runId)
          .where('status', '=', 'running')
          .returningAll()
          .executeTakeFirst(),
      );
      return row ? toCoordinatorRun(row) : notRunning(runId);
    },

    async heartbeatCoordinatorRun(runId) {
      requireId('runId', runId);
      const now = ctx.clock.now();
      // `status = 'running'` in the WHERE is the fence: PostgreSQL re-checks it on the row
      // version a concurrent reconcile left, so a reconciled run never comes back.
      const row = await dialect.writeTransaction((trx) =>
        trx
          .updateTable('coordinator_runs')
          .set({ heartbeat_at: sql<number>`case when heartbeat_at > ${now} then heartbeat_at else ${now} end` })
          .where('id', '=', runId)
          .where('status', '=', 'running')
          .returningAll()
          .executeTakeFirst(),
      );
      return row ? toCoordinatorRun(row) : notRunning(runId);
    },

    async reconcileStaleRuns(options) {
      const staleAfterMs = requirePositiveMs('staleAfterMs', requireInput('options', options).staleAfterMs);
      const now = ctx.clock.now();
      const rows = await dialect.writeTransaction((trx) =>
        trx
          .updateTable('coordinator_runs')
          .set({ status: 'failed', ended_at: now })
          .where('status', '=', 'running')
          .where(sql<number>`coalesce(heartbeat_at, started_at)`, '<', now - staleAfterMs)
          .returningAll()
          .execute(),
      );
      return rows.map(toCoordinatorRun).sort((a, b) => a.startedAt - b.startedAt || (a.id < b.id ? -1 : 1));
    },
  };
  return repo;
}
