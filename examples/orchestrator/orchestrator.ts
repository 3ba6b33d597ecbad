/**
 * A ready-queue orchestrator on taskfence's public API (issues 22 and 23). It has no readiness
 * logic of its own: the store knows the DAG, and `dispatches.dispatchNext` hands each free terminal
 * the run's highest-priority task whose dependencies are all done.
 *
 * - The coordinator starts a run, creates the tasks (`dependsOn`, `priority`, `spec`), then reads
 *   its inbox until every task is finished.
 * - Each terminal loops: `dispatchNext` → work (heartbeating its dispatch lease) → `completeDispatch`
 *   and a report to the coordinator, in one transaction. A terminal whose work throws fails its
 *   dispatch (`failActiveDispatchOnExit`): the task returns to `ready` and is retried, until the
 *   circuit breaker fails it at `DISPATCH_FAILURE_LIMIT`.
 * - The inbox is leased delivery: `receiveMessages` leases a batch, then each report is handled
 *   and acked (`tx.messages.ackMessages`) in one `store.transaction`, so a coordinator that dies
 *   before that commit gets the report again when its lease lapses.
 *
 * In an application, import from 'taskfence' instead of the source tree.
 */
import type { Dispatch, Store, StoreTransaction, TaskStatus } from '../../src/index.js';

/** One task of the plan: a name, the names it waits for, and its priority (higher goes first). */
export interface PlannedTask {
  readonly name: string;
  readonly dependsOn?: readonly string[];
  readonly priority?: number;
}

/** What a terminal tells the coordinator. */
export type Report =
  | { readonly kind: 'task.done'; readonly payload: { readonly name: string } }
  | {
      readonly kind: 'task.failed';
      readonly payload: { readonly name: string; readonly error: string; readonly taskStatus: TaskStatus };
    };

/** The work itself: throws to fail the dispatch. */
export type Work = (name: string, heartbeat: () => Promise<void>) => Promise<unknown>;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const FINISHED: TaskStatus[] = ['done', 'failed', 'cancelled'];

/**
 * Creates the plan's tasks in the run of `targetKey`, in order (a task names only earlier ones).
 * Tasks with dependencies not done are stored `blocked`; the store makes them `ready` when they are.
 */
export async function createPlan(
  store: Store,
  scope: { companyId: string; targetKey: string },
  plan: readonly PlannedTask[],
): Promise<Map<string, string>> {
  const ids = new Map<string, string>(); // name -> task id
  for (const t of plan) {
    const task = await store.tasks.createTask({
      companyId: scope.companyId,
      targetKey: scope.targetKey,
      title: t.name,
      status: 'ready',
      requiresFilesystem: false,
      priority: t.priority ?? 0,
      spec: { name: t.name },
      dependsOn: (t.dependsOn ?? []).map((name) => ids.get(name)!),
    });
    ids.set(t.name, task.id);
  }
  return ids;
}

/**
 * One terminal: takes the next ready task, works, completes it and reports, until `stop` says so.
 * Returns the dispatches it completed, in order.
 */
