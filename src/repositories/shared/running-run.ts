/**
 * The running-run guard (SPEC §3): run-scoped writes (dispatches, gates) are fenced on their run
 * still running, and task creation stamps the running run of the task's target.
 */
import { sql, type Transaction } from 'kysely';
import { NotFoundError } from '../../errors.js';
import { LeaseLostError, type Lease, type LeaseLostReason } from './lease.js';
import { readLeaseRowLocked, type LeaseFence } from './fence.js';
import { prepared } from '../../query/prepared.js';
import type { CoordinatorRunRow, CoordinatorRunStatus, Database } from '../../schema/database.js';
import type { StoreContext } from '../context.js';

/**
 * The run is no longer running (stopped, or failed by `reconcileStaleRuns` because its heartbeat
 * went stale): its holder has lost it and must stop acting for it.
 */
export class CoordinatorRunNotRunningError extends LeaseLostError {
  readonly code = 'COORDINATOR_RUN_NOT_RUNNING';
  readonly kind = 'coordinator_run';
  /** `released` for a run that stopped or was reconciled; `never_granted` when no such run exists (`tx.assertLease`). */
  readonly reason: LeaseLostReason;
  constructor(
    readonly runId: string,
    readonly status: CoordinatorRunStatus | null,
  ) {
    super(
      status === null
        ? `Coordinator run ${runId} does not exist: the lease passed to assertLease was never granted here.`
        : `Coordinator run ${runId} is no longer running (status ${status}); it was stopped or reconciled as stale. ` +
            'Its holder has lost the run: stop dispatching for it and start a new run, which adopts its unfinished tasks.',
    );
    this.reason = status === null ? 'never_granted' : 'released';
  }
}

/** A coordinator run as a lease, for `tx.assertLease`. */
export type CoordinatorRunLease = Lease<'coordinator_run'>;

/**
 * A running coordinator run as a lease (`resource` = run id, `holder` = its coordinator handle).
 * A run id is granted once and a run never runs again once stopped, so `token` is always 1 and
 * the run's status is the whole fence; it has no TTL of its own (`expiresAt` is the largest safe
 * integer): `reconcileStaleRuns` ends it when its heartbeat goes stale.
 *
 * @example
 * const run = await store.runs.startCoordinatorRun({ targetKey });
 * await store.transaction(async (tx) => { await tx.assertLease(coordinatorRunLease(run)); … });
 */
export function coordinatorRunLease(run: {
  readonly id: string;
  readonly coordinatorHandle: string;
}): CoordinatorRunLease {
  return Object.freeze({
    kind: 'coordinator_run',
    resource: run.id,
    holder: run.coordinatorHandle,
    token: 1,
    expiresAt: Number.MAX_SAFE_INTEGER,
  });
}

/** `tx.assertLease` for a coordinator run: its row, read `FOR SHARE` on PostgreSQL, must still be running. */
export const fenceCoordinatorRun: LeaseFence = async (ctx, trx, lease) => {
  const row = await readLeaseRowLocked(
    ctx,
    trx.selectFrom('coordinator_runs').select(['status']).where('id', '=', lease.resource),
  );
  if (row?.status === 'running') return;
  throw new CoordinatorRunNotRunningError(lease.resource, row?.status ?? null);
};

/** One `coordinator_runs` row by id. */
export const SELECT_RUN = prepared((db, p: { id: string }) =>
  db.selectFrom('coordinator_runs').selectAll().where('id', '=', p.id),
);

/** The running run of a target (at most one: the unique index), read in `db` (a transaction or the store). */
export async function findRunningRun(
  db: Transaction<Database> | StoreContext['dialect']['db'],
  targetKey: string | null,
) {
  return db
    .selectFrom('coordinator_runs')
    .selectAll()
    .where('status', '=', 'running')
    .where(sql<string>`coalesce(target_key, '')`, '=', targetKey ?? '')
    .executeTakeFirst();
}

/** Reads the run in `trx` and fails unless it is running (the fence for run-scoped writes). */
export async function requireRunningRunIn(trx: Transaction<Database>, runId: string): Promise<CoordinatorRunRow> {
  const row = await SELECT_RUN.first(trx, { id: runId });
  if (!row) throw new NotFoundError('coordinator run', runId);
  if (row.status !== 'running') throw new CoordinatorRunNotRunningError(runId, row.status);
  return row;
}
