/**
 * The work lifecycle's hot path: `dispatchNext` → `completeDispatch` cycles per second with N
 * workers draining one run's pre-created ready queue (each worker its own store and connection),
 * beside graphile-worker's add → run → complete and the raw commit floor measured in the same
 * run; and the claim-next latency (`dispatchNext` p50/p99) as the ready queue grows, which must
 * stay flat because the pick walks `tasks_ready_queue_idx` instead of sorting the queue.
 *
 * On PostgreSQL the cycle is also measured with the pick's `FOR UPDATE SKIP LOCKED` replaced by a
 * plain `FOR UPDATE` (issue 22's mutant: without SKIP LOCKED, claim-next throughput at 16
 * connections collapses; a benchmark shows it, not a test).
 *
 * And the cost of `startCoordinatorRun` on a target as its history grows: a start adopts only
 * the target's unfinished tasks, so it must cost the same beside 0 or 10,000 finished ones (issue
 * 22 measured 440–474 ms at 10,000 when a start adopted the whole history).
 */
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import type { Store } from '../src/index.js';
import { openStore } from './lib/taskfence.js';
import type { BenchDatabases } from './lib/databases.js';
import { graphileCycles } from './graphile.bench.js';
import { median, percentile, round } from './lib/stats.js';
import { benchCommitFloor } from './wakeups.bench.js';

type Dialect = 'sqlite' | 'postgres';

export interface LifecycleCycleRow {
  readonly dialect: Dialect;
  readonly workers: number;
  readonly cyclesPerSec: number;
  /** The same drain with the pick's `SKIP LOCKED` removed (plain `FOR UPDATE`; PostgreSQL only). */
  readonly withoutSkipLockedCyclesPerSec: number | null;
  /** Without SKIP LOCKED over with it, both measured in the same run (PostgreSQL only). */
  readonly ratioWithoutSkipLocked: number | null;
  /** graphile-worker's add → run → complete at the same concurrency (PostgreSQL only). */
  readonly graphileWorkerCyclesPerSec: number | null;
  readonly ratioToGraphile: number | null;
  /** The worker loop's step: `completeDispatch` with `next` (the completion and the next claim in one transaction). */
  readonly chainedCyclesPerSec: number;
  readonly chainedRatioToGraphile: number | null;
  /** Cycles per second over the floor's one-row commits per second (PostgreSQL only). */
  readonly ratioToFloor: number | null;
}

export interface ClaimLatencyRow {
  readonly dialect: Dialect;
  readonly readyTasks: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
}

export interface LifecycleResult {
  readonly floor: { commitsPerSec: number; p50Ms: number; p99Ms: number };
  readonly cycles: LifecycleCycleRow[];
  readonly latency: ClaimLatencyRow[];
  /** PostgreSQL's plan of the pick query at the largest queue size. */
  readonly postgresPlan: string;
  readonly runStart: RunStartRow[];
  /** PostgreSQL's plan of run start's task adoption at the largest history. */
  readonly postgresAdoptPlan: string;
}

export interface RunStartRow {
  readonly dialect: Dialect;
  /** Finished tasks (done, failed, cancelled; each with its ended dispatch) left on the target by earlier runs. */
  readonly finishedTasks: number;
  /** Unfinished tasks every start adopts (the previous run's). */
  readonly unfinishedTasks: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
}

const execFileAsync = promisify(execFile);
const CHILD = fileURLToPath(new URL('./children/drain.mjs', import.meta.url));
const RUN = 'run';
const TARGET = 'worktree:bench';

async function urlFor(dbs: BenchDatabases, dialect: Dialect): Promise<string> {
  return dialect === 'sqlite' ? `sqlite:${dbs.sqliteFile()}` : await dbs.postgresUrl();
}

/** A migrated store with a company and a running run to queue tasks in. */
async function setUp(url: string): Promise<Store> {
  const store = await openStore({ url, poolSize: 1 });
  await store.migrate();
  await store.org.createCompany({ id: 'c', name: 'bench' });
  await store.runs.startCoordinatorRun({ id: RUN, targetKey: TARGET });
  return store;
}

