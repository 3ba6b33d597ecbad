/** Contender operations for the lifecycle race suite (run in child processes by the race helper). */
import { DispatchLeaseLostError, TerminalBusyError, type Dispatch, type Lease, type Store } from '../../src/index.js';
import type { ContenderTools } from '../support/contender.js';
import { defineOperations } from '../support/operations.js';

/** The host's table: one row per task while a live worker holds it (the primary key is the check). */
export type LifecycleHostTables = { lc_holding: { task_id: string; worker: string } };

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** What one worker loop saw. */
interface LoopReport {
  claims: number;
  /** Times a restarted worker found its terminal still held by its abandoned dispatch. */
  terminalWaits: number;
  completed: number;
  failed: number;
  abandoned: number;
  lateRefused: number;
  /** Claims made by a completion with `next` (counted in `claims` too). */
  chained: number;
  /** Broken invariants, described; must stay empty. */
  violations: string[];
}

/**
 * `loops` concurrent worker loops (each its own terminal) over the run's ready queue until no
 * task is ready or in flight: claim with `dispatchNext`, check the claimed task's dependencies
 * are all done and that no other live worker holds it (a host row per held task), work a moment,
 * then complete it (most), fail it by an exit report naming the dispatch (`failRate`), or abandon
 * it (`abandonRate`: a short lease, no report; someone reclaims it once it lapses, and the
 * abandoner's late completion with the old lease must be refused). The worker that replaces an
 * abandoning one reuses its terminal, so its claims meet `TerminalBusyError` until the lapsed
 * dispatch is reclaimed (the suite then checks, by seq, that one terminal's dispatches never overlap).
 */
