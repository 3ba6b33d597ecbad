/**
 * A peer cycle beside graphile-worker on the same PostgreSQL: graphile-worker's job add → run →
 * complete (the job row is inserted, a worker takes it with SKIP LOCKED after a NOTIFY, runs a
 * no-op task, and deletes it) against taskfence's task → dispatch → complete (createTask stamps
 * the running run, createDispatch checks the task is ready and has no active dispatch, endDispatch
 * completes it), at 1, 4 and 16 concurrent workers. Not the same work: graphile-worker moves a
 * queue row; taskfence writes and fences three rows across two tables. Cycles per second.
 */
import { makeWorkerUtils, run, type Runner } from 'graphile-worker';
import type { Store } from '../src/index.js';
import { openStore } from './lib/taskfence.js';
import type { BenchDatabases } from './lib/databases.js';
import { median, round } from './lib/stats.js';

export interface PeerCycleRow {
  readonly workers: number;
  readonly graphileWorkerCyclesPerSec: number;
  readonly taskfenceCyclesPerSec: number;
  readonly ratio: number;
}

const silent = () => () => {};

/** graphile-worker's add → run → complete of `jobs` no-op jobs at `workers` concurrency (jobs/s). */
export async function graphileCycles(url: string, jobs: number, workers: number): Promise<number> {
  const utils = await makeWorkerUtils({
    connectionString: url,
    logger: new (await import('graphile-worker')).Logger(silent),
  });
  await utils.migrate();
  let done = 0;
  let finished!: () => void;
  const allDone = new Promise<void>((resolve) => (finished = resolve));
  const runner: Runner = await run({
    connectionString: url,
    concurrency: workers,
    noHandleSignals: true,
    pollInterval: 1_000,
    logger: new (await import('graphile-worker')).Logger(silent),
    taskList: {
      noop: async () => {
        if (++done === jobs) finished();
      },
    },
  });
  try {
    const t0 = performance.now();
    // `workers` producers add the jobs, one at a time each, while the runner works them off.
    await Promise.all(
      Array.from({ length: workers }, async (_, w) => {
        for (let i = w; i < jobs; i += workers) await utils.addJob('noop', { i });
      }),
    );
    await allDone;
    return (jobs / (performance.now() - t0)) * 1000;
  } finally {
    await runner.stop();
    await utils.release();
  }
}

async function taskfenceCycles(url: string, cycles: number, workers: number): Promise<number> {
  const setup = await openStore(url);
  await setup.migrate();
  await setup.org.createCompany({ id: 'c', name: 'bench' });
  await setup.runs.startCoordinatorRun({ id: 'run', targetKey: 'worktree:bench' });
  const stores: Store[] = [];
  for (let w = 0; w < workers; w++) stores.push(await openStore({ url, poolSize: 1 }));
  try {
    const t0 = performance.now();
    await Promise.all(
      stores.map(async (store, w) => {
        for (let i = w; i < cycles; i += workers) {
          const task = await store.tasks.createTask({
            companyId: 'c',
            title: `t${i}`,
            status: 'ready',
            targetKey: 'worktree:bench',
            requiresFilesystem: false,
          });
          const dispatch = await store.dispatches.createDispatch({ taskId: task.id, terminalHandle: `term-${w}` });
          await store.dispatches.endDispatch(dispatch.id, 'completed');
        }
      }),
    );
    return (cycles / (performance.now() - t0)) * 1000;
  } finally {
    for (const s of stores) await s.close();
    await setup.close();
  }
}

export async function benchGraphilePeer(
  dbs: BenchDatabases,
  options: { cycles: number; workers: readonly number[]; runs: number },
): Promise<PeerCycleRow[]> {
  const rows: PeerCycleRow[] = [];
  for (const workers of options.workers) {
    const gw: number[] = [];
    const tf: number[] = [];
    for (let r = 0; r < options.runs; r++) {
      gw.push(await graphileCycles(await dbs.postgresUrl(), options.cycles, workers));
      tf.push(await taskfenceCycles(await dbs.postgresUrl(), options.cycles, workers));
    }
    const g = Math.round(median(gw));
    const t = Math.round(median(tf));
    rows.push({ workers, graphileWorkerCyclesPerSec: g, taskfenceCyclesPerSec: t, ratio: round(t / g) });
    console.log(`  graphile peer at ${workers} workers: taskfence ${t} vs graphile-worker ${g} cycles/s`);
  }
  return rows;
}

export function graphileTable(rows: readonly PeerCycleRow[]): string {
  return [
    '| workers | graphile-worker 0.16.6: add → run → complete (cycles/s) | taskfence: createTask → createDispatch → endDispatch (cycles/s) | taskfence / graphile-worker |',
    '|---|---|---|---|',
    ...rows.map((r) => `| ${r.workers} | ${r.graphileWorkerCyclesPerSec} | ${r.taskfenceCyclesPerSec} | ${r.ratio} |`),
  ].join('\n');
}