/** Bulk-inserts `count` ready tasks into the run (1,000 rows a statement), random priorities 0–9. */
async function seedReady(db: Kysely<never>, from: number, count: number): Promise<void> {
  const now = Date.now();
  for (let start = from; start < from + count; start += 1000) {
    const rows = [];
    for (let i = start; i < Math.min(from + count, start + 1000); i++)
      rows.push({
        id: `seed-${i}`,
        company_id: 'c',
        title: `t${i}`,
        status: 'ready',
        created_at: now,
        updated_at: now,
        coordinator_run_id: RUN,
        target_key: TARGET,
        requires_filesystem: 0,
        priority: i % 10,
      });
    await (db as unknown as Kysely<Record<string, Record<string, unknown>>>).insertInto('tasks').values(rows).execute();
  }
}

/** Fresh planner statistics after a bulk insert (both dialects have `ANALYZE`). */
async function analyze(store: Store): Promise<void> {
  await sql`analyze`.execute(store.db);
}

/** The pick's lock in `taskfence_dispatch_next_v1` (migration 0101), the claim `dispatchNext` calls on PostgreSQL. */
const PICK_LOCK = /limit 1\s+for update skip locked\)/;

/**
 * Issue 22's mutant without SKIP LOCKED, for this benchmark only: the claim function redefined in
 * the benchmark's database with a plain `FOR UPDATE` for the length of `fn`, then restored. The
 * library carries no switch for it; a definition whose pick is not found fails the run instead of
 * quietly measuring the normal pick.
 */
async function withPlainForUpdate<T>(url: string, fn: () => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const { rows } = await client.query<{ def: string }>(
      `select pg_get_functiondef('taskfence_dispatch_next_v1'::regproc) as def`,
    );
    const shipped = rows[0]!.def;
    if (!PICK_LOCK.test(shipped)) throw new Error('the claim function has no SKIP LOCKED pick to replace');
    await client.query(shipped.replace(PICK_LOCK, 'limit 1 for update)'));
    try {
      return await fn();
    } finally {
      await client.query(shipped);
    }
  } finally {
    await client.end();
  }
}

/** How the PostgreSQL pick locks: as shipped, or issue 22's mutant (`withPlainForUpdate`). */
type PickLock = 'for update skip locked' | 'for update';

/**
 * How a worker loop takes its next task: `dispatchNext` after each `completeDispatch` (two
 * transactions a cycle), or the completion's own `next` (one).
 */
type Loop = 'two-calls' | 'chained';

/** `workers` stores drain `tasks` pre-created ready tasks with dispatchNext → completeDispatch (or chained completions). */
async function lifecycleCycles(
  url: string,
  tasks: number,
  workers: number,
  lock: PickLock = 'for update skip locked',
  loop: Loop = 'two-calls',
): Promise<number> {
  const setup = await setUp(url);
  await seedReady(setup.db as never, 0, tasks);
  await analyze(setup);
  const stores: Store[] = [];
  for (let w = 0; w < workers; w++) stores.push(await openStore({ url, poolSize: 1 }));
  const drain = async () => {
    let done = 0;
    const t0 = performance.now();
    await Promise.all(
      stores.map(async (store, w) => {
        if (loop === 'chained') {
          let d = await store.dispatches.dispatchNext({ runId: RUN, terminalHandle: `term-${w}` });
          while (d) {
            const completed = await store.dispatches.completeDispatch(d.id, {
              result: { ok: true },
              lease: d.lease ?? undefined,
              next: true,
            });
            done++;
            d = completed.next ?? null;
          }
          return;
        }
        for (;;) {
          const d = await store.dispatches.dispatchNext({ runId: RUN, terminalHandle: `term-${w}` });
          if (!d) return;
          await store.dispatches.completeDispatch(d.id, { result: { ok: true }, lease: d.lease ?? undefined });
          done++;
        }
      }),
    );
    const elapsed = performance.now() - t0;
    if (done !== tasks) throw new Error(`drained ${done} of ${tasks} tasks`);
    return (done / elapsed) * 1000;
  };
  try {
    return await (lock === 'for update' ? withPlainForUpdate(url, drain) : drain());
  } finally {
    for (const s of stores) await s.close();
    await setup.close();
  }
}

/**
 * The same drain from `workers` processes (each its own connection, built `dist/`), released at
 * one wall-clock instant: cycles over the window from the first start to the last end.
 */
