/**
 * Batch calls against their single forms on PostgreSQL (issue 24 item 3, target ≥ 10× at 100
 * items): `tasks.createTasks`, `messages.sendMessages`, `dispatches.dispatchNextBatch` and a
 * heartbeat of four leases (`store.renewLeases`), each beside the same items made one call at a
 * time, on one store with one connection, in the same run; with graphile-worker's `add_jobs`
 * batch beside its `addJob` on the same database. Items per second.
 */
import pg from 'pg';
import { makeWorkerUtils, Logger } from 'graphile-worker';
import type { Lease, Store } from '../src/index.js';
import { openStore } from './lib/taskfence.js';
import type { BenchDatabases } from './lib/databases.js';
import { median, round } from './lib/stats.js';

export interface BatchRow {
  readonly operation: string;
  readonly items: number;
  readonly singleItemsPerSec: number;
  readonly batchItemsPerSec: number;
  readonly ratio: number;
}

let n = 0;
const id = (name: string) => `${name}-${++n}`;

/** Items per second of one timed `make()` that makes `items` items. */
async function timed(items: number, make: () => Promise<unknown>): Promise<number> {
  const t0 = performance.now();
  await make();
  return (items / (performance.now() - t0)) * 1000;
}

/**
 * Items per second of `single()` and of `batch()` (each makes `items` items), the median of `runs`
 * rounds each, the two taking turns round by round so that a machine's drift hits both alike,
 * after `warmup` rounds of each that are not measured. A warm-up matters most to the batch form:
 * PL/pgSQL plans a function's statements afresh on each of a connection's first five calls and
 * then keeps a plan, so five measured batch calls on a new connection would be five planned ones
 * (0.5–1 ms more each for `dispatchNextBatch`), while the single form's hundreds of calls are past
 * that after its first round. A service lives past its first five calls.
 */
async function alternate(
  items: number,
  rounds: { readonly runs: number; readonly warmup: number },
  single: () => Promise<unknown>,
  batch: () => Promise<unknown>,
): Promise<[number, number]> {
  const singles: number[] = [];
  const batches: number[] = [];
  for (let r = 0; r < rounds.warmup + rounds.runs; r++) {
    const s = await timed(items, single);
    const b = await timed(items, batch);
    if (r < rounds.warmup) continue;
    singles.push(s);
    batches.push(b);
  }
  return [median(singles), median(batches)];
}

async function seedRun(store: Store) {
  const company = (await store.org.createCompany({ name: 'bench' })).id;
  const targetKey = `worktree:${id('batch')}`;
  const run = await store.runs.startCoordinatorRun({ targetKey });
  return { company, targetKey, run };
}

