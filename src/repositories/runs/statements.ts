/**
 * The statements of `store.runs`: the row mapper, the target-key check and adoption (a run
 * taking its target's unowned tasks, with their dispatches and gates).
 */
import {
  sql,
  type Kysely,
  type QueryCreator,
  type RawBuilder,
  type SelectQueryBuilder,
  type Transaction,
} from 'kysely';
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

/** `db`: the Kysely instance (for the schema of `tableIn`), also when the builder is a WITH clause's. */
const notOwnedByRunningRun = (db: Kysely<Database>, column: RunOwnedColumn) =>
  sql<boolean>`(${sql.ref(column)} is null or not exists (
      select 1 from ${tableIn(db, 'coordinator_runs')} r where r.id = ${sql.ref(column)} and r.status = 'running'))`;

type AdoptParams = { runId: string; targetKey: string; now: number };

/** The target's unfinished tasks not held by a running run, taken by `runId`. */
function adoptTasks(
  db: Kysely<Database>,
  p: AdoptParams,
  target: 'null' | 'key',
  creator: QueryCreator<Database> = db,
) {
  const adopt = creator
    .updateTable('tasks')
    .set({ coordinator_run_id: p.runId, updated_at: p.now })
    // Only unfinished tasks (issue 22, deliberate): a finished task keeps the run that finished it,
    // so history stays put and run start costs the same however much of it there is. The list is
    // literal, as in tasks_unfinished_target_idx's predicate (0100), so the planner uses that index.
    .where(sql<boolean>`status not in ('done', 'failed', 'cancelled')`)
    .where(notOwnedByRunningRun(db, 'tasks.coordinator_run_id'));
  return target === 'null' ? adopt.where('target_key', 'is', null) : adopt.where('target_key', '=', p.targetKey);
}

/** The dispatches or gates of the tasks `taskIds` selects follow them to `runId` (unless a live run holds them). */
function adoptFollowers(
  db: Kysely<Database>,
  table: 'dispatch_contexts' | 'decision_gates',
  runId: string,
  taskIds: SelectQueryBuilder<any, any, { id: string }>,
  creator: QueryCreator<Database> = db,
) {
  return creator
    .updateTable(table)
    .set({ coordinator_run_id: runId })
    .where('task_id', 'in', taskIds)
    .where(sql<boolean>`coalesce(coordinator_run_id, '') <> ${runId}`)
    .where(notOwnedByRunningRun(db, `${table}.coordinator_run_id`));
}

const ADOPT_TASKS = prepared((db, p: AdoptParams, target: 'null' | 'key') => adoptTasks(db, p, target));

const runTasks = (db: Kysely<Database>, runId: string) =>
  db.selectFrom('tasks').select('tasks.id').where('tasks.coordinator_run_id', '=', runId);
const ADOPT_DISPATCHES = prepared((db, p: { runId: string }) =>
  adoptFollowers(db, 'dispatch_contexts', p.runId, runTasks(db, p.runId)),
);
const ADOPT_GATES = prepared((db, p: { runId: string }) =>
  adoptFollowers(db, 'decision_gates', p.runId, runTasks(db, p.runId)),
);

type InsertRunParams = { id: string; handle: string; spec: string | null; now: number; targetKey: string | null };

const insertRun = (db: QueryCreator<Database>, p: InsertRunParams) =>
  db.insertInto('coordinator_runs').values({
    id: p.id,
    coordinator_handle: p.handle,
    status: 'running',
    spec: p.spec,
    started_at: p.now,
    ended_at: null,
    target_key: p.targetKey,
    heartbeat_at: p.now,
  });

export const INSERT_RUN = prepared((db, p: InsertRunParams) => insertRun(db, p));

/**
 * @internal `adoptUnownedTasksIn` in one statement (writable CTEs, PostgreSQL): the tasks, then
 * their dispatches and gates, which follow the tasks `adopted` returns (a run that has just
 * started holds no task before this). One row: the adopted task count. The caller holds the
 * target's key, so the statement's snapshot, taken after the lock, sees every task a creator
 * committed under it.
 */
export const ADOPT_ALL = prepared((db, p: AdoptParams, target: 'null' | 'key') =>
  db
    .with('adopted', (w) => adoptTasks(db, p, target, w).returning('tasks.id'))
    .with('dispatches', (w) =>
      adoptFollowers(db, 'dispatch_contexts', p.runId, w.selectFrom('adopted').select('adopted.id'), base(w)),
    )
    .with('gates', (w) =>
      adoptFollowers(db, 'decision_gates', p.runId, w.selectFrom('adopted').select('adopted.id'), base(w)),
    )
    .selectFrom('adopted')
    .select((eb) => eb.fn.countAll<string>().as('adopted')),
);

/**
 * @internal The start's insert, with the target's key taken by the same statement once the insert
 * passed the one-running-per-target index (the order of `INSERT_RUN` then `lockKey`), for BEGIN
 * to send (`WriteTransactionOptions.first`). `lock`: the dialect's `lockKeyExpression` of the key.
 */
export function insertRunAndLock(db: Kysely<Database>, p: InsertRunParams, lock: RawBuilder<unknown>) {
  return db
    .with('run', (w) => insertRun(w, p).returning('coordinator_runs.id'))
    .selectFrom('run')
    .select(lock.as('locked'))
    .compile();
}

/** A WITH clause's query creator as the base schema's: each CTE before adds its name to the creator's tables, which the builders here read none of. */
const base = (creator: unknown) => creator as QueryCreator<Database>;