async function lifecycleCyclesInProcesses(
  url: string,
  tasks: number,
  workers: number,
  loop: Loop = 'two-calls',
): Promise<number> {
  const setup = await setUp(url);
  await seedReady(setup.db as never, 0, tasks);
  await analyze(setup);
  await setup.close();
  const startAt = Date.now() + 1500 + workers * 300;
  const outputs = await Promise.all(
    Array.from({ length: workers }, (_, worker) =>
      execFileAsync(process.execPath, [CHILD, JSON.stringify({ url, runId: RUN, worker, startAt, loop })]),
    ),
  );
  const results = outputs.map(
    (o) => JSON.parse(o.stdout.trim().split('\n').at(-1)!) as { startedAt: number; endedAt: number; done: number },
  );
  const done = results.reduce((n, r) => n + r.done, 0);
  if (done !== tasks) throw new Error(`drained ${done} of ${tasks} tasks`);
  const elapsed = Math.max(...results.map((r) => r.endedAt)) - Math.min(...results.map((r) => r.startedAt));
  return (done / elapsed) * 1000;
}

/** The pick `dispatchNext` runs (src/repositories/dispatches, `claimNextIn`), for EXPLAIN. */
const PICK = sql`select id, coordinator_run_id from tasks
  where coordinator_run_id = ${RUN} and status = 'ready'
    and not exists (select 1 from task_dependencies d join tasks dep on dep.id = d.depends_on_id
                    where d.task_id = tasks.id and dep.status <> 'done')
  order by priority desc, seq limit 1 for update skip locked`;

/**
 * `dispatchNext` latency with `size` ready tasks queued: each timed claim is followed (untimed)
 * by its completion and one new ready task, so the queue keeps its size.
 */
async function claimLatency(
  dbs: BenchDatabases,
  dialect: Dialect,
  options: { sizes: readonly number[]; iterations: number; runs: number },
): Promise<{ rows: ClaimLatencyRow[]; plan: string }> {
  const store = await setUp(await urlFor(dbs, dialect));
  const rows: ClaimLatencyRow[] = [];
  let plan = '';
  let seeded = 0; // ids used so far
  let queued = 0; // ready tasks in the queue
  try {
    for (const size of [...options.sizes].sort((a, b) => a - b)) {
      await seedReady(store.db as never, seeded, size - queued);
      seeded += size - queued;
      queued = size;
      await analyze(store);
      const p50s: number[] = [];
      const p99s: number[] = [];
      for (let r = 0; r < options.runs; r++) {
        const latencies: number[] = [];
        for (let i = -20; i < options.iterations; i++) {
          const t0 = performance.now();
          const d = await store.dispatches.dispatchNext({ runId: RUN, terminalHandle: 'term' });
          const t = performance.now() - t0;
          if (!d) throw new Error('ready queue unexpectedly empty');
          await store.dispatches.completeDispatch(d.id, { lease: d.lease ?? undefined });
          await seedReady(store.db as never, seeded++, 1);
          if (i >= 0) latencies.push(t);
        }
        latencies.sort((a, b) => a - b);
        p50s.push(percentile(latencies, 50));
        p99s.push(percentile(latencies, 99));
      }
      const row = { dialect, readyTasks: size, p50Ms: round(median(p50s), 3), p99Ms: round(median(p99s), 3) };
      rows.push(row);
      console.log(`  claim-next ${dialect} at ${size} ready: p50 ${row.p50Ms} ms, p99 ${row.p99Ms} ms`);
    }
    if (dialect === 'postgres') {
      const explained = await sql<{ 'QUERY PLAN': string }>`explain ${PICK}`.execute(store.db);
      plan = explained.rows.map((r) => r['QUERY PLAN']).join('\n');
      console.log(`  PostgreSQL plan of the pick:\n${plan}`);
    }
  } finally {
    await store.close();
  }
  return { rows, plan };
}

/** The unfinished tasks on each history target: 15 waiting, 5 dispatched with an active dispatch. */
const UNFINISHED = 20;
type Rows = Kysely<Record<string, Record<string, unknown>>>;
const historyTarget = (finished: number) => `worktree:history-${finished}`;

