/**
 * A coordinator loop on taskfence's public API (SPEC §3, §4): start a run on a target (reconciling
 * a crashed predecessor), dispatch the run's ready tasks under task leases and workspace locks,
 * take workers' reports from the run's inbox, and stop when every task is finished.
 *
 * Workers are plain async functions here (a real one would be a process or a terminal); they speak
 * to the coordinator only through the database: fencing tokens to prove they still own their task
 * and workspace, and messages to the coordinator's inbox.
 *
 * In an application, import from 'taskfence' instead of the source tree.
 */
import {
  CoordinatorRunConflictError,
  DispatchNotActiveError,
  DISPATCH_FAILURE_LIMIT,
  type CoordinatorRun,
  type DispatchResult,
  type LeaseGrant,
  type Message,
  type StartedCoordinatorRun,
  type Store,
  type Task,
  type TaskStatus,
} from '../../src/index.js';

/** What the coordinator hands a worker: the task, its dispatch, and the fencing tokens that authorize the work. */
export interface Assignment {
  readonly task: Task;
  readonly dispatchId: string;
  /** The worker's terminal: its exit is reported by this handle. */
  readonly terminalHandle: string;
  /** Where the worker reports: the run's inbox. */
  readonly coordinatorHandle: string;
  readonly ttlMs: number;
  readonly taskLease: LeaseGrant;
  /** Only for a task that writes to a workspace (lock mode `exclusive`). */
  readonly workspaceLock: { readonly workspaceId: string; readonly token: number } | null;
}

/** A worker: does the task and reports with `reportDone`, or throws (the terminal "exits"). */
export type Worker = (store: Store, assignment: Assignment) => Promise<void>;

/** The messages of this protocol, in the run's inbox. */
export type InboxMessage =
  | { readonly kind: 'task.done'; readonly payload: { readonly taskId: string; readonly dispatchId: string } }
  | { readonly kind: 'terminal.exited'; readonly payload: { readonly terminalHandle: string; readonly error: string } };

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const UNFINISHED: TaskStatus[] = ['ready', 'dispatched', 'in_progress'];

/**
 * Starts a run on `targetKey`. If another run holds the target, its holder may have crashed: runs
 * heartbeat, and `reconcileStaleRuns` fails every run whose heartbeat is older than `staleAfterMs`,
 * freeing its target. A live holder keeps heartbeating, so after `giveUpAfterMs` the conflict is
 * rethrown: two coordinators never run one target.
 */
export async function startRun(
  store: Store,
  targetKey: string | null,
  options: { staleAfterMs: number; giveUpAfterMs: number; log: (line: string) => void },
): Promise<{ run: StartedCoordinatorRun; reconciled: CoordinatorRun[] }> {
  const reconciled: CoordinatorRun[] = [];
  const giveUpAt = Date.now() + options.giveUpAfterMs;
  let waiting = false;
  for (;;) {
    try {
      const run = await store.runs.startCoordinatorRun({ targetKey, spec: 'examples/orchestrator' });
      options.log(
        `run ${run.id} started on ${targetKey}; inbox ${run.coordinatorHandle}; adopted ${run.adoptedTaskCount} task(s)`,
      );
      return { run, reconciled };
    } catch (error) {
      if (!(error instanceof CoordinatorRunConflictError)) throw error;
      const failed = await store.runs.reconcileStaleRuns({ staleAfterMs: options.staleAfterMs });
      reconciled.push(...failed);
      for (const r of failed) options.log(`reconciled run ${r.id} (target ${r.targetKey}): its heartbeat was stale`);
      if (failed.some((r) => r.id === error.runningRunId)) continue;
      if (Date.now() > giveUpAt) throw error;
      if (!waiting)
        options.log(`target busy: run ${error.runningRunId} is running; waiting for it to stop or go stale`);
      waiting = true;
      await sleep(options.staleAfterMs / 4);
    }
  }
}

export interface OrchestrateOptions {
  readonly worker: Worker;
  /** Lifetime of each dispatch's task lease and workspace lock; workers renew them. */
  readonly ttlMs: number;
  /** How long one beat waits for the inbox. */
  readonly beatMs: number;
  /** The loop fails instead of running past this. */
  readonly deadlineMs: number;
  readonly log: (line: string) => void;
}

export interface OrchestrateStats {
  beats: number;
  /** Every successful dispatch, in order, with the fencing tokens it was granted. */
  readonly dispatched: {
    taskId: string;
    terminalHandle: string;
    taskLeaseToken: number;
    workspaceLockToken: number | null;
  }[];
  /** Dispatches refused because another holder had the workspace (`cancelled`, `workspace_busy`). */
  workspaceBusy: number;
  /** Dispatches skipped because the task's lease was still held (`skipped`, `task_leased`). */
  taskLeased: number;
  /** Messages taken from the inbox, by kind. */
  readonly delivered: Record<InboxMessage['kind'], number>;
}

