/**
 * `store.runs` (SPEC §3): one running run per target, adoption, heartbeats and crash recovery.
 * The guarantees are stated on `RunRepository` (types.ts).
 */
import { sql } from 'kysely';
import { InvalidArgumentError, NotFoundError } from '../../errors.js';
import type { CoordinatorRunRow, CoordinatorRunStatus } from '../../schema/database.js';
import type { StoreContext } from '../context.js';
import { keyedCall, keyedWrite, requireSameCreate, type IdempotencyOptions } from '../idempotent.js';
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
} from '../validate.js';
import { runTargetLockKey } from '../../protocol.js';
import { auditLeaseActs, type LeaseActRecord } from '../shared/audit.js';
import { explainAfterRollback } from '../shared/misses.js';
import {
  coordinatorRunLease,
  CoordinatorRunNotRunningError,
  findRunningRun,
  requireRunningRunIn,
  SELECT_RUN,
} from '../shared/running-run.js';
import {
  ADOPT_ALL,
  adoptUnownedTasksIn,
  checkTargetKey,
  INSERT_RUN,
  insertRunAndLock,
  toCoordinatorRun,
} from './statements.js';
import { runBound } from '../../query/prepared.js';

const shapeOf = (targetKey: string | null) => (targetKey === null ? 'null' : 'key');
import {
  CoordinatorHandleTakenError,
  CoordinatorRunConflictError,
  type CoordinatorRun,
  type RunRepository,
  type StartedCoordinatorRun,
  type StoppedRunStatus,
} from './types.js';
import { extend } from '../../objects.js';

const STOPPED_STATUSES: readonly StoppedRunStatus[] = ['completed', 'failed', 'cancelled'];
const RUN_STATUSES: readonly CoordinatorRunStatus[] = ['running', ...STOPPED_STATUSES];

const START_ATTEMPTS = 5;

/** The trail's row of an act on a run's lease (`coordinatorRunLease`: token 1, the run's handle). */
function runAct(act: LeaseActRecord['act'], row: CoordinatorRunRow, detail: Record<string, unknown>): LeaseActRecord {
  return { act, kind: 'coordinator_run', resource: row.id, holder: row.coordinator_handle, token: 1, detail };
}

/** The typed refusals a keyed stop or heartbeat stores. */
const RUN_REFUSALS = [NotFoundError, CoordinatorRunNotRunningError];