/** A target's unfinished tasks, in no run yet: the first start adopts them, and every start after. */
async function seedUnfinished(db: Rows, target: string): Promise<void> {
  const now = Date.now();
  const statuses = ['ready', 'todo', 'backlog', 'dispatched'] as const;
  const tasks = Array.from({ length: UNFINISHED }, (_, i) => ({
    id: `${target}-open-${i}`,
    company_id: 'c',
    title: `open ${i}`,
    status: i < 15 ? statuses[i % 3] : statuses[3],
    created_at: now,
    updated_at: now,
    target_key: target,
    requires_filesystem: 0,
  }));
  await db.insertInto('tasks').values(tasks).execute();
  const dispatches = tasks
    .filter((t) => t.status === 'dispatched')
    .map((t) => ({
      id: `${t.id}-d`,
      task_id: t.id,
      terminal_handle: `${t.id}-term`,
      status: 'active',
      created_at: now,
      updated_at: now,
      lease_expires_at: now + 86_400_000,
    }));
  await db.insertInto('dispatch_contexts').values(dispatches).execute();
}

/**
 * `count` finished tasks of run `runId` on `target` (8 done, 1 failed, 1 cancelled in 10), each
 * with the dispatch that ended it, 1,000 rows a statement.
 */
async function seedFinished(db: Rows, target: string, runId: string, from: number, count: number): Promise<void> {
  const now = Date.now();
  const ends = { done: 'completed', failed: 'failed', cancelled: 'cancelled' } as const;
  for (let start = from; start < from + count; start += 1000) {
    const tasks = [];
    for (let i = start; i < Math.min(from + count, start + 1000); i++)
      tasks.push({
        id: `${target}-hist-${i}`,
        company_id: 'c',
        title: `t${i}`,
        status: i % 10 === 8 ? ('failed' as const) : i % 10 === 9 ? ('cancelled' as const) : ('done' as const),
        created_at: now,
        updated_at: now,
        coordinator_run_id: runId,
        target_key: target,
        requires_filesystem: 0,
      });
    await db.insertInto('tasks').values(tasks).execute();
    await db
      .insertInto('dispatch_contexts')
      .values(
        tasks.map((t) => ({
          id: `${t.id}-d`,
          task_id: t.id,
          terminal_handle: `${t.id}-term`,
          status: ends[t.status],
          error: t.status === 'failed' ? 'bench' : null,
          created_at: now,
          updated_at: now,
          ended_at: now,
          coordinator_run_id: runId,
        })),
      )
      .execute();
  }
}

/** Run start's task adoption (src/repositories/runs/statements.ts, `ADOPT_TASKS`), for EXPLAIN. */
const adoptOn = (target: string) => sql`update tasks set coordinator_run_id = 'next', updated_at = 0
  where status not in ('done', 'failed', 'cancelled')
    and (coordinator_run_id is null or not exists (
      select 1 from coordinator_runs r where r.id = tasks.coordinator_run_id and r.status = 'running'))
    and target_key = ${target}`;

/**
 * `startCoordinatorRun` latency beside history: one target per entry of `histories`, in one
 * database, each with that many finished tasks from earlier runs (runs of 1,000) and `UNFINISHED`
 * open ones. Each round starts a run on every target in turn (the order rotating), so drift hits
 * them alike; each timed start follows the untimed stop of that target's previous run and must
 * adopt exactly the `UNFINISHED` open tasks, none of the finished ones.
 */
export async function runStartLatency(
  dbs: BenchDatabases,
  dialect: Dialect,
  options: { histories: readonly number[]; iterations: number; runs: number },
): Promise<{ rows: RunStartRow[]; plan: string }> {
  const store = await openStore({ url: await urlFor(dbs, dialect), poolSize: 1 });
  const histories = [...options.histories].sort((a, b) => a - b);
  const p50s = histories.map((): number[] => []);
  const p99s = histories.map((): number[] => []);
  let plan = '';
  try {
    await store.migrate();
    await store.org.createCompany({ id: 'c', name: 'bench' });
    for (const history of histories) {
      const target = historyTarget(history);
      await seedUnfinished(store.db as never, target);
      for (let seeded = 0; seeded < history; seeded += 1000) {
        const run = await store.runs.startCoordinatorRun({ targetKey: target });
        await seedFinished(store.db as never, target, run.id, seeded, Math.min(1000, history - seeded));
        await store.runs.stopCoordinatorRun(run.id, 'completed');
      }
    }
    await analyze(store);
    for (let r = 0; r < options.runs; r++) {
      const latencies = histories.map((): number[] => []);
      for (let i = -20; i < options.iterations; i++) {
        for (let k = 0; k < histories.length; k++) {
          const h = (i + 20 + k) % histories.length;
          const t0 = performance.now();
          const run = await store.runs.startCoordinatorRun({ targetKey: historyTarget(histories[h]!) });
          const t = performance.now() - t0;
          if (run.adoptedTaskCount !== UNFINISHED)
            throw new Error(`a start adopted ${run.adoptedTaskCount} tasks, not the ${UNFINISHED} unfinished ones`);
          await store.runs.stopCoordinatorRun(run.id, 'completed');
          if (i >= 0) latencies[h]!.push(t);
        }
      }
      latencies.forEach((l, h) => {
        l.sort((a, b) => a - b);
        p50s[h]!.push(percentile(l, 50));
        p99s[h]!.push(percentile(l, 99));
      });
    }
    if (dialect === 'postgres') {
      const largest = adoptOn(historyTarget(histories.at(-1)!));
      const explained = await sql<{ 'QUERY PLAN': string }>`explain ${largest}`.execute(store.db);
      plan = explained.rows.map((r) => r['QUERY PLAN']).join('\n');
      console.log(`  PostgreSQL plan of run start's adoption:\n${plan}`);
    }
  } finally {
    await store.close();
  }
  return {
    rows: histories.map((history, h) => {
      const row: RunStartRow = {
        dialect,
        finishedTasks: history,
        unfinishedTasks: UNFINISHED,
        p50Ms: round(median(p50s[h]!), 3),
        p99Ms: round(median(p99s[h]!), 3),
      };
      console.log(`  run start ${dialect} with ${history} finished tasks: p50 ${row.p50Ms} ms, p99 ${row.p99Ms} ms`);
      return row;
    }),
    plan,
  };
}

