/**
 * `taskfence inspect` as a library: who holds what, read in one read transaction of the store's
 * own dialect (SQLite: a deferred `BEGIN` on a WAL snapshot; PostgreSQL: REPEATABLE READ, READ
 * ONLY), so the sections agree with each other and nothing is written or locked.
 */
import type { StoreDialect } from '../dialects/types.js';
import { InvalidArgumentError, NotFoundError, SchemaOutOfDateError } from '../errors.js';
import { LATEST_VERSION } from '../migrations/index.js';
import { DISPATCH_FAILURE_LIMIT } from '../repositories/dispatches/types.js';
import { requireId } from '../repositories/validate.js';
import { decodePathLeaseKey } from '../domain/write-paths.js';
import { describeDuration } from './format.js';
import {
  dependenciesTracked,
  readDependenciesOf,
  readDispatches,
  readInbox,
  readReadyQueue,
  readSemaphores,
  readLocks,
  readOwnedResources,
  readOwnership,
  readPaths,
  readRuns,
  readTaskLease,
  runView,
  taskCountsByRun,
  readWorkspaceLocksOf,
  type SectionScope,
} from './sections.js';
import type { InspectOptions, InspectSnapshot, RunTimeline, TaskExplanation } from './types.js';

export type * from './types.js';
export { buildPathTree } from './tree.js';

/** What `inspect` reads through: a store (or anything with its dialect). */
export interface InspectSource {
  readonly dialect: StoreDialect;
}

/** Default `staleAfterMs` of `inspect`: a run silent for a minute is flagged. */
export const DEFAULT_STALE_AFTER_MS = 60_000;
/** Default row cap per list. */
export const DEFAULT_INSPECT_LIMIT = 200;

function scopeOf(source: InspectSource, options: InspectOptions = {}): SectionScope {
  const staleAfterMs = options.staleAfterMs ?? DEFAULT_STALE_AFTER_MS;
  if (!Number.isSafeInteger(staleAfterMs) || staleAfterMs <= 0)
    throw new InvalidArgumentError('staleAfterMs', 'must be a positive whole number of milliseconds');
  const limit = options.limit ?? DEFAULT_INSPECT_LIMIT;
  if (!Number.isSafeInteger(limit) || limit <= 0 || limit > 10_000)
    throw new InvalidArgumentError('limit', 'must be a whole number from 1 to 10000');
  return { now: source.dialect.clock.now(), staleAfterMs, limit };
}

async function requireLatestSchema(source: InspectSource): Promise<void> {
  const version = await source.dialect.readSchemaVersion();
  if (version < LATEST_VERSION) throw new SchemaOutOfDateError(version, LATEST_VERSION);
}

/**
 * One consistent picture of the store: runs (heartbeat age, stale flag), active dispatches per
 * terminal, workspace locks and task leases (holder, token, time left), path leases per
 * workspace as a tree, semaphores (live slots, time left), inboxes (depth, oldest, redelivered,
 * dead), ownership resources (generation, cleanup state) and the ready queue (ready, blocked by
 * a dependency, blocked by a gate).
 * Read-only: one read transaction, no locks taken, nothing written. Throws
 * `SchemaOutOfDateError` on a database behind this code.
 *
 * @example
 * const snapshot = await inspectStore(store, { staleAfterMs: 30_000 });
 * for (const run of snapshot.runs.running.items) if (run.stale) console.log('stale run', run.id);
 */
export async function inspectStore(source: InspectSource, options?: InspectOptions): Promise<InspectSnapshot> {
  const scope = scopeOf(source, options);
  await requireLatestSchema(source);
  return source.dialect.readTransaction(async (trx) => ({
    runs: await readRuns(trx, scope),
    dispatches: await readDispatches(trx, scope),
    locks: await readLocks(trx, scope),
    paths: await readPaths(trx, scope),
    semaphores: await readSemaphores(trx, scope),
    inbox: await readInbox(trx, scope),
    ownership: await readOwnership(trx, scope),
    readyQueue: await readReadyQueue(trx, scope, await dependenciesTracked(trx, source.dialect, source.dialect.kind)),
  }));
}