/**
 * The beat loop of one run, until every task of the run is finished and no dispatch is active:
 * heartbeat the run, dispatch its ready tasks, then wait (up to one beat) for the inbox and handle
 * what arrives.
 */
export async function orchestrate(
  store: Store,
  run: CoordinatorRun,
  options: OrchestrateOptions,
): Promise<OrchestrateStats> {
  const { log } = options;
  const stats: OrchestrateStats = {
    beats: 0,
    dispatched: [],
    workspaceBusy: 0,
    taskLeased: 0,
    delivered: { 'task.done': 0, 'terminal.exited': 0 },
  };
  const workers: Promise<void>[] = [];
  const workerErrors: unknown[] = [];
  const lastOutcome = new Map<string, string>(); // to log a waiting task once, not every beat
  const titles = new Map<string, string>();
  const deadline = Date.now() + options.deadlineMs;

  const finished = async () =>
    (await store.tasks.listTasks({ runId: run.id, status: UNFINISHED })).length === 0 &&
    (await store.dispatches.listDispatches({ runId: run.id, status: 'active' })).length === 0;

  while (!(await finished())) {
    if (Date.now() > deadline) throw new Error(`run ${run.id}: tasks still unfinished after ${options.deadlineMs} ms`);
    stats.beats++;

    // 1. Heartbeat. If a reconciler failed this run (our heartbeats stopped for too long), this throws
    //    CoordinatorRunNotRunningError: the run is lost and the loop must stop acting for it.
    await store.runs.heartbeatCoordinatorRun(run.id);

    // 2. Dispatch the run's ready tasks, oldest first.
    for (const task of await store.tasks.listTasks({ runId: run.id, status: 'ready' })) {
      if (task.assigneeAgentId === null) continue; // nobody to run it
      titles.set(task.id, task.title);
      const terminalHandle = `${run.coordinatorHandle}/terminal-${stats.dispatched.length + 1}`;
      // One transaction: the task lease, the workspace lock (exclusive tasks only) and the dispatch
      // record commit together or not at all. It may run more than once (retries): no side effects in it.
      const { result, dispatchId } = await store.transaction(async (tx) => {
        const result = await tx.scheduler.dispatchRun({
          taskId: task.id,
          agentId: task.assigneeAgentId!,
          runId: run.id,
          mode: 'heartbeat',
          ttlMs: options.ttlMs,
        });
        if (result.outcome !== 'dispatched') return { result, dispatchId: null };
        const dispatch = await tx.dispatches.createDispatch({
          taskId: task.id,
          terminalHandle,
          agentId: task.assigneeAgentId,
          runId: run.id,
        });
        return { result, dispatchId: dispatch.id };
      });
      const note = describe(result);
      if (lastOutcome.get(task.id) !== note) log(`${task.title}: ${note}`);
      lastOutcome.set(task.id, result.outcome === 'dispatched' ? '' : note);

      switch (result.outcome) {
        case 'cancelled':
          stats.workspaceBusy++; // another holder has the workspace: retry on a later beat
          break;
        case 'skipped':
          if (result.reason === 'task_leased') stats.taskLeased++;
          break;
        case 'dispatched': {
          const assignment: Assignment = {
            task,
            dispatchId: dispatchId!,
            terminalHandle,
            coordinatorHandle: run.coordinatorHandle,
            ttlMs: options.ttlMs,
            taskLease: result.taskLease,
            workspaceLock:
              result.lockMode === 'exclusive'
                ? { workspaceId: result.workspace.id, token: result.workspaceLock.token }
                : null,
          };
          stats.dispatched.push({
            taskId: task.id,
            terminalHandle,
            taskLeaseToken: result.taskLease.token,
            workspaceLockToken: assignment.workspaceLock?.token ?? null,
          });
          workers.push(
            supervise(store, options.worker, assignment).catch((error: unknown) => {
              workerErrors.push(error);
            }),
          );
          break;
        }
      }
    }

    // 3. Deliver: wait up to one beat for the inbox (woken by a sender's commit), handle each message once.
    for (const message of await store.messages.waitForMessages(run.coordinatorHandle, { timeoutMs: options.beatMs })) {
      await handle(store, message, stats, (id) => titles.get(id) ?? id, log);
    }
  }
  await Promise.all(workers);
  if (workerErrors.length > 0) throw new AggregateError(workerErrors, 'a worker supervisor failed');
  return stats;
}