export async function benchLifecycle(
  dbs: BenchDatabases,
  options: {
    tasks: number;
    workers: { sqlite: readonly number[]; postgres: readonly number[] };
    sizes: readonly number[];
    iterations: number;
    runs: number;
    floorIterations: number;
    runStart: { histories: readonly number[]; iterations: number };
  },
): Promise<LifecycleResult> {
  const floor = await benchCommitFloor(dbs, options.floorIterations);
  console.log(`  floor: ${floor.commitsPerSec} commits/s`);
  const cycles: LifecycleCycleRow[] = [];
  for (const dialect of ['postgres', 'sqlite'] as const) {
    for (const workers of options.workers[dialect]) {
      const tf: number[] = [];
      const plain: number[] = [];
      const gw: number[] = [];
      const chained: number[] = [];
      for (let r = 0; r < options.runs; r++) {
        const url = await urlFor(dbs, dialect);
        tf.push(
          dialect === 'sqlite'
            ? await lifecycleCyclesInProcesses(url, options.tasks, workers)
            : await lifecycleCycles(url, options.tasks, workers),
        );
        const chainUrl = await urlFor(dbs, dialect);
        chained.push(
          dialect === 'sqlite'
            ? await lifecycleCyclesInProcesses(chainUrl, options.tasks, workers, 'chained')
            : await lifecycleCycles(chainUrl, options.tasks, workers, 'for update skip locked', 'chained'),
        );
        if (dialect === 'postgres') {
          plain.push(await lifecycleCycles(await dbs.postgresUrl(), options.tasks, workers, 'for update'));
          gw.push(await graphileCycles(await dbs.postgresUrl(), options.tasks, workers));
        }
      }
      const t = Math.round(median(tf));
      const p = plain.length ? Math.round(median(plain)) : null;
      const g = gw.length ? Math.round(median(gw)) : null;
      const c = Math.round(median(chained));
      const row: LifecycleCycleRow = {
        dialect,
        workers,
        cyclesPerSec: t,
        withoutSkipLockedCyclesPerSec: p,
        ratioWithoutSkipLocked: p === null ? null : round(p / t),
        graphileWorkerCyclesPerSec: g,
        ratioToGraphile: g ? round(t / g) : null,
        chainedCyclesPerSec: c,
        chainedRatioToGraphile: g ? round(c / g) : null,
        ratioToFloor: dialect === 'postgres' ? round(t / floor.commitsPerSec) : null,
      };
      cycles.push(row);
      console.log(
        `  lifecycle ${dialect} at ${workers} workers: ${t} cycles/s, chained ${c}${p === null ? '' : ` (without SKIP LOCKED ${p})`}${g ? ` (graphile-worker ${g})` : ''}`,
      );
    }
  }
  const latency: ClaimLatencyRow[] = [];
  let postgresPlan = '';
  for (const dialect of ['sqlite', 'postgres'] as const) {
    const { rows, plan } = await claimLatency(dbs, dialect, options);
    latency.push(...rows);
    if (plan) postgresPlan = plan;
  }
  const runStart: RunStartRow[] = [];
  let postgresAdoptPlan = '';
  for (const dialect of ['sqlite', 'postgres'] as const) {
    const { rows, plan } = await runStartLatency(dbs, dialect, { ...options.runStart, runs: options.runs });
    runStart.push(...rows);
    if (plan) postgresAdoptPlan = plan;
  }
  return { floor, cycles, latency, postgresPlan, runStart, postgresAdoptPlan };
}