export async function work(
  store: Store,
  args: { runId: string; loops: number; failRate: number; abandonRate: number; chainRate: number; seed: number },
  tools: ContenderTools,
) {
  let seed = args.seed + tools.index * 7919;
  const random = () => {
    seed = (seed * 1_103_515_245 + 12_345) % 2_147_483_648;
    return seed / 2_147_483_648;
  };
  // Host writes go through store.transaction, so SQLite's busy writers are waited for like taskfence's own.
  // The hold row is a fenced host write: it commits only while the dispatch lease is live.
  const hold = (lease: Lease<'dispatch'>, taskId: string, worker: string) =>
    store.transaction(async (tx) => {
      await tx.assertLease(lease);
      await tx.db
        .withTables<LifecycleHostTables>()
        .insertInto('lc_holding')
        .values({ task_id: taskId, worker })
        .execute();
    });
  const unhold = (taskId: string) =>
    store.transaction((tx) =>
      tx.db.withTables<LifecycleHostTables>().deleteFrom('lc_holding').where('task_id', '=', taskId).execute(),
    );
  const deadline = Date.now() + 120_000;
  const loop = async (k: number): Promise<LoopReport> => {
    const terminal = `term-${tools.index}-${k}`;
    const worker = `w${tools.index}-${k}`;
    const report: LoopReport = {
      claims: 0,
      terminalWaits: 0,
      completed: 0,
      failed: 0,
      abandoned: 0,
      lateRefused: 0,
      chained: 0,
      violations: [],
    };
    // The next dispatch a completion with `next` claimed for this terminal (the worker loop's step).
    let chained: Dispatch | null = null;
    const abandoned: Lease<'dispatch'>[] = [];
    const log: string[] = [];
    for (let idle = 0; ; ) {
      if (Date.now() > deadline) throw new Error(`${worker}: the queue did not drain in time`);
      const abandon = chained === null && random() < args.abandonRate;
      let d: Dispatch | null = chained;
      chained = null;
      if (d === null)
        try {
          d = await store.dispatches.dispatchNext({
            runId: args.runId,
            terminalHandle: terminal,
            ttlMs: abandon ? 250 : 30_000,
          });
        } catch (error) {
          if (!(error instanceof TerminalBusyError)) throw error;
          const lastAbandoned = abandoned.at(-1)?.resource;
          if (lastAbandoned !== undefined && error.activeDispatchId === lastAbandoned) {
            // The replacing worker waits for the abandoned dispatch to lapse and be reclaimed.
            report.terminalWaits++;
            await store.dispatches.reclaimExpiredDispatches({ runId: args.runId });
            await sleep(10);
            continue;
          }
          const held = await store.dispatches.getDispatch(error.activeDispatchId ?? '-');
          report.violations.push(
            `${worker}: its own terminal ${terminal} is busy with ${JSON.stringify(held)}; last: ${JSON.stringify(log.slice(-4))}`,
          );
          break;
        }
      if (!d) {
        await store.dispatches.reclaimExpiredDispatches({ runId: args.runId });
        const open = await store.db
          .selectFrom('tasks')
          .select('id')
          .where('coordinator_run_id', '=', args.runId)
          .where('status', 'in', ['ready', 'dispatched', 'in_progress'])
          .limit(1)
          .execute();
        if (open.length === 0) break;
        await sleep(idle++ < 5 ? 2 : 20);
        continue;
      }
      idle = 0;
      report.claims++;
      log.push(`claimed ${d.id} on ${terminal}`);
      // One terminal, one active dispatch, judged without clocks: right after the claim, no other
      // dispatch of this terminal may still be active (only this loop ends this one).
      for (const other of await store.dispatches.listDispatches({ terminalHandle: terminal, status: 'active' }))
        if (other.id !== d.id)
          report.violations.push(`${worker}: claimed ${d.id} on ${terminal} while ${other.id} was still active there`);
      const notDone = await store.tasks.listDependencies(d.taskId);
      for (const dep of notDone)
        if (dep.dependsOnStatus !== 'done')
          report.violations.push(
            `task ${d.taskId} dispatched while dependency ${dep.dependsOnId} was ${dep.dependsOnStatus}`,
          );
      if (abandon) {
        // This worker "dies" right after its claim: it never works, never reports.
        abandoned.push(d.lease!);
        report.abandoned++;
        // Its replacement reuses the terminal: it is busy until the lapsed dispatch is reclaimed.
        continue;
      }
      try {
        await hold(d.lease!, d.taskId, worker);
      } catch (error) {
        const other = await store.db
          .withTables<LifecycleHostTables>()
          .selectFrom('lc_holding')
          .select('worker')
          .where('task_id', '=', d.taskId)
          .executeTakeFirst();
        if (!other) throw error; // not the primary key: a fault of the write itself
        const history = (await store.dispatches.listDispatches({ taskId: d.taskId })).map(
          (x) => `${x.seq}:${x.terminalHandle}:${x.status}:${x.error ?? ''}:${x.createdAt}:${x.endedAt ?? ''}`,
        );
        report.violations.push(
          `task ${d.taskId} claimed by ${worker} while ${other.worker} held it; dispatches ${history.join(' | ')}; last: ${JSON.stringify(log.slice(-3))}`,
        );
        continue;
      }
      await sleep(Math.floor(random() * 3));
      await unhold(d.taskId);
      if (random() < args.failRate) {
        const exit = await store.dispatches.failActiveDispatchOnExit(terminal, { dispatchId: d.id });
        if (!exit) report.violations.push(`exit of ${terminal} found its dispatch ${d.id} already ended`);
        log.push(`exit ${d.id}: ${exit?.dispatch.status}`);
        report.failed++;
      } else if (random() < args.chainRate) {
        // The completion claims this terminal's next task in its transaction.
        const done = await store.dispatches.completeDispatch(d.id, {
          result: { by: worker },
          lease: d.lease!,
          next: true,
        });
        log.push(`completed ${d.id}, next ${done.next?.id ?? 'none'}`);
        report.completed++;
        if (done.next) {
          report.chained++;
          chained = done.next;
        }
      } else {
        await store.dispatches.completeDispatch(d.id, { result: { by: worker }, lease: d.lease! });
        log.push(`completed ${d.id}`);
        report.completed++;
      }
      if (report.claims % 16 === 0) await store.dispatches.reclaimExpiredDispatches({ runId: args.runId });
    }
    // Every abandoned dispatch was reclaimed by now (nothing is in flight): the late reports.
    for (const lease of abandoned) {
      try {
        await store.dispatches.completeDispatch(lease.resource, { lease, result: { late: true } });
        report.violations.push(`late completion of ${lease.resource} with an old token was accepted`);
      } catch (error) {
        if (!(error instanceof DispatchLeaseLostError)) throw error;
        report.lateRefused++;
      }
    }
    return report;
  };
  return Promise.all(Array.from({ length: args.loops }, (_, k) => loop(k)));
}