/** Runs every batch-against-single comparison; `items` per batch, `runs` measured rounds each after `warmup`. */
export async function benchBatches(
  dbs: BenchDatabases,
  options: { items: number; runs: number; warmup: number },
): Promise<BatchRow[]> {
  const { items } = options;
  const rounds = { runs: options.runs, warmup: options.warmup };
  const url = await dbs.postgresUrl();
  const store = await openStore({ url, poolSize: 1 });
  await store.migrate();
  const rows: BatchRow[] = [];
  const row = (operation: string, count: number, single: number, batch: number) =>
    rows.push({
      operation,
      items: count,
      singleItemsPerSec: round(single, 0),
      batchItemsPerSec: round(batch, 0),
      ratio: round(batch / single, 2),
    });
  try {
    const { company, targetKey, run } = await seedRun(store);
    const task = () => ({ id: id('t'), companyId: company, title: 't', targetKey, requiresFilesystem: false });

    // createTask × items against createTasks(items).
    const [singleTasks, batchTasks] = await alternate(
      items,
      rounds,
      async () => {
        for (let i = 0; i < items; i++) await store.tasks.createTask(task());
      },
      () => store.tasks.createTasks(Array.from({ length: items }, task)),
    );
    row('createTask → createTasks', items, singleTasks, batchTasks);

    // sendMessage × items against sendMessages(items), to the run's inbox.
    const message = () => ({ id: id('m'), from: 'w', to: run.coordinatorHandle, kind: 'report', payload: { ok: 1 } });
    const [singleSends, batchSends] = await alternate(
      items,
      rounds,
      async () => {
        for (let i = 0; i < items; i++) await store.messages.sendMessage(message());
      },
      () => store.messages.sendMessages(Array.from({ length: items }, message)),
    );
    row('sendMessage → sendMessages', items, singleSends, batchSends);

    // dispatchNext on items free terminals against dispatchNextBatch over them (tasks pre-created ready).
    for (let made = 0; made < items * (rounds.runs + rounds.warmup) * 2; made += items)
      await store.tasks.createTasks(Array.from({ length: items }, () => ({ ...task(), status: 'ready' as const })));
    const terminals = () => Array.from({ length: items }, () => id('term'));
    const [singleDispatch, batchDispatch] = await alternate(
      items,
      rounds,
      async () => {
        for (const terminalHandle of terminals())
          await store.dispatches.dispatchNext({ runId: run.id, terminalHandle });
      },
      () => store.dispatches.dispatchNextBatch({ runId: run.id, terminalHandles: terminals() }),
    );
    row('dispatchNext → dispatchNextBatch', items, singleDispatch, batchDispatch);

    // A heartbeat of four leases: one renewal each against renewLeases.
    const [leased, dispatched] = await store.tasks.createTasks([
      { ...task(), status: 'ready' },
      { ...task(), status: 'ready' },
    ]);
    const taskLease = await store.locks.claimTaskLease(leased!.id, { holder: 'w', ttlMs: 60_000 });
    const dispatch = await store.dispatches.createDispatch({ taskId: dispatched!.id, terminalHandle: id('hb') });
    const ws = await store.org.createWorkspace({ companyId: company, name: 'hb' });
    const paths = await store.paths.tryAcquirePaths({ workspaceId: ws.id, holder: 'w', paths: ['src'], ttlMs: 60_000 });
    const slot = await store.semaphores.acquire('hb', { holder: 'w', limit: 1, ttlMs: 60_000 });
    if (taskLease.status !== 'acquired' || paths.status !== 'acquired' || slot.status !== 'acquired')
      throw new Error('heartbeat setup: a lease was busy');
    let leases: readonly Lease[] = [taskLease.lease, dispatch.lease!, paths.lease, slot.lease];
    const beats = items;
    const [singleBeat, batchBeat] = await alternate(
      beats * 4,
      rounds,
      async () => {
        for (let b = 0; b < beats; b++) {
          const [t, d, p, s] = leases as [never, never, never, never];
          leases = [
            await store.locks.renewTaskLease(t, { ttlMs: 60_000 }),
            await store.dispatches.heartbeatDispatch(d, { ttlMs: 60_000 }),
            await store.paths.renewPaths(p, { ttlMs: 60_000 }),
            await store.semaphores.renew(s, { ttlMs: 60_000 }),
          ];
        }
      },
      async () => {
        for (let b = 0; b < beats; b++) {
          const { renewed, lost } = await store.renewLeases(leases, { ttlMs: 60_000 });
          if (lost.length > 0) throw new Error('heartbeat lost a lease');
          leases = renewed;
        }
      },
    );
    row('4 renewals → renewLeases (a heartbeat of 4)', 4, singleBeat, batchBeat);

    // graphile-worker: addJob × items against its add_jobs SQL function with items specs.
    const gwUrl = await dbs.postgresUrl();
    const utils = await makeWorkerUtils({ connectionString: gwUrl, logger: new Logger(() => () => {}) });
    await utils.migrate();
    const client = new pg.Client({ connectionString: gwUrl });
    await client.connect();
    try {
      const specs = JSON.stringify(Array.from({ length: items }, (_, i) => ({ identifier: 'noop', payload: { i } })));
      const [singleJobs, batchJobs] = await alternate(
        items,
        rounds,
        async () => {
          for (let i = 0; i < items; i++) await utils.addJob('noop', { i });
        },
        () =>
          client.query(
            'select graphile_worker.add_jobs(array(select json_populate_recordset(null::graphile_worker.job_spec, $1::json)))',
            [specs],
          ),
      );
      row('graphile-worker: addJob → add_jobs', items, singleJobs, batchJobs);
    } finally {
      await client.end();
      await utils.release();
    }
  } finally {
    await store.close();
  }
  return rows;
}