export function lifecycleTable(result: LifecycleResult): string {
  const sizes = [...new Set(result.latency.map((r) => r.readyTasks))];
  const histories = [...new Set(result.runStart.map((r) => r.finishedTasks))];
  return [
    `Floor (raw pg, one connection, one-row autocommit inserts): ${result.floor.commitsPerSec} commits/s. A taskfence cycle is two transactions (claim, complete); a chained cycle is one (\`completeDispatch\` with \`next\`: the completion and the terminal's next claim). graphile-worker's cycle includes adding the job (on the producers' own connections, while the runner works), taskfence's queue was pre-created. PostgreSQL workers run in this process, each its own store and connection; SQLite workers are separate processes on one file. "Without SKIP LOCKED" is issue 22's mutant: the same drain with the claim function redefined, for the run only, with a plain \`FOR UPDATE\` pick.`,
    '',
    '| dialect | workers | taskfence: dispatchNext → completeDispatch (cycles/s) | chained: completeDispatch with next (cycles/s) | same, pick without SKIP LOCKED (cycles/s) | without / with SKIP LOCKED | graphile-worker: add → run → complete (cycles/s) | taskfence / graphile-worker | chained / graphile-worker | taskfence / floor commits |',
    '|---|---|---|---|---|---|---|---|---|---|',
    ...result.cycles.map(
      (r) =>
        `| ${r.dialect} | ${r.workers} | ${r.cyclesPerSec} | ${r.chainedCyclesPerSec} | ${r.withoutSkipLockedCyclesPerSec ?? '—'} | ${r.ratioWithoutSkipLocked ?? '—'} | ${r.graphileWorkerCyclesPerSec ?? '—'} | ${r.ratioToGraphile ?? '—'} | ${r.chainedRatioToGraphile ?? '—'} | ${r.ratioToFloor ?? '—'} |`,
    ),
    '',
    `| dialect | ${sizes.map((s) => `claim p50 / p99 at ${s.toLocaleString('en')} ready (ms)`).join(' | ')} | p50 largest / smallest |`,
    `|---|${sizes.map(() => '---|').join('')}---|`,
    ...(['sqlite', 'postgres'] as const).map((dialect) => {
      const mine = result.latency.filter((r) => r.dialect === dialect);
      return `| ${dialect} | ${mine.map((r) => `${r.p50Ms} / ${r.p99Ms}`).join(' | ')} | ${round(mine.at(-1)!.p50Ms / mine[0]!.p50Ms)} |`;
    }),
    '',
    'PostgreSQL plan of the pick at the largest queue:',
    '',
    '```',
    result.postgresPlan,
    '```',
    '',
    `Run start (\`startCoordinatorRun\`, one connection) on targets in one database whose earlier runs left N finished tasks (done, failed, cancelled in 8:1:1, each with its ended dispatch), each with ${result.runStart[0]?.unfinishedTasks ?? UNFINISHED} unfinished tasks every start adopts (checked; the target's previous run is stopped first, untimed). The targets take turns, so drift hits them alike:`,
    '',
    `| dialect | ${histories.map((h) => `start p50 / p99 with ${h.toLocaleString('en')} finished (ms)`).join(' | ')} | p50 largest / smallest |`,
    `|---|${histories.map(() => '---|').join('')}---|`,
    ...(['sqlite', 'postgres'] as const).map((dialect) => {
      const mine = result.runStart.filter((r) => r.dialect === dialect);
      return `| ${dialect} | ${mine.map((r) => `${r.p50Ms} / ${r.p99Ms}`).join(' | ')} | ${round(mine.at(-1)!.p50Ms / mine[0]!.p50Ms)} |`;
    }),
    '',
    "PostgreSQL plan of run start's task adoption at the largest history:",
    '',
    '```',
    result.postgresAdoptPlan,
    '```',
  ].join('\n');
}