/**
 * Claims and completes from a static pool (no dependencies, nothing becomes ready meanwhile)
 * until it is empty; returns each claim's dispatch seq and task priority for the priority check.
 */
export async function drain(store: Store, args: { runId: string; loops: number }, tools: ContenderTools) {
  const loop = async (k: number) => {
    const claims: { seq: number; taskId: string }[] = [];
    for (;;) {
      const d = await store.dispatches.dispatchNext({ runId: args.runId, terminalHandle: `pool-${tools.index}-${k}` });
      if (!d) return claims;
      claims.push({ seq: d.seq, taskId: d.taskId });
      await store.dispatches.completeDispatch(d.id);
    }
  };
  return (await Promise.all(Array.from({ length: args.loops }, (_, k) => loop(k)))).flat();
}

/**
 * `drain` with `dispatchNextBatch`: each claimer fills its own `terminals` terminals in one call,
 * completes what it got and calls again until a call makes nothing; returns each dispatch's
 * seq, task and terminal, in the order made.
 */
export async function drainBatches(
  store: Store,
  args: { runId: string; loops: number; terminals: number },
  tools: ContenderTools,
) {
  const loop = async (k: number) => {
    const claims: { seq: number; taskId: string; terminal: string }[] = [];
    const handles = Array.from({ length: args.terminals }, (_, i) => `batch-${tools.index}-${k}-${i}`);
    for (;;) {
      const made = await store.dispatches.dispatchNextBatch({ runId: args.runId, terminalHandles: handles });
      if (made.length === 0) return claims;
      for (const d of made) claims.push({ seq: d.seq, taskId: d.taskId, terminal: d.terminalHandle });
      for (const d of made) await store.dispatches.completeDispatch(d.id, { lease: d.lease! });
    }
  };
  return (await Promise.all(Array.from({ length: args.loops }, (_, k) => loop(k)))).flat();
}

/** Completes the dispatch at this contender's index (the dependencies-finishing-at-once race). */
export async function completeOne(store: Store, args: { dispatchIds: readonly string[] }, tools: ContenderTools) {
  await store.dispatches.completeDispatch(args.dispatchIds[tools.index]!);
}

/** Claims the run's next task with a short lease, signals `holding`, and hangs (the parent SIGKILLs it). */
export async function holdAndHang(store: Store, args: { runId: string; ttlMs: number }, tools: ContenderTools) {
  const d = await store.dispatches.dispatchNext({
    runId: args.runId,
    terminalHandle: `doomed-${tools.index}`,
    ttlMs: args.ttlMs,
  });
  if (!d) throw new Error('nothing to claim');
  tools.signal('holding');
  await sleep(600_000);
}

/**
 * One round of the dispatchRun readiness race on one ready task. The `blocker` waits `delayMs`,
 * takes the task out of the runnable statuses (`how`), and then reads the task lease's token: a
 * claim committed before the change has at most that token. Every other contender calls
 * `dispatchRun` on the task in a loop (releasing each lease it gets at once, so the next claim
 * is not merely busy) until it is refused; it returns the tokens it was granted. A token above
 * the blocker's was granted after the task stopped being runnable.
 */