/**
 * Why task `taskId` is where it is: its run, gates, dispatch history, the leases on it and its
 * workspace, its owned resources, and `reasons`, sentences most decisive first. Read-only, one
 * read transaction. Throws `NotFoundError` for an unknown task.
 *
 * @example
 * const { reasons } = await explainTask(store, 'task-42');
 * console.log(reasons.join('\n'));
 */
export async function explainTask(
  source: InspectSource,
  taskId: string,
  options?: InspectOptions,
): Promise<TaskExplanation> {
  requireId('taskId', taskId);
  const scope = scopeOf(source, options);
  await requireLatestSchema(source);
  const { now } = scope;
  return source.dialect.readTransaction(async (trx) => {
    const task = await trx.selectFrom('tasks').selectAll().where('id', '=', taskId).executeTakeFirst();
    if (!task) throw new NotFoundError('task', taskId);
    const runRow =
      task.coordinator_run_id === null
        ? undefined
        : await trx
            .selectFrom('coordinator_runs')
            .select(['id', 'status', 'heartbeat_at', 'started_at'])
            .where('id', '=', task.coordinator_run_id)
            .executeTakeFirst();
    const gates = await trx
      .selectFrom('decision_gates')
      .select(['id', 'question', 'status', 'resolution', 'created_at'])
      .where('task_id', '=', taskId)
      .orderBy('created_at')
      .orderBy('id')
      .execute();
    const dispatches = await trx
      .selectFrom('dispatch_contexts')
      .select(['id', 'terminal_handle', 'status', 'error', 'coordinator_run_id', 'created_at', 'ended_at'])
      .where('task_id', '=', taskId)
      .orderBy('seq')
      .execute();
    const dependencies = (await dependenciesTracked(trx, source.dialect, source.dialect.kind))
      ? await readDependenciesOf(trx, taskId)
      : null;
    const taskLease = await readTaskLease(trx, taskId, now);
    const workspaceLocks = await readWorkspaceLocksOf(
      trx,
      { workspaceId: task.workspace_id, runId: task.coordinator_run_id },
      now,
    );
    const pathRows = await trx
      .selectFrom('path_leases')
      .select(['workspace_id', 'lease_key', 'holder', 'task_id', 'expires_at'])
      .where('task_id', '=', taskId)
      .where('expires_at', '>', now)
      .orderBy('workspace_id')
      .orderBy('lease_key')
      .limit(scope.limit)
      .execute();
    const resources = await readOwnedResources(trx, scope, taskId);
    const admission = await trx
      .selectFrom('task_cleanup_admissions')
      .select('kind')
      .where('task_id', '=', taskId)
      .executeTakeFirst();

    const run = runRow
      ? {
          id: runRow.id,
          status: runRow.status,
          heartbeatAgeMs: now - Number(runRow.heartbeat_at ?? runRow.started_at),
        }
      : null;
    const explanation: Omit<TaskExplanation, 'reasons'> = {
      at: now,
      task: {
        id: task.id,
        title: task.title,
        status: task.status,
        workspaceId: task.workspace_id,
        targetKey: task.target_key,
        coordinatorRunId: task.coordinator_run_id,
        parentId: task.parent_id,
        requiresFilesystem: Number(task.requires_filesystem) === 1,
        writes: task.writes === null ? null : (JSON.parse(task.writes) as string[]),
        createdAt: Number(task.created_at),
        updatedAt: Number(task.updated_at),
      },
      dependencies,
      run,
      gates: gates.map((g) => ({
        id: g.id,
        question: g.question,
        status: g.status,
        resolution: g.resolution,
        createdAt: Number(g.created_at),
      })),
      dispatches: dispatches.map((d) => ({
        id: d.id,
        terminalHandle: d.terminal_handle,
        status: d.status,
        error: d.error,
        coordinatorRunId: d.coordinator_run_id,
        createdAt: Number(d.created_at),
        endedAt: d.ended_at === null ? null : Number(d.ended_at),
      })),
      leases: {
        task: taskLease,
        workspaces: workspaceLocks,
        paths: pathRows.map((p) => ({
          workspaceId: p.workspace_id,
          path: decodePathLeaseKey(p.lease_key),
          holder: p.holder,
          taskId: p.task_id,
          expiresAt: Number(p.expires_at),
          leftMs: Number(p.expires_at) - now,
        })),
      },
      ownership: { resources: resources.items, cleanupAdmission: admission?.kind ?? null },
    };
    return { ...explanation, reasons: explain(explanation, scope) };
  });
}

