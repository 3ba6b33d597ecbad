/**
 * The statements of `store.runs`: the row mapper, the target-key check and adoption (a run
 * taking its target's unowned tasks, with their dispatches and gates).
 */
import { sql, type Kysely, type Transaction } from 'kysely';
import { tableIn } from '../../query/schema.js';
import { InvalidArgumentError } from '../../errors.js';
import { prepared } from '../../query/prepared.js';
import type { CoordinatorRunRow, Database } from '../../schema/database.js';
import { requireId } from '../validate.js';
import type { CoordinatorRun } from './types.js';

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
 * @internal Adoption, inside the caller's write transaction. Only unfinished tasks (not done, failed or
 * cancelled) are adopted. Unowned = no run, or a run id that is not a
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
    // Only unfinished tasks (issue 22, deliberate): a finished task keeps the run that finished it,
    // so history stays put and run start costs the same however much of it there is. The list is
    // literal, as in tasks_unfinished_target_idx's predicate (0100), so the planner uses that index.
    .where(sql<boolean>`status not in ('done', 'failed', 'cancelled')`)
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

export const INSERT_RUN = prepared(
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