export async function readinessRound(
  store: Store,
  args:
    | { role: 'blocker'; taskId: string; delayMs: number; how: 'block' | 'gate' | 'complete' }
    | { role: 'claimer'; taskId: string; agentId: string; runPrefix: string },
  tools: ContenderTools,
): Promise<{ blockedAtToken: number | null; granted: number[]; refusedAs: string | null }> {
  if (args.role === 'blocker') {
    await sleep(args.delayMs);
    if (args.how === 'block') await store.tasks.transitionTask(args.taskId, { from: 'ready', to: 'blocked' });
    else if (args.how === 'gate') await store.gates.openGate({ question: 'hold?', taskId: args.taskId });
    else {
      const d = await store.dispatches.createDispatch({ taskId: args.taskId, terminalHandle: `rr-${args.taskId}` });
      await store.dispatches.completeDispatch(d.id);
    }
    const row = await store.db
      .selectFrom('task_leases')
      .select('token')
      .where('task_id', '=', args.taskId)
      .executeTakeFirst();
    return { blockedAtToken: row ? Number(row.token) : 0, granted: [], refusedAs: null };
  }
  const granted: number[] = [];
  const deadline = Date.now() + 30_000;
  for (let i = 0; Date.now() < deadline; i++) {
    try {
      const r = await store.scheduler.dispatchRun({
        taskId: args.taskId,
        agentId: args.agentId,
        runId: `${args.runPrefix}-${tools.index}-${i}`,
        mode: 'heartbeat',
      });
      if (r.outcome === 'dispatched') {
        granted.push(r.taskLease.token);
        await store.locks.releaseTaskLease(r.taskLease);
      }
    } catch (error) {
      if ((error as { code?: string }).code !== 'TASK_NOT_DISPATCHABLE') throw error;
      return { blockedAtToken: null, granted, refusedAs: (error as { status: string }).status };
    }
  }
  throw new Error(`claimer ${tools.index}: task ${args.taskId} was never refused`);
}

/**
 * One round of the terminal race: the `worker` completes its dispatch with `next` while every
 * `claimer` calls `dispatchNext` for the same terminal, again and again for 80 ms. Each returns
 * the dispatch it made (if any) and whether it met `TerminalBusyError`. A worker refused busy
 * checks that its dispatch is still active and completes it again.
 */
export async function terminalRound(
  store: Store,
  args:
    | { role: 'worker'; dispatchId: string; lease: Lease<'dispatch'> }
    | { role: 'claimer'; runId: string; terminal: string },
): Promise<{ made: string | null; busy: boolean; stillActiveWhenBusy?: boolean }> {
  if (args.role === 'claimer') {
    // Keeps trying for a while: a terminal left free for a moment between the completion and
    // its next claim would be taken here.
    const until = Date.now() + 80;
    let busy = false;
    do {
      try {
        const d = await store.dispatches.dispatchNext({ runId: args.runId, terminalHandle: args.terminal });
        if (d) return { made: d.id, busy };
      } catch (error) {
        if (!(error instanceof TerminalBusyError)) throw error;
        busy = true;
      }
    } while (Date.now() < until);
    return { made: null, busy };
  }
  try {
    const done = await store.dispatches.completeDispatch(args.dispatchId, { lease: args.lease, next: true });
    return { made: done.next?.id ?? null, busy: false };
  } catch (error) {
    if (!(error instanceof TerminalBusyError)) throw error;
    const still = (await store.dispatches.getDispatch(args.dispatchId))?.status === 'active';
    const done = await store.dispatches.completeDispatch(args.dispatchId, { lease: args.lease, next: true });
    return { made: done.next?.id ?? null, busy: true, stillActiveWhenBusy: still };
  }
}

export const ops = defineOperations(import.meta.url, {
  work,
  drain,
  drainBatches,
  completeOne,
  holdAndHang,
  readinessRound,
  terminalRound,
});