/**
 * Run `runId`'s tasks and dispatches over time (at most `limit` of each, oldest first), the
 * dependency edges of its tasks, and the run itself. Read-only, one read transaction. Throws `NotFoundError` for an unknown run.
 *
 * @example
 * const { tasks, dispatches } = await runTimeline(store, run.id);
 */
export async function runTimeline(
  source: InspectSource,
  runId: string,
  options?: InspectOptions,
): Promise<RunTimeline> {
  requireId('runId', runId);
  const scope = scopeOf(source, options);
  await requireLatestSchema(source);
  return source.dialect.readTransaction(async (trx) => {
    const run = await trx
      .selectFrom('coordinator_runs')
      .select(['id', 'target_key', 'coordinator_handle', 'status', 'started_at', 'ended_at', 'heartbeat_at'])
      .where('id', '=', runId)
      .executeTakeFirst();
    if (!run) throw new NotFoundError('coordinator run', runId);
    const tasks = await trx
      .selectFrom('tasks')
      .select(['id', 'title', 'status', 'parent_id', 'created_at', 'updated_at'])
      .where('coordinator_run_id', '=', runId)
      .orderBy('seq')
      .limit(scope.limit)
      .execute();
    const dispatches = await trx
      .selectFrom('dispatch_contexts')
      .select(['id', 'task_id', 'terminal_handle', 'status', 'created_at', 'ended_at'])
      .where('coordinator_run_id', '=', runId)
      .orderBy('seq')
      .limit(scope.limit)
      .execute();
    const edges = await trx
      .selectFrom('task_dependencies as d')
      .innerJoin('tasks as t', 't.id', 'd.task_id')
      .select(['d.task_id', 'd.depends_on_id'])
      .where('t.coordinator_run_id', '=', runId)
      .orderBy('t.seq')
      .orderBy('d.depends_on_id')
      .limit(scope.limit)
      .execute();
    const counts = await taskCountsByRun(trx, [runId]);
    return {
      at: scope.now,
      run: runView(run, scope, counts.get(runId)),
      tasks: tasks.map((t) => ({
        id: t.id,
        title: t.title,
        status: t.status,
        parentId: t.parent_id,
        createdAt: Number(t.created_at),
        updatedAt: Number(t.updated_at),
      })),
      dispatches: dispatches.map((d) => ({
        id: d.id,
        taskId: d.task_id,
        terminalHandle: d.terminal_handle,
        status: d.status,
        createdAt: Number(d.created_at),
        endedAt: d.ended_at === null ? null : Number(d.ended_at),
      })),
      dependencies: edges.map((e) => ({ taskId: e.task_id, dependsOnId: e.depends_on_id })),
    };
  });
}