/** The run repository on a store context (wired as `store.runs`). */
export function createRunRepository(ctx: StoreContext): RunRepository {
  const { dialect } = ctx;
  const { db } = dialect;

  async function getRun(runId: string): Promise<CoordinatorRun | null> {
    requireId('runId', runId);
    const row = await SELECT_RUN.first(db, { id: runId });
    return row ? toCoordinatorRun(row) : null;
  }

  /**
   * After a conditional UPDATE matched nothing: why, read in its transaction (holding the keys,
   * shared/misses.ts), so a keyed call stores it.
   */
  async function notRunning(trx: Parameters<typeof SELECT_RUN.first>[0], runId: string): Promise<never> {
    const run = await SELECT_RUN.first(trx, { id: runId });
    if (!run) throw new NotFoundError('coordinator run', runId);
    throw new CoordinatorRunNotRunningError(runId, run.status);
  }

  const repo: RunRepository = {
    async tryStartCoordinatorRun(input) {
      try {
        const run = await repo.startCoordinatorRun(input);
        return { status: 'acquired', run, lease: coordinatorRunLease(run) };
      } catch (error) {
        if (!(error instanceof CoordinatorRunConflictError)) throw error;
        return {
          status: 'busy',
          heldBy: {
            holder: error.runningCoordinatorHandle,
            expiresAt: Number.MAX_SAFE_INTEGER,
            runId: error.runningRunId,
            targetKey: error.targetKey,
          },
        };
      }
    },

    async startCoordinatorRun(input) {
      requireInput('input', input);
      checkTargetKey(input.targetKey);
      optionalId('coordinatorHandle', input.coordinatorHandle);
      optionalString('spec', input.spec);
      const targetKey = checkTargetKey(input.targetKey);
      const chosenHandle =
        input.coordinatorHandle === undefined ? null : requireText('coordinatorHandle', input.coordinatorHandle);
      const spec = input.spec ?? null;
      const chosenId = input.id === undefined ? null : requireId('id', input.id);
      /** The caller's own run, when a run with the chosen id exists: the same start → that run; another → AlreadyExistsError. */
      const ownRun = (row: CoordinatorRunRow | undefined): StartedCoordinatorRun | undefined => {
        if (!row) return undefined;
        requireSameCreate('coordinator run', row.id, {
          targetKey: [targetKey, row.target_key],
          spec: [spec, row.spec],
          ...(chosenHandle !== null ? { coordinatorHandle: [chosenHandle, row.coordinator_handle] } : {}),
        });
        return extend(toCoordinatorRun(row), { adoptedTaskCount: 0 });
      };
      for (let attempt = 1; ; attempt++) {
        const id = chosenId ?? ctx.newId();
        const handle = chosenHandle ?? ctx.newHandle('coordinator');
        const now = ctx.clock.now();
        const lock = dialect.writableCtes ? dialect.lockKeyExpression(sql.val(runTargetLockKey(targetKey))) : null;
        const first =
          lock === null || chosenId !== null
            ? undefined
            : insertRunAndLock(db, { id, handle, spec, now, targetKey }, lock);
        const write = () =>
          dialect.writeTransaction(async (trx): Promise<StartedCoordinatorRun> => {
            if (chosenId !== null) {
              const existing = ownRun(await SELECT_RUN.first(trx, { id: chosenId }));
              if (existing) return existing;
            }
            // The insert comes first and alone decides: a second running row for the target
            // violates coordinator_runs_one_running_per_target (PostgreSQL waits for the
            // in-flight winner, then fails; SQLite's writers are already serialized).
            // Task creation takes the same key, so a task created meanwhile is stamped or adopted.
            let adoptedTaskCount: number;
            if (first) {
              // PostgreSQL: the insert takes the key in the same statement, sent with BEGIN; the
              // adoption is one statement, its snapshot taken once the key is held.
              if (!dialect.beginResult(first)) await runBound(trx, first);
              const adopted = await ADOPT_ALL.first(
                trx,
                { runId: id, targetKey: targetKey ?? '', now },
                shapeOf(targetKey),
              );
              adoptedTaskCount = Number(adopted?.adopted ?? 0);
            } else {
              await INSERT_RUN.run(trx, { id, handle, spec, now, targetKey });
              await dialect.lockKey(trx, runTargetLockKey(targetKey));
              adoptedTaskCount = await adoptUnownedTasksIn(trx, id, targetKey, now);
            }
            await auditLeaseActs(ctx, trx, now, [
              {
                act: 'granted',
                kind: 'coordinator_run',
                resource: id,
                holder: handle,
                token: 1,
                detail: { targetKey, adoptedTaskCount },
              },
            ]);
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
          }, first && { first });
        // A unique violation (a running run on the target, or the handle taken) is explained after
        // the rollback, on a fresh read: undefined means nothing explains it, so try again.
        const started = await explainAfterRollback<StartedCoordinatorRun | undefined>(
          dialect,
          'unique_violation',
          write,
          async (fresh, error) => {
            if (chosenId !== null) {
              const existing = ownRun(await SELECT_RUN.first(fresh, { id: chosenId }));
              if (existing) return existing;
            }
            const running = await findRunningRun(fresh, targetKey);
            if (running) throw new CoordinatorRunConflictError(targetKey, running.id, running.coordinator_handle);
            if (chosenHandle !== null) {
              const owner = await fresh
                .selectFrom('coordinator_runs')
                .select('id')
                .where('coordinator_handle', '=', chosenHandle)
                .executeTakeFirst();
              if (owner) throw new CoordinatorHandleTakenError(chosenHandle, owner.id);
            }
            // The winner stopped before we looked (or a random handle collided): try again.
            if (attempt >= START_ATTEMPTS) throw error;
            return undefined;
          },
        );
        if (started) return started;
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

    async stopCoordinatorRun(runId, status, options?: IdempotencyOptions) {
      requireId('runId', runId);
      requireOneOf('status', status, STOPPED_STATUSES);
      const call = keyedCall(
        'runs.stopCoordinatorRun',
        optionalInput('options', options),
        { runId, status },
        RUN_REFUSALS,
      );
      return keyedWrite(ctx, call, async (trx) => {
        const now = ctx.clock.now();
        const row = await trx
          .updateTable('coordinator_runs')
          .set({ status, ended_at: now })
          .where('id', '=', runId)
          .where('status', '=', 'running')
          .returningAll()
          .executeTakeFirst();
        if (row) {
          await auditLeaseActs(ctx, trx, now, [runAct('released', row, { status })]);
          return toCoordinatorRun(row);
        }
        // The lease protocol's release rule: a repeat stop with the status the run already has is a
        // no-op success; a run that ended otherwise throws CoordinatorRunNotRunningError.
        const ended = await SELECT_RUN.first(trx, { id: runId });
        if (ended?.status === status) return toCoordinatorRun(ended);
        return notRunning(trx, runId);
      });
    },

    async heartbeatCoordinatorRun(runId, options?: IdempotencyOptions) {
      requireId('runId', runId);
      const now = ctx.clock.now();
      const call = keyedCall(
        'runs.heartbeatCoordinatorRun',
        optionalInput('options', options),
        { runId },
        RUN_REFUSALS,
      );
      // `status = 'running'` in the WHERE is the fence: PostgreSQL re-checks it on the row
      // version a concurrent reconcile left, so a reconciled run never comes back.
      return keyedWrite(ctx, call, async (trx) => {
        const row = await trx
          .updateTable('coordinator_runs')
          .set({ heartbeat_at: sql<number>`case when heartbeat_at > ${now} then heartbeat_at else ${now} end` })
          .where('id', '=', runId)
          .where('status', '=', 'running')
          .returningAll()
          .executeTakeFirst();
        if (!row) return notRunning(trx, runId);
        await auditLeaseActs(ctx, trx, now, [runAct('renewed', row, { heartbeatAt: Number(row.heartbeat_at) })]);
        return toCoordinatorRun(row);
      });
    },

    async reconcileStaleRuns(options) {
      const staleAfterMs = requirePositiveMs('staleAfterMs', requireInput('options', options).staleAfterMs);
      const now = ctx.clock.now();
      const rows = await dialect.writeTransaction(async (trx) => {
        const failed = await trx
          .updateTable('coordinator_runs')
          .set({ status: 'failed', ended_at: now })
          .where('status', '=', 'running')
          .where(sql<number>`coalesce(heartbeat_at, started_at)`, '<', now - staleAfterMs)
          .returningAll()
          .execute();
        // A stale run's holder lost it: the reconcile is the takeover (no new grant of that run follows).
        const lost = failed.map((row) =>
          runAct('lost', row, {
            reason: 'released',
            heartbeatAt: Number(row.heartbeat_at ?? row.started_at),
            staleAfterMs,
            by: 'runs.reconcileStaleRuns',
          }),
        );
        await auditLeaseActs(ctx, trx, now, lost);
        return failed;
      });
      return rows.map(toCoordinatorRun).sort((a, b) => a.startedAt - b.startedAt || (a.id < b.id ? -1 : 1));
    },
  };
  return repo;
}
