import PgBoss from 'pg-boss';
import { openStore } from './lib/taskfence.js';
import type { BenchDatabases } from './lib/databases.js';
import { measure, median, round } from './lib/stats.js';

/**
 * pg-boss's send → fetch → complete cycle beside taskfence's task-lease claim → release cycle, on
 * the same PostgreSQL database, one at a time, as a throughput ratio. They are not the same work
 * (pg-boss inserts and moves a job; taskfence upserts a fenced lease row), which the README says.
 */
export async function benchPeer(dbs: BenchDatabases, options: { iterations: number; runs: number }) {
  const url = await dbs.postgresUrl();
  const boss = new PgBoss({ connectionString: url, max: 1, supervise: false, schedule: false });
  boss.on('error', () => {});
  await boss.start();
  await boss.createQueue('bench');
  const store = await openStore({ url, poolSize: 1 });
  await store.migrate();
  await store.org.createCompany({ id: 'c', name: 'c' });
  await store.tasks.createTask({ id: 't', companyId: 'c', title: 't', requiresFilesystem: false });
  const bossCycle = async () => {
    await boss.send('bench', { n: 1 });
    const [job] = await boss.fetch('bench');
    if (!job) throw new Error('pg-boss fetched nothing');
    await boss.complete('bench', job.id);
  };
  const leaseCycle = async () => {
    const claim = await store.locks.claimTaskLease('t', { holder: 'bench', ttlMs: 60_000 });
    if (claim.status !== 'acquired') throw new Error('lease busy');
    await store.locks.releaseTaskLease('t', { token: claim.lease.token });
  };
  const tf: number[] = [];
  const pb: number[] = [];
  try {
    for (let r = 0; r < options.runs; r++) {
      tf.push((await measure(leaseCycle, options.iterations)).opsPerSec);
      pb.push((await measure(bossCycle, options.iterations)).opsPerSec);
    }
  } finally {
    await boss.stop({ graceful: false, close: true, wait: true }).catch(() => {});
    await store.close();
  }
  const result = {
    pgBossVersion: '10.4.2',
    taskfenceLeaseCycleOpsPerSec: round(median(tf), 0),
    pgBossJobCycleOpsPerSec: round(median(pb), 0),
    ratio: 0,
  };
  result.ratio = round(result.taskfenceLeaseCycleOpsPerSec / result.pgBossJobCycleOpsPerSec);
  console.log(
    `  peer: taskfence ${result.taskfenceLeaseCycleOpsPerSec} vs pg-boss ${result.pgBossJobCycleOpsPerSec} cycles/s`,
  );
  return result;
}
