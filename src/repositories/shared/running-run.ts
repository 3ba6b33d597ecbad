/**
 * The running-run guard (SPEC §3): run-scoped writes (dispatches, gates) are fenced on their run
 * still running, and task creation stamps the running run of the task's target.
 */
import { sql, type Transaction } from 'kysely';
import { NotFoundError, TaskfenceError } from '../../errors.js';
import { prepared } from '../../query/prepared.js';
import type { CoordinatorRunRow, CoordinatorRunStatus, Database } from '../../schema/database.js';
import type { StoreContext } from '../context.js';

/**
 * The run is no longer running (stopped, or failed by `reconcileStaleRuns` because its heartbeat
 * went stale): its holder has lost it and must stop acting for it.
 */
export class CoordinatorRunNotRunningError extends TaskfenceError {
  readonly code = 'COORDINATOR_RUN_NOT_RUNNING';
  constructor(
    readonly runId: string,
    readonly status: CoordinatorRunStatus,
  ) {
    super(
      `Coordinator run ${runId} is no longer running (status ${status}); it was stopped or reconciled as stale. ` +
        'Its holder has lost the run: stop dispatching for it and start a new run, which adopts its unfinished tasks.',
    );
  }
}

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