export async function runTerminal(
  store: Store,
  options: {
    runId: string;
    coordinatorHandle: string;
    terminalHandle: string;
    work: Work;
    ttlMs: number;
    idleMs: number;
    stop: () => boolean;
  },
): Promise<Dispatch[]> {
  const { runId, coordinatorHandle, terminalHandle, ttlMs } = options;
  const completed: Dispatch[] = [];
  while (!options.stop()) {
    const dispatch = await store.dispatches.dispatchNext({ runId, terminalHandle, ttlMs });
    if (!dispatch) {
      await sleep(options.idleMs); // nothing ready now
      continue;
    }
    const name = (await store.tasks.requireTask(dispatch.taskId)).title;
    let lease = dispatch.lease!;
    const report = (tx: StoreTransaction, r: Report) =>
      tx.messages.sendMessage({ from: terminalHandle, to: coordinatorHandle, kind: r.kind, payload: r.payload });
    try {
      const result = await options.work(name, async () => {
        lease = await store.dispatches.heartbeatDispatch(lease, { ttlMs });
      });
      // The fence: a dispatch reclaimed meanwhile is DispatchLeaseLostError, and nothing commits.
      const done = await store.transaction(async (tx) => {
        const { dispatch: done } = await tx.dispatches.completeDispatch(dispatch.id, { result, lease });
        await report(tx, { kind: 'task.done', payload: { name } });
        return done;
      });
      completed.push(done);
    } catch (error) {
      const message = error instanceof Error ? error.message : String(error);
      await store.transaction(async (tx) => {
        const exit = await tx.dispatches.failActiveDispatchOnExit(terminalHandle, {
          dispatchId: dispatch.id,
          error: message,
        });
        if (exit)
          await report(tx, { kind: 'task.failed', payload: { name, error: message, taskStatus: exit.taskStatus } });
      });
    }
  }
  return completed;
}

/** A report as the coordinator handles it: which message, from whom, and its hand-out. */
export type ReceivedReport = Report & {
  readonly id: string;
  readonly from: string;
  /** 1 on the first hand-out; more when an earlier hand-out was never acked (a crash). */
  readonly attempt: number;
};

/**
 * The coordinator's loop: heartbeat the run, take back lapsed dispatches, and handle the inbox
 * until every task of the run is finished and the inbox is empty.
 *
 * The inbox is at-least-once, processed effectively-once: `receiveMessages` leases a batch
 * (committed on its own), then each report is handled and acked in one `store.transaction`. The
 * ack goes first, so a lapsed lease (refused) stops before any write, and `onReport`'s writes on
 * `tx` commit with the ack or not at all. A coordinator that dies between receive and that commit
 * has acked nothing: the report is handed out again when its lease lapses (`attempt + 1`).
 * `onReport` may run more than once for one message (`store.transaction` retries `fn` whole on a
 * busy database), so it writes through `tx` or keys what it does by the message id.
 */
export async function coordinate(
  store: Store,
  run: { id: string; coordinatorHandle: string },
  options: {
    pollMs: number;
    deadlineMs: number;
    /** The lease of each hand-out: how soon a crashed coordinator's reports come back (default 10 s). */
    visibilityMs?: number;
    onReport: (tx: StoreTransaction, report: ReceivedReport) => void | Promise<void>;
  },
): Promise<void> {
  const inbox = run.coordinatorHandle;
  const deadline = Date.now() + options.deadlineMs;
  const unfinished = async () =>
    (await store.tasks.listTasks({ runId: run.id })).filter((t) => !FINISHED.includes(t.status)).length;
  for (;;) {
    await store.runs.heartbeatCoordinatorRun(run.id);
    await store.dispatches.reclaimExpiredDispatches({ runId: run.id }); // a terminal that died mid-task
    // Read before the inbox: a task finishes in the same transaction as its report, so once
    // none is unfinished here, every report is already in the inbox.
    const finished = (await unfinished()) === 0;
    const received = await store.messages.receiveMessages(inbox, { visibilityMs: options.visibilityMs ?? 10_000 });
    for (const m of received) {
      await store.transaction(async (tx) => {
        const { refused } = await tx.messages.ackMessages(inbox, [m.receipt]);
        if (refused.length > 0) return; // its lease lapsed: it comes back, and is handled then
        const report = { kind: m.kind, payload: m.payload } as Report;
        // A real coordinator writes its own tables here, through tx: they commit with the ack.
        await options.onReport(tx, { ...report, id: m.id, from: m.from, attempt: m.attempt });
      });
    }
    // Leased messages count too: a report a crashed coordinator left unacked is still to come.
    if (finished && received.length === 0 && (await store.messages.countPendingMessages(inbox)) === 0) return;
    if (Date.now() > deadline) throw new Error(`run ${run.id}: tasks unfinished after ${options.deadlineMs} ms`);
    if (received.length === 0) await sleep(options.pollMs);
  }
}
