/**
 * `npm run bench`: measures taskfence on both dialects against raw-driver baselines in the same
 * run, and writes bench/results/<date>.{json,md} and bench/results/latest.md.
 * `npm run bench -- --quick` runs smaller sizes (for checking that the benchmark itself works).
 * `--check` (`npm run bench:check`, a CI pass) runs the overhead, contention and batch sections
 * in quick mode with a few calls per case, writes no result files and exits non-zero when any
 * measured call failed, so benchmark code that no longer matches the API fails CI instead of
 * printing figures of failed calls.
 */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { BenchDatabases } from './lib/databases.js';
import { describeMachine } from './lib/machine.js';
import { benchBackfill, benchEmptyToLatest } from './migrations.bench.js';
import { benchOverhead, overheadTable } from './overhead.bench.js';
import { benchContention, contentionTable } from './contention.bench.js';
import { benchGrantRelease, benchPathScaling, scalingTable } from './scaling.bench.js';
import { benchPeer } from './peer.bench.js';
import { benchGraphilePeer, graphileTable } from './graphile.bench.js';
import { benchLifecycle, lifecycleTable } from './lifecycle.bench.js';
import { batchesTable, benchBatchBesideActive, benchBatches, besideActiveTable } from './batches.bench.js';
import { benchDeliveryCycles, benchKeyOverhead, deliveryTable, keyOverheadTable } from './delivery.bench.js';
import { benchCommitFloor, benchInboxDrain, benchWakeups, drainTable, wakeupTable } from './wakeups.bench.js';

const check = process.argv.includes('--check');
const quick = check || process.argv.includes('--quick');
/** The sections `--check` runs unless `--only` names others. */
const CHECKED = ['overhead', 'contention', 'batches'];
const only =
  process.argv
    .find((a) => a.startsWith('--only='))
    ?.slice('--only='.length)
    .split(',') ?? (check ? CHECKED : undefined);
const adminUrl = process.env.BENCH_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const RESULTS = fileURLToPath(new URL('./results/', import.meta.url));

type Section = { title: string; data: unknown; table: string; measuredAt?: string };