/** Runs a worker; if it throws (its terminal died), reports the exit to the run's inbox like any other event. */
async function supervise(store: Store, worker: Worker, assignment: Assignment): Promise<void> {
  try {
    await worker(store, assignment);
  } catch (error) {
    await store.messages.sendMessage({
      from: assignment.terminalHandle,
      to: assignment.coordinatorHandle,
      kind: 'terminal.exited',
      payload: {
        terminalHandle: assignment.terminalHandle,
        error: error instanceof Error ? error.message : String(error),
      },
    });
  }
}

async function handle(
  store: Store,
  message: Message,
  stats: OrchestrateStats,
  title: (taskId: string) => string,
  log: (line: string) => void,
) {
  const m = message as Message & InboxMessage;
  switch (m.kind) {
    case 'task.done':
      stats.delivered['task.done']++;
      try {
        await store.dispatches.endDispatch(m.payload.dispatchId, 'completed');
        log(`${m.from}: ${title(m.payload.taskId)} done`);
      } catch (error) {
        if (!(error instanceof DispatchNotActiveError)) throw error;
        log(`${m.from}: dispatch ${m.payload.dispatchId} had already ended (${error.code})`);
      }
      return;
    case 'terminal.exited': {
      stats.delivered['terminal.exited']++;
      // Fails the terminal's active dispatch exactly once; the task goes back to `ready`, or to
      // `failed` at the DISPATCH_FAILURE_LIMIT-th failure (the circuit breaker).
      const exit = await store.dispatches.failActiveDispatchOnExit(m.payload.terminalHandle, {
        error: m.payload.error,
      });
      if (exit)
        log(
          `${m.from} exited (${m.payload.error}): failure ${exit.failureCount} of ${DISPATCH_FAILURE_LIMIT}, ` +
            `task back to ${exit.taskStatus}${exit.circuitBreakerTripped ? ' (circuit breaker tripped)' : ''}`,
        );
      return;
    }
    default:
      log(`ignored a message of kind ${JSON.stringify(message.kind)} from ${message.from}`);
  }
}

function describe(result: DispatchResult): string {
  switch (result.outcome) {
    case 'dispatched':
      return result.lockMode === 'exclusive'
        ? `dispatched with task lease token ${result.taskLease.token} and workspace lock token ${result.workspaceLock.token} on ${result.workspace.name}`
        : `dispatched with task lease token ${result.taskLease.token}, no workspace lock (cognitive task)`;
    case 'cancelled':
      return `workspace ${result.workspace.name} busy (${result.heldBy.holder}, token ${result.heldBy.token}); retrying on a later beat`;
    case 'skipped':
      return result.reason === 'task_leased'
        ? `task lease still held (token ${result.heldBy.token}) until it is released or expires`
        : `skipped: ${result.error.message}`;
  }
}

/**
 * The worker's report, in one transaction: release the task lease and the workspace lock with the
 * tokens it was granted, record the result, and tell the coordinator. The releases are the fence:
 * if anyone claimed the task or the workspace after this worker (its lease expired and was taken),
 * they throw `StaleTaskLeaseError` / `StaleWorkspaceLockError`, and nothing of the report commits.
 */
export async function reportDone(store: Store, a: Assignment): Promise<void> {
  await store.transaction(async (tx) => {
    await tx.locks.releaseTaskLease(a.task.id, { token: a.taskLease.token });
    if (a.workspaceLock)
      await tx.locks.releaseWorkspaceLock(a.workspaceLock.workspaceId, { token: a.workspaceLock.token });
    await tx.paths.submitTaskResult(a.task.id, a.terminalHandle, { status: 'done' });
    await tx.messages.sendMessage({
      from: a.terminalHandle,
      to: a.coordinatorHandle,
      kind: 'task.done',
      payload: { taskId: a.task.id, dispatchId: a.dispatchId },
    });
  });
}

/**
 * A simulated worker: a few steps of "work", renewing its grants between steps (its heartbeat:
 * a renewal refused with a stale token means the task or workspace is someone else's now, and the
 * worker must stop), then `reportDone`.
 */
export async function simulatedWork(store: Store, a: Assignment, options: { steps: number; stepMs: number }) {
  for (let step = 0; step < options.steps; step++) {
    await sleep(options.stepMs);
    await store.locks.renewTaskLease(a.task.id, { token: a.taskLease.token, ttlMs: a.ttlMs });
    if (a.workspaceLock)
      await store.locks.renewWorkspaceLock(a.workspaceLock.workspaceId, {
        token: a.workspaceLock.token,
        ttlMs: a.ttlMs,
      });
  }
  await reportDone(store, a);
}