export interface BesideActiveRow {
  /** Dispatches active in another run of the store beside the measured batches. */
  readonly activeElsewhere: number;
  /** `dispatchNextBatch` of 100 terminals, dispatches per second. */
  readonly batchItemsPerSec: number;
  /** Against the same batches on a store with no dispatch active elsewhere (target ≈ 1). */
  readonly ratio: number;
}

/**
 * `dispatchNextBatch`'s cost beside the rest of the store (issue 24): the same 100-terminal
 * batches on two fresh stores, one with `activeElsewhere` dispatches active in another run, the
 * other with none, the two taking turns round by round (each round adds its 100 dispatches to
 * both). The statistics are left to autovacuum, as in a service whose active dispatches grew
 * faster than its last analyze. A batch tells a free terminal by one index probe per terminal
 * (schema 0104), whatever the statistics say, so the ratio should stay near 1; 0103's function
 * let the planner hash every active dispatch of the store per call when it expected few.
 */
export async function benchBatchBesideActive(
  dbs: BenchDatabases,
  options: { activeElsewhere: number; runs: number },
): Promise<BesideActiveRow[]> {
  const items = 100;
  const stores: Store[] = [];
  try {
    const sides = [];
    for (const elsewhere of [0, options.activeElsewhere]) {
      const store = await openStore({ url: await dbs.postgresUrl(), poolSize: 1 });
      stores.push(store);
      await store.migrate();
      const { company, targetKey, run } = await seedRun(store);
      const ready = (runTarget: string, count: number) =>
        Array.from({ length: count }, () => ({
          id: id('t'),
          companyId: company,
          title: 't',
          targetKey: runTarget,
          requiresFilesystem: false,
          status: 'ready' as const,
        }));
      if (elsewhere > 0) {
        const other = await store.runs.startCoordinatorRun({ targetKey: `worktree:${id('elsewhere')}` });
        for (let made = 0; made < elsewhere; made += items) {
          await store.tasks.createTasks(ready(other.targetKey!, items));
          const handles = Array.from({ length: items }, () => id('busy'));
          await store.dispatches.dispatchNextBatch({ runId: other.id, terminalHandles: handles });
        }
      }
      for (let r = 0; r < options.runs + 1; r++) await store.tasks.createTasks(ready(targetKey, items));
      sides.push({ store, run, samples: [] as number[] });
    }
    for (let r = 0; r <= options.runs; r++)
      for (const side of r % 2 === 0 ? sides : [...sides].reverse()) {
        const handles = Array.from({ length: items }, () => id('term'));
        const perSec = await timed(items, async () => {
          const made = await side.store.dispatches.dispatchNextBatch({ runId: side.run.id, terminalHandles: handles });
          if (made.length !== items) throw new Error(`batch made ${made.length} dispatches, not ${items}`);
        });
        if (r > 0) side.samples.push(perSec); // the first round warms each store
      }
    const [none, beside] = sides.map((side) => median(side.samples)) as [number, number];
    return [
      { activeElsewhere: 0, batchItemsPerSec: round(none, 0), ratio: 1 },
      { activeElsewhere: options.activeElsewhere, batchItemsPerSec: round(beside, 0), ratio: round(beside / none, 2) },
    ];
  } finally {
    for (const store of stores) await store.close();
  }
}

/** The README table of `benchBatchBesideActive`'s rows. */
export function besideActiveTable(rows: readonly BesideActiveRow[]): string {
  return [
    '| dispatches active elsewhere in the store | `dispatchNextBatch` (100 terminals), dispatches/s | against none (target ≈ 1) |',
    '|---|---|---|',
    ...rows.map((r) => `| ${r.activeElsewhere} | ${r.batchItemsPerSec} | ${r.ratio} |`),
  ].join('\n');
}

/** The README table of `benchBatches`' rows. */
export function batchesTable(rows: readonly BatchRow[]): string {
  return [
    '| operation (PostgreSQL, one connection) | items per batch | one call per item, items/s | batch, items/s | batch / single (target ≥ 10 at 100) |',
    '|---|---|---|---|---|',
    ...rows.map((r) => `| ${r.operation} | ${r.items} | ${r.singleItemsPerSec} | ${r.batchItemsPerSec} | ${r.ratio} |`),
  ].join('\n');
}