async function main() {
  const dbs = new BenchDatabases(adminUrl);
  const machine = await describeMachine(adminUrl);
  console.log(
    `taskfence bench on ${machine.cpus} cores, ${machine.memoryGiB} GiB, node ${machine.node}, SQLite ${machine.sqlite}, PostgreSQL ${machine.postgres}${quick ? ' (quick)' : ''}`,
  );
  const sections: Section[] = [];
  const want = (name: string) => !only || only.includes(name);
  try {
    if (want('overhead')) {
      const rows = await benchOverhead(dbs, { iterations: check ? 20 : quick ? 200 : 2000, runs: quick ? 1 : 9 });
      sections.push({
        title: 'Overhead against the raw driver (one connection, sequential)',
        data: rows,
        table: overheadTable(rows),
      });
    }
    if (want('contention')) {
      const rows = await benchContention(dbs, {
        iterations: check
          ? { sqlite: 20, postgres: 10 }
          : quick
            ? { sqlite: 100, postgres: 50 }
            : { sqlite: 1000, postgres: 300 },
        workers: check
          ? { sqlite: [2], postgres: [2] }
          : quick
            ? { sqlite: [1, 2], postgres: [1, 2] }
            : { sqlite: [1, 2, 4, 8], postgres: [1, 2, 4, 8, 16] },
        runs: quick ? 1 : 3,
      });
      sections.push({
        title: 'Contention (N processes, each its own connection and keys)',
        data: rows,
        table: contentionTable(rows),
      });
    }
    if (want('scaling')) {
      const rows = await benchPathScaling(dbs, {
        sizes: quick ? [10, 1000] : [10, 1000, 100_000],
        iterations: quick ? 100 : 500,
        runs: quick ? 1 : 5,
      });
      sections.push({ title: 'Path-lease conflict check as held leases grow', data: rows, table: scalingTable(rows) });
      const releases = await benchGrantRelease(dbs, {
        sizes: quick ? [10, 1000] : [10, 1000, 100_000],
        iterations: quick ? 100 : 500,
        runs: quick ? 1 : 5,
      });
      sections.push({
        title: "Releasing one grant as the holder's leases grow",
        data: releases,
        table: scalingTable(releases, "of the holder's leases"),
      });
    }
    if (want('peer')) {
      const peer = await benchPeer(dbs, { iterations: quick ? 100 : 1000, runs: quick ? 1 : 5 });
      sections.push({
        title: 'Peer: pg-boss on the same PostgreSQL database',
        data: peer,
        table: [
          '| cycle | cycles/s |',
          '|---|---|',
          `| taskfence task lease: claimTaskLease → releaseTaskLease | ${peer.taskfenceLeaseCycleOpsPerSec} |`,
          `| pg-boss ${peer.pgBossVersion} job: send → fetch → complete | ${peer.pgBossJobCycleOpsPerSec} |`,
          `| ratio taskfence / pg-boss | ${peer.ratio} |`,
        ].join('\n'),
      });
    }
    if (want('wakeups')) {
      const rows = await benchWakeups(dbs, { iterations: quick ? 10 : 100 });
      sections.push({
        title: 'Wake-ups: from the commit of a release or a send to the waiter returning',
        data: rows,
        table: wakeupTable(rows),
      });
    }
    if (want('inbox')) {
      const rows = await benchInboxDrain(dbs, {
        messages: quick ? 500 : 5000,
        consumers: quick ? [1, 2] : [1, 2, 4, 8],
        runs: quick ? 1 : 3,
      });
      sections.push({
        title: 'Inbox: one inbox drained by N consumers (each its own connection, batches of 10)',
        data: rows,
        table: drainTable(rows),
      });
    }
    if (want('delivery')) {
      const caseMs = Number(process.env.DELIVERY_CASE_MS ?? (quick ? 3_000 : 20_000));
      const cycles = await benchDeliveryCycles(dbs, { consumers: [1, 4, 8], caseMs });
      sections.push({
        title: `Leased delivery: receive → ack on one PostgreSQL inbox, beside pgmq-style raw SQL (batches of 10, ${caseMs / 1000} s per case)`,
        data: cycles,
        table: deliveryTable(cycles),
      });
      const keys = await benchKeyOverhead(dbs, { caseMs });
      sections.push({
        title: `Idempotency key on a claim: claimTaskLease with a fresh key against without (${caseMs / 1000} s per case)`,
        data: keys,
        table: keyOverheadTable(keys),
      });
    }
    if (want('floor')) {
      const floor = await benchCommitFloor(dbs, quick ? 200 : 2000);
      sections.push({
        title: 'Floor: the same PostgreSQL, one connection, one-row autocommit inserts (raw pg)',
        data: floor,
        table: [
          '| commits/s | p50 ms | p99 ms |',
          '|---|---|---|',
          `| ${floor.commitsPerSec} | ${floor.p50Ms} | ${floor.p99Ms} |`,
        ].join('\n'),
      });
    }
    if (want('graphile')) {
      const rows = await benchGraphilePeer(dbs, {
        cycles: quick ? 100 : 1000,
        workers: quick ? [1, 4] : [1, 4, 16],
        runs: quick ? 1 : 3,
      });
      sections.push({
        title: 'Peer: graphile-worker on the same PostgreSQL database',
        data: rows,
        table: graphileTable(rows),
      });
    }
    if (want('lifecycle')) {
      const result = await benchLifecycle(dbs, {
        tasks: quick ? 200 : 1000,
        workers: { postgres: [1, 4, 16], sqlite: [1, 2, 4, 8] },
        sizes: quick ? [10, 1000, 20_000] : [10, 1000, 100_000],
        iterations: quick ? 100 : 300,
        runs: quick ? 1 : 3,
        floorIterations: quick ? 200 : 2000,
        runStart: { histories: [0, 1000, 10_000], iterations: quick ? 50 : 200 },
      });
      sections.push({
        title: 'Lifecycle: dispatchNext → completeDispatch, and claim-next latency as the ready queue grows',
        data: result,
        table: lifecycleTable(result),
      });
    }
    if (want('batches')) {
      const rows = await benchBatches(dbs, { items: 100, runs: quick ? 1 : 5, warmup: quick ? 1 : 5 });
      sections.push({
        title: 'Batches: N items in one call against one call per item (PostgreSQL)',
        data: rows,
        table: batchesTable(rows),
      });
      const beside = await benchBatchBesideActive(dbs, {
        activeElsewhere: quick ? 2_000 : 10_000,
        runs: quick ? 3 : 9,
      });
      sections.push({
        title: 'dispatchNextBatch beside the rest of the store (PostgreSQL)',
        data: beside,
        table: besideActiveTable(beside),
      });
    }
    if (want('migrations')) {
      const empty = await benchEmptyToLatest(dbs, quick ? 1 : 5);
      const backfill = await benchBackfill(dbs, quick ? 20_000 : 1_000_000, quick ? 1 : 3);
      const b = backfill as unknown as Record<'sqlite' | 'postgres', Record<string, number>>;
      sections.push({
        title: 'Migrations',
        data: { emptyToLatest: empty, backfill0052: backfill },
        table: [
          '| measurement | SQLite | PostgreSQL |',
          '|---|---|---|',
          `| empty → latest (ms) | ${empty.sqliteMs} | ${empty.postgresMs} |`,
          `| 0052 backfill of ${backfill.tasks.toLocaleString('en')} tasks, taskfence (ms) | ${b.sqlite.taskfenceMs} | ${b.postgres.taskfenceMs} |`,
          `| same rows, one raw UPDATE (ms) | ${b.sqlite.rawMs} | ${b.postgres.rawMs} |`,
          `| ratio taskfence / raw (target ≤ 1.5) | ${b.sqlite.ratioTaskfenceToRaw} | ${b.postgres.ratioTaskfenceToRaw} |`,
          `| peak RSS taskfence / raw (MB; target < 150) | ${b.sqlite.taskfencePeakRssMB} / ${b.sqlite.rawPeakRssMB} | ${b.postgres.taskfencePeakRssMB} / ${b.postgres.rawPeakRssMB} |`,
          `| rows flagged (identical in both) | ${b.sqlite.flagged} | ${b.postgres.flagged} |`,
        ].join('\n'),
      });
    }
  } finally {
    await dbs.dropAll();
  }
  if (check) {
    const failed = failedRows(sections);
    for (const line of failed) console.error(`bench check: ${line}`);
    console.log(`bench check: ${sections.length} sections ran, ${failed.length} with failed calls`);
    if (failed.length > 0) process.exitCode = 1;
    return;
  }
  const stamp = machine.date.slice(0, 10);
  mkdirSync(RESULTS, { recursive: true });
  const name = `${stamp}${quick ? '-quick' : ''}${only ? `-${only.join('-')}` : ''}`;
  const render = (all: Section[], date: string) =>
    [
      `## Benchmarks (${date})`,
      '',
      `Machine: ${machine.cpus} cores (${machine.cpuModel}), ${machine.memoryGiB} GiB, ${machine.platform}; Node ${machine.node}, SQLite ${machine.sqlite}, PostgreSQL ${machine.postgres}. Each figure is the median of several runs${quick ? ' (quick mode: small sizes, single runs)' : ''}; ratios compare with a raw-driver baseline measured in the same run.`,
      '',
      ...all.flatMap((s) => [
        `### ${s.title}${s.measuredAt && s.measuredAt !== date ? ` (measured ${s.measuredAt})` : ''}`,
        '',
        s.table,
        '',
      ]),
    ].join('\n');
  const md = render(sections, stamp);
  writeFileSync(
    `${RESULTS}${name}.json`,
    JSON.stringify({ machine, quick, sections: Object.fromEntries(sections.map((s) => [s.title, s.data])) }, null, 2) +
      '\n',
  );
  writeFileSync(`${RESULTS}${name}.md`, md + '\n');
  if (!quick) {
    // latest.json keeps every section's newest full-size result, so `--only=…` reruns merge in.
    const latestPath = `${RESULTS}latest.json`;
    const previous: Section[] = existsSync(latestPath) ? JSON.parse(readFileSync(latestPath, 'utf8')).sections : [];
    const merged = [
      ...previous.filter((p) => !sections.some((s) => s.title === p.title)),
      ...sections.map((s) => ({ ...s, measuredAt: stamp })),
    ];
    const order = [
      'Floor',
      'Overhead',
      'Contention',
      'Path-lease',
      'Releasing one grant',
      'Wake-ups',
      'Inbox',
      'Leased delivery',
      'Idempotency key',
      'Lifecycle',
      'Peer',
      'Migrations',
    ];
    merged.sort(
      (a, b) => order.findIndex((o) => a.title.startsWith(o)) - order.findIndex((o) => b.title.startsWith(o)),
    );
    writeFileSync(latestPath, JSON.stringify({ machine, sections: merged }, null, 2) + '\n');
    writeFileSync(`${RESULTS}latest.md`, render(merged, stamp) + '\n');
  }
  console.log(md);
}

/** Every row of every section that counted failed calls (`errors` > 0), described in one line. */
function failedRows(sections: readonly Section[]): string[] {
  const failed: string[] = [];
  const visit = (value: unknown, title: string): void => {
    if (Array.isArray(value)) for (const item of value) visit(item, title);
    else if (value !== null && typeof value === 'object') {
      const row = value as Record<string, unknown>;
      if (typeof row.errors === 'number' && row.errors > 0) failed.push(`${title}: ${JSON.stringify(row)}`);
      for (const [key, child] of Object.entries(row)) if (key !== 'errors') visit(child, title);
    }
  };
  for (const section of sections) visit(section.data, section.title);
  return failed;
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
