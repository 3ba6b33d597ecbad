/**
 * Failover under load (issue 25, item 3). Worker processes claim and release workspace locks and
 * path leases, start runs, send and deliver messages on a store opened on the cluster's host list
 * (`target_session_attrs=read-write`), while the primary's postmaster is killed with SIGKILL and
 * Patroni promotes the standby. With synchronous replication every promise must hold; with
 * asynchronous replication the test shows what is lost, and that doctor warned beforehand.
 */
import { fork, type ChildProcess } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openStore, type DoctorCheck } from '../../src/index.js';
import { analyse, readServerState, type Failover, type Findings } from './analysis.js';
import { PatroniCluster, type Node } from './cluster.js';
import type { Setup, WorkerReport } from './worker.js';
import { compiledPath } from '../support/compiled.js';

const WORKER = new URL('./worker.ts', import.meta.url).href;
const WORKERS = 4;
const KILLS = 3;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

let cluster: PatroniCluster;
const setup: Setup = {
  lockWorkspaces: ['ws-lock-0', 'ws-lock-1'],
  pathWorkspace: 'ws-paths',
  inboxes: ['inbox-0', 'inbox-1'],
};
const figures: Record<string, unknown> = {};

beforeAll(async () => {
  cluster = await PatroniCluster.start({ synchronous: true });
  const store = await openStore({ url: cluster.url() });
  try {
    await store.migrate();
    const company = await store.org.createCompany({ id: 'c-failover', name: 'Failover Inc' });
    for (const id of [...setup.lockWorkspaces, setup.pathWorkspace]) {
      await store.org.createWorkspace({ id, companyId: company.id, name: id });
    }
  } finally {
    await store.close();
  }
});

afterAll(async () => {
  await cluster?.stop();
  mkdirSync('.tmp', { recursive: true });
  writeFileSync('.tmp/failover-figures.json', `${JSON.stringify(figures, null, 2)}\n`);
});

async function replicationCheck(): Promise<DoctorCheck> {
  const store = await openStore({ url: cluster.url() });
  try {
    const report = await store.doctor();
    return report.checks.find((c) => c.id === 'environment.replication')!;
  } finally {
    await store.close();
  }
}

interface Workers {
  readonly children: ChildProcess[];
  /** Exits before the test asked for them: must stay empty. */
  readonly earlyExits: string[];
  stop(): Promise<{ reports: WorkerReport[]; exitCodes: (number | null)[] }>;
}

async function startWorkers(phase: string): Promise<Workers> {
  const earlyExits: string[] = [];
  let stopping = false;
  const children = Array.from({ length: WORKERS }, (_, i) =>
    fork(compiledPath(WORKER), [], {
      execArgv: [],
      env: {
        ...process.env,
        FAILOVER_URL: cluster.url(),
        FAILOVER_WORKER_INDEX: `${phase}${i}`,
        FAILOVER_SETUP: JSON.stringify(setup),
      },
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    }),
  );
  const messages = children.map(
    (child, i) =>
      new Promise<WorkerReport>((resolve, reject) => {
        child.on('message', (m: { type: string; report?: WorkerReport; message?: string }) => {
          if (m.type === 'report') resolve(m.report!);
          if (m.type === 'fatal') reject(new Error(`worker ${i}: ${m.message}`));
        });
        child.on('exit', (code, signal) => {
          if (!stopping) earlyExits.push(`worker ${i} exited (${code ?? signal})`);
          reject(new Error(`worker ${i} exited (${code ?? signal}) before reporting`));
        });
      }),
  );
  await Promise.all(
    children.map(
      (child) =>
        new Promise<void>((resolve, reject) => {
          child.on('message', (m: { type: string }) => m.type === 'ready' && resolve());
          child.on('exit', () => reject(new Error('a worker exited before it was ready')));
        }),
    ),
  );
  return {
    children,
    earlyExits,
    async stop() {
      for (const child of children) child.send({ type: 'stop' });
      const reports = await Promise.all(messages);
      stopping = true;
      const exited = children.map(
        (child) => new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code))),
      );
      for (const child of children) child.send({ type: 'exit' });
      return { reports, exitCodes: await Promise.all(exited) };
    },
  };
}

/** Waits until Patroni lists a primary other than `old`; returns when. */
async function waitForPromotion(old: Node): Promise<number> {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    const primary = cluster.primaryNode(await cluster.members());
    if (primary && primary.name !== old.name) return Date.now();
    await sleep(50);
  }
  throw new Error(`no promotion within 60 s\n${cluster.logTail()}`);
}

async function findingsAfter(workers: Workers, failovers: Failover[]) {
  const { reports, exitCodes } = await workers.stop();
  const end = Date.now();
  const primary = (await cluster.currentPrimary())!;
  const client = cluster.client(primary);
  await client.connect();
  try {
    const state = await readServerState(client, reports);
    return { findings: analyse(reports, state, failovers, end), reports, exitCodes };
  } finally {
    await client.end();
  }
}

function countBy(keys: readonly string[]): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const k of keys) counts[k] = (counts[k] ?? 0) + 1;
  return counts;
}