/** The reasons of an explanation, most decisive first. */
function explain(e: Omit<TaskExplanation, 'reasons'>, scope: SectionScope): string[] {
  const reasons: string[] = [];
  const { task, run } = e;
  const failed = e.dispatches.filter((d) => d.status === 'failed').length;
  const active = e.dispatches.find((d) => d.status === 'active');
  const finished = task.status === 'done' || task.status === 'failed' || task.status === 'cancelled';
  if (finished) reasons.push(`The task is ${task.status}: nothing will dispatch it again.`);
  if (task.status === 'failed' && failed >= DISPATCH_FAILURE_LIMIT)
    reasons.push(
      `${failed} of its dispatches failed; the circuit breaker fails a task at ${DISPATCH_FAILURE_LIMIT} failed dispatches.`,
    );
  const waitingOn = (e.dependencies ?? []).filter((d) => d.status !== 'done');
  if (!finished && waitingOn.length > 0)
    reasons.push(
      `It waits on ${waitingOn.length} dependenc${waitingOn.length === 1 ? 'y' : 'ies'} not done: ${waitingOn
        .slice(0, 5)
        .map((d) => `${d.id} (${d.status})`)
        .join(', ')}${waitingOn.length > 5 ? ', …' : ''}.`,
    );
  if (e.ownership.cleanupAdmission !== null)
    reasons.push(`It is admitted for cleanup (${e.ownership.cleanupAdmission}): no new resources may be given to it.`);
  if (run === null) {
    if (!finished)
      reasons.push(
        `No run owns it: the next run started on ${task.targetKey === null ? 'the null target' : `target ${task.targetKey}`} adopts it.`,
      );
  } else if (run.status !== 'running') {
    if (!finished)
      reasons.push(
        `Its run ${run.id} is ${run.status}: the task waits for a run on its target to adopt it (startCoordinatorRun or adoptUnownedTasks).`,
      );
  } else if (run.heartbeatAgeMs > scope.staleAfterMs) {
    reasons.push(
      `Its run ${run.id} last heartbeat was ${describeDuration(run.heartbeatAgeMs)} ago (stale after ${describeDuration(scope.staleAfterMs)}): reconcileStaleRuns would fail it.`,
    );
  }
  for (const gate of e.gates.filter((g) => g.status === 'open'))
    reasons.push(`Gate ${gate.id} is open: ${JSON.stringify(gate.question)} (resolveGate answers it).`);
  if (active)
    reasons.push(
      `Dispatched to terminal ${active.terminalHandle} (dispatch ${active.id}) ${describeDuration(scope.now - active.createdAt)} ago; its exit ends it.`,
    );
  const lease = e.leases.task;
  if (lease)
    reasons.push(
      lease.expired
        ? `Its task lease (holder ${lease.holder}, token ${lease.token}) expired ${describeDuration(-lease.leftMs)} ago and was not released: the next claim takes it with token ${lease.token + 1}.`
        : `Its task lease is held by ${lease.holder} (token ${lease.token}) for ${describeDuration(lease.leftMs)} more.`,
    );
  for (const lock of finished ? [] : e.leases.workspaces)
    reasons.push(
      lock.expired
        ? `The lock of workspace ${lock.workspaceId} (holder ${lock.holder}) expired ${describeDuration(-lock.leftMs)} ago and was not released: the next claim takes it.`
        : `Workspace ${lock.workspaceId} is locked by ${lock.holder}${lock.runId === null ? '' : ` (run ${lock.runId})`}, token ${lock.token}, for ${describeDuration(lock.leftMs)} more.`,
    );
  if (e.leases.paths.length > 0)
    reasons.push(
      `It holds ${e.leases.paths.length} path lease${e.leases.paths.length === 1 ? '' : 's'} (${e.leases.paths
        .slice(0, 3)
        .map((p) => (p.path === '' ? '(whole workspace)' : p.path))
        .join(', ')}${e.leases.paths.length > 3 ? ', …' : ''}).`,
    );
  if (
    !finished &&
    !active &&
    task.status === 'ready' &&
    waitingOn.length === 0 &&
    e.gates.every((g) => g.status !== 'open') &&
    (run === null || run.status === 'running')
  )
    reasons.push('It is ready and no dispatch is active: the next dispatch of its run picks it up.');
  if (reasons.length === 0) reasons.push(`The task is ${task.status}.`);
  return reasons;
}
