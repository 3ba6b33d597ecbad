// Child process for the contention benchmark: one store (its own connection), one operation on
// this worker's own keys, `iterations` times, starting at the shared wall-clock instant `startAt`.
import { openStore } from '../../dist/index.js';

const { url, op, worker, iterations, startAt } = JSON.parse(process.argv[2]);
const store = await openStore({ url, poolSize: 1 });
const tag = `w${worker}`;
const lockWs = `w-lock-${tag}`;
const pathWs = 'w-path-shared';
const env = `env-${tag}`;
const [taskA, taskB] = [`t-a-${tag}`, `t-b-${tag}`];
const inbox = `coordinator-${tag}`;
let generation = 1;
let n = 0;

const ops = {
  startRun: () => store.runs.startCoordinatorRun({ targetKey: `contend:${process.pid}:${++n}` }),
  lockCycle: async () => {
    const claim = await store.locks.claimWorkspaceLock(lockWs, { holder: tag, runId: 'r', ttlMs: 60_000 });
    if (claim.status !== 'acquired') throw new Error('busy');
    await store.locks.releaseWorkspaceLock(claim.lease);
  },
  pathCycle: async () => {
    const r = await store.paths.tryAcquirePaths({
      workspaceId: pathWs,
      holder: tag,
      paths: [`${tag}/src`, `${tag}/docs`],
      ttlMs: 60_000,
    });
    if (!r.acquired) throw new Error('paths busy');
    await store.paths.releasePaths({ workspaceId: pathWs, holder: tag });
  },
  transfer: async () => {
    const [from, to] = generation % 2 === 1 ? [taskA, taskB] : [taskB, taskA];
    generation = (
      await store.ownership.transferEnvironmentOwnership({
        environmentId: env,
        expectedOwnerTaskId: from,
        expectedGeneration: generation,
        newOwnerTaskId: to,
      })
    ).generation;
  },
  deliver: async () => {
    const got = await store.messages.deliverPendingMessages(inbox, { limit: 1 });
    if (got.length !== 1) throw new Error('inbox empty');
  },
};

const fn = ops[op];
await new Promise((resolve) => setTimeout(resolve, Math.max(0, startAt - Date.now())));
const startedAt = Date.now();
const latencies = [];
let errors = 0;
let firstError = null;
for (let i = 0; i < iterations; i++) {
  const t0 = performance.now();
  try {
    await fn();
  } catch (error) {
    errors++;
    firstError ??= String(error?.message ?? error);
  }
  latencies.push(performance.now() - t0);
}
const endedAt = Date.now();
const retries = store.dialect.stats.retries;
await store.close();
console.log(JSON.stringify({ startedAt, endedAt, latencies, errors, firstError, retries }));