function summary(findings: Findings, reports: readonly WorkerReport[]) {
  const codes: Record<string, number> = {};
  for (const s of findings.switches)
    for (const [k, v] of Object.entries(s.failedByCode)) codes[k] = (codes[k] ?? 0) + v;
  return {
    rounds: reports.reduce((n, r) => n + r.rounds, 0),
    ackedWrites: findings.ackedWrites,
    lost: findings.lost.length,
    lostByKind: countBy(findings.lost.map((l) => l.split(' ')[0]!)),
    tokenRegressions: findings.tokenRegressions.length,
    overlaps: findings.overlaps.length,
    doubleDeliveries: findings.doubleDeliveries.length,
    failedAttempts: findings.failedAttempts,
    failedByCode: codes,
    untyped: findings.untyped.length,
    rawReadOnly: findings.rawReadOnly,
    unknownOutcomes: reports.reduce((n, r) => n + r.unknownOutcomes, 0),
    switches: findings.switches.map((s) => ({ promotionMs: s.promotionMs, firstAckMs: s.firstAckMs })),
    examples: {
      lost: findings.lost.slice(0, 5),
      tokenRegressions: findings.tokenRegressions.slice(0, 3),
      overlaps: findings.overlaps.slice(0, 3),
      doubleDeliveries: findings.doubleDeliveries.slice(0, 3),
      untyped: findings.untyped.slice(0, 3),
    },
  };
}

describe('failover under load', () => {
  it(`with synchronous replication, ${KILLS} SIGKILLs of the primary each promote the standby and every promise holds`, async () => {
    const replication = await replicationCheck();
    expect(replication, JSON.stringify(replication)).toMatchObject({ status: 'pass' });

    const workers = await startWorkers('s');
    const failovers: Failover[] = [];
    for (let i = 0; i < KILLS; i++) {
      await sleep(2_500);
      const primary = (await cluster.currentPrimary())!;
      const killedAt = cluster.killPostmaster(primary);
      const promotedAt = await waitForPromotion(primary);
      // The next kill only once the old primary is back as the synchronous standby and caught up:
      // Patroni promotes only a synchronous standby, and until it is back, commits are not waited for.
      await cluster.waitHealthy(120_000);
      failovers.push({ killedAt, promotedAt, healthyAt: Date.now() });
    }
    await sleep(2_000);
    const { findings, reports, exitCodes } = await findingsAfter(workers, failovers);
    figures.synchronous = summary(findings, reports);
    console.log('synchronous replication:', JSON.stringify(figures.synchronous, null, 2));

    expect(workers.earlyExits).toEqual([]);
    expect(exitCodes).toEqual(reports.map(() => 0));
    // Work happened across every switch, and the store found the new primary by itself each time.
    for (const s of findings.switches) expect(s.firstAckMs).not.toBeNull();
    expect(findings.ackedWrites).toBeGreaterThan(100);
    expect(findings.lost).toEqual([]);
    expect(findings.tokenRegressions).toEqual([]);
    expect(findings.overlaps).toEqual([]);
    expect(findings.doubleDeliveries).toEqual([]);
    expect(findings.untyped).toEqual([]);
    expect(findings.rawReadOnly).toBe(0);
  });

  it('with asynchronous replication, a failover loses acknowledged writes, and doctor warned beforehand', async () => {
    await cluster.patchConfig({ synchronous_mode: false });
    cluster.synchronous = false;
    // Doctor warns once Patroni has turned synchronous replication off on the primary.
    let replication = await replicationCheck();
    for (let i = 0; i < 100 && replication.status === 'pass'; i++) {
      await sleep(200);
      replication = await replicationCheck();
    }
    expect(replication.status, JSON.stringify(replication)).toBe('warn');
    expect(replication.detail).toContain('fencing can break on failover');
    figures.asynchronousDoctor = replication;

    const workers = await startWorkers('a');
    await sleep(3_000);
    const primary = (await cluster.currentPrimary())!;
    // The standby falls behind, as it does on a slow network or under load: the primary's WAL
    // sender is stopped for 1.5 s while the workers' commits are acknowledged, then the primary dies.
    const admin = cluster.client(primary, 'postgres');
    await admin.connect();
    const senders = (await admin.query<{ pid: number }>('select pid from pg_stat_replication')).rows.map((r) => r.pid);
    await admin.end();
    expect(senders.length).toBeGreaterThan(0);
    for (const pid of senders) process.kill(pid, 'SIGSTOP');
    const lagFrom = Date.now();
    await sleep(1_500);
    const killedAt = cluster.killPostmaster(primary);
    for (const pid of senders) process.kill(pid, 'SIGKILL');
    const promotedAt = await waitForPromotion(primary);
    await cluster.waitHealthy(120_000);
    await sleep(2_000);
    const { findings, reports, exitCodes } = await findingsAfter(workers, [
      { killedAt, promotedAt, healthyAt: Date.now() },
    ]);
    const ackedInLagWindow = reports
      .flatMap((r) => [...r.locks.map((c) => c.ackAt), ...r.runs.map((x) => x.ackAt), ...r.sent.map((m) => m.ackAt)])
      .filter((at) => at >= lagFrom && at < killedAt).length;
    figures.asynchronous = { ...summary(findings, reports), ackedWhileStandbyBehind: ackedInLagWindow };
    console.log('asynchronous replication:', JSON.stringify(figures.asynchronous, null, 2));

    expect(workers.earlyExits).toEqual([]);
    expect(exitCodes).toEqual(reports.map(() => 0));
    expect(ackedInLagWindow).toBeGreaterThan(0);
    // What asynchronous replication costs: writes the workers were told had committed are gone.
    expect(findings.lost.length).toBeGreaterThan(0);
    // Even so, every failure the callers saw was typed (a read-only server's refusal as READ_ONLY).
    expect(findings.untyped).toEqual([]);
    expect(findings.rawReadOnly).toBe(0);
  });
});
