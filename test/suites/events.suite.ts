import diagnostics_channel from 'node:diagnostics_channel';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { TASKFENCE_CHANNELS, type Store, type TaskfenceEvent } from '../../src/index.js';
import type { DialectFixture } from '../support/fixtures.js';
import { holdWriteLock } from '../support/hold-write-lock.js';
import { FaultProxy } from '../support/tcp-proxy.js';

class FakeClock {
  constructor(public t: number) {}
  now() {
    return this.t;
  }
}

/** Events on node:diagnostics_channel and `onEvent`, and `store.stats()` counters. */
export function defineEventsSuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  const published: TaskfenceEvent[] = [];
  const listener = (event: unknown) => published.push(event as TaskfenceEvent);
  beforeAll(() => {
    fx = makeFixture();
    for (const name of Object.values(TASKFENCE_CHANNELS)) diagnostics_channel.subscribe(name, listener);
  });
  afterAll(async () => {
    for (const name of Object.values(TASKFENCE_CHANNELS)) diagnostics_channel.unsubscribe(name, listener);
    await fx.cleanup();
  });

  it('reports conflicts, refused stale tokens, lost leases, reconciled runs, migration steps and prunes, on the channels and to onEvent, and counts them', async () => {
    published.length = 0;
    const seen: TaskfenceEvent[] = [];
    const clock = new FakeClock(1_000_000);
    // Migrated here, not by freshStore (which may clone a migrated database): its steps are events too.
    const store: Store = await fx.open(await fx.freshUrl(), { clock, onEvent: (e) => seen.push(e) });
    await store.migrate();
    expect(seen.filter((e) => e.type === 'migration').length).toBeGreaterThan(0);
    const company = await store.org.createCompany({ name: 'Events' });
    const ws = await store.org.createWorkspace({ companyId: company.id, name: 'ws' });
    const run = await store.runs.startCoordinatorRun({ targetKey: 'worktree:events' });

    const first = await store.locks.claimWorkspaceLock(ws.id, { holder: 'a', runId: run.id, ttlMs: 1_000 });
    if (first.status !== 'acquired') throw new Error('not claimed');
    expect((await store.locks.claimWorkspaceLock(ws.id, { holder: 'b', runId: run.id, ttlMs: 1_000 })).status).toBe(
      'busy',
    );
    clock.t += 5_000; // a's lock expired; b takes it
    const second = await store.locks.claimWorkspaceLock(ws.id, { holder: 'b', runId: run.id, ttlMs: 1_000 });
    if (second.status !== 'acquired') throw new Error('not claimed');
    await expect(
      store.locks.renewWorkspaceLock(ws.id, { token: first.lease.token, ttlMs: 1_000 }),
    ).rejects.toMatchObject({
      code: 'STALE_WORKSPACE_LOCK',
    });
    await expect(store.locks.releaseWorkspaceLock(ws.id, { token: first.lease.token })).rejects.toMatchObject({
      code: 'STALE_WORKSPACE_LOCK',
    });
    await expect(store.runs.startCoordinatorRun({ targetKey: 'worktree:events' })).rejects.toMatchObject({
      code: 'COORDINATOR_RUN_CONFLICT',
    });
    clock.t += 60_000;
    const reconciled = await store.runs.reconcileStaleRuns({ staleAfterMs: 30_000 });
    expect(reconciled.map((r) => r.id)).toEqual([run.id]);
    await store.maintenance.prune({ olderThanMs: 0, dryRun: true });

    const types = (events: TaskfenceEvent[]) => events.filter((e) => e.type !== 'migration').map((e) => e.type);
    expect(types(seen)).toEqual(['conflict', 'lease.lost', 'refused', 'conflict', 'run.reconciled', 'prune']);
    expect(seen.find((e) => e.type === 'lease.lost')).toMatchObject({
      operation: 'locks.renewWorkspaceLock',
      code: 'STALE_WORKSPACE_LOCK',
    });
    expect(seen.find((e) => e.type === 'run.reconciled')).toMatchObject({
      runId: run.id,
      targetKey: 'worktree:events',
    });
    // The channels carry the same events.
    expect(types(published)).toEqual(types(seen));
    const stats = store.stats();
    expect(stats).toMatchObject({ conflicts: 2, refusals: 1, leasesLost: 1, runsReconciled: 1 });
    expect(stats.transactions).toBeGreaterThan(5);
    if (fx.kind === 'postgres')
      expect(stats.pool).toMatchObject({ total: expect.any(Number), idle: expect.any(Number), waiting: 0 });
    else expect(stats.pool).toBeNull();
  });

  it("reports and counts calls made through store.transaction and store.withTransaction like the store's own", async () => {
    published.length = 0;
    const seen: TaskfenceEvent[] = [];
    const clock = new FakeClock(1_000_000);
    const store: Store = await fx.freshStore({ clock, onEvent: (e) => seen.push(e) });
    const company = await store.org.createCompany({ name: 'Events in transactions' });
    const ws = await store.org.createWorkspace({ companyId: company.id, name: 'ws' });
    const run = await store.runs.startCoordinatorRun({ targetKey: 'worktree:tx-events' });
    const before = seen.length;

    // store.transaction: a busy claim (conflict), a refused start (conflict, caught), a stale renewal (lease lost).
    const stale = await store.transaction(async (tx) => {
      const first = await tx.locks.claimWorkspaceLock(ws.id, { holder: 'a', runId: run.id, ttlMs: 1_000 });
      if (first.status !== 'acquired') throw new Error('not claimed');
      expect((await tx.locks.claimWorkspaceLock(ws.id, { holder: 'b', runId: run.id, ttlMs: 1_000 })).status).toBe(
        'busy',
      );
      await expect(tx.runs.startCoordinatorRun({ targetKey: 'worktree:tx-events' })).rejects.toMatchObject({
        code: 'COORDINATOR_RUN_CONFLICT',
      });
      return first.lease.token;
    });
    clock.t += 5_000;
    // store.withTransaction on a transaction the host opened: b takes the expired lock, a's renewal is refused.
    await store.db.transaction().execute(async (trx) => {
      const tx = store.withTransaction(trx);
      expect((await tx.locks.claimWorkspaceLock(ws.id, { holder: 'b', runId: run.id, ttlMs: 1_000 })).status).toBe(
        'acquired',
      );
      await expect(tx.locks.renewWorkspaceLock(ws.id, { token: stale, ttlMs: 1_000 })).rejects.toMatchObject({
        code: 'STALE_WORKSPACE_LOCK',
      });
      await expect(tx.locks.releaseWorkspaceLock(ws.id, { token: stale })).rejects.toMatchObject({
        code: 'STALE_WORKSPACE_LOCK',
      });
    });

    const reported = seen.slice(before);
    expect(reported.map((e) => [e.type, 'operation' in e ? e.operation : null])).toEqual([
      ['conflict', 'locks.claimWorkspaceLock'],
      ['conflict', 'runs.startCoordinatorRun'],
      ['lease.lost', 'locks.renewWorkspaceLock'],
      ['refused', 'locks.releaseWorkspaceLock'],
    ]);
    expect(published.filter((e) => e.type !== 'migration')).toEqual(reported);
    expect(store.stats()).toMatchObject({ conflicts: 2, refusals: 1, leasesLost: 1 });
  });

  it("reports every area's declared outcomes: scheduler, paths, semaphores, dispatches, gates, cleanup claims", async () => {
    const seen: TaskfenceEvent[] = [];
    const clock = new FakeClock(1_000_000);
    const store: Store = await fx.freshStore({ clock, onEvent: (e) => seen.push(e) });
    const company = await store.org.createCompany({ name: 'Every area' });
    const ws = await store.org.createWorkspace({ companyId: company.id, name: 'ws' });
    const agent = await store.org.createAgent({
      companyId: company.id,
      name: 'dev',
      role: 'engineer',
      workspaceId: ws.id,
    });
    const codingTask = () =>
      store.tasks.createTask({
        companyId: company.id,
        title: 'code',
        assigneeAgentId: agent.id,
        requiresFilesystem: true,
      });
    const marks: number[] = [];
    const mark = () => marks.push(seen.length);
    const since = (i: number) =>
      seen
        .slice(marks[i], marks[i + 1])
        .filter((e) => e.type !== 'migration')
        .map((e) => [e.type, 'operation' in e ? e.operation : null, 'code' in e ? e.code : null]);

    // 0 scheduler.dispatchRun: the workspace is held (cancelled), the task is held (skipped), a done task is refused.
    mark();
    const t1 = await codingTask();
    const t2 = await codingTask();
    expect(
      await store.scheduler.dispatchRun({ taskId: t1.id, agentId: agent.id, runId: 'r1', mode: 'heartbeat' }),
    ).toMatchObject({ outcome: 'dispatched' });
    expect(
      await store.scheduler.dispatchRun({ taskId: t2.id, agentId: agent.id, runId: 'r2', mode: 'heartbeat' }),
    ).toMatchObject({ outcome: 'cancelled', reason: 'workspace_busy' });
    expect(
      await store.scheduler.dispatchRun({ taskId: t1.id, agentId: agent.id, runId: 'r3', mode: 'heartbeat' }),
    ).toMatchObject({ outcome: 'skipped', reason: 'task_leased' });
    const done = await store.tasks.createTask({
      companyId: company.id,
      title: 'over',
      requiresFilesystem: false,
      status: 'ready',
    });
    await store.tasks.transitionTask(done.id, { from: 'ready', to: 'cancelled' });
    await expect(
      store.scheduler.dispatchRun({ taskId: done.id, agentId: agent.id, runId: 'r4', mode: 'heartbeat' }),
    ).rejects.toMatchObject({ code: 'TASK_NOT_DISPATCHABLE' });
    clock.t += 10 * 60_000; // every dispatched lease lapses

    // 1 paths: a busy claim, a lost renewal, a refused release of a never-granted token.
    mark();
    const pws = await store.org.createWorkspace({ companyId: company.id, name: 'paths' });
    const a = await store.paths.tryAcquirePaths({ workspaceId: pws.id, holder: 'a', paths: ['src'], ttlMs: 1_000 });
    if (a.status !== 'acquired') throw new Error('not acquired');
    expect(
      (await store.paths.tryAcquirePaths({ workspaceId: pws.id, holder: 'b', paths: ['src/x'], ttlMs: 1_000 })).status,
    ).toBe('busy');
    clock.t += 5_000;
    await expect(store.paths.renewPaths(a.lease, { ttlMs: 1_000 })).rejects.toMatchObject({ code: 'PATH_LEASE_LOST' });
    await expect(store.paths.releasePaths({ ...a.lease, token: a.lease.token + 9 })).rejects.toMatchObject({
      code: 'PATH_LEASE_LOST',
      reason: 'never_granted',
    });

    // 2 semaphores: busy, a timed-out wait, a lost renewal, a refused release.
    mark();
    const s1 = await store.semaphores.acquire('gpu', { holder: 'a', limit: 1, ttlMs: 1_000 });
    if (s1.status !== 'acquired') throw new Error('not acquired');
    expect((await store.semaphores.acquire('gpu', { holder: 'b', limit: 1, ttlMs: 1_000 })).status).toBe('busy');
    await expect(
      store.semaphores.acquireWait('gpu', { holder: 'b', limit: 1, ttlMs: 1_000 }, { timeoutMs: 1 }),
    ).rejects.toMatchObject({ code: 'SEMAPHORE_TIMEOUT' });
    clock.t += 5_000;
    await expect(store.semaphores.renew(s1.lease)).rejects.toMatchObject({ code: 'SEMAPHORE_LEASE_LOST' });
    await expect(store.semaphores.release({ ...s1.lease, token: s1.lease.token + 9 })).rejects.toMatchObject({
      code: 'SEMAPHORE_LEASE_LOST',
    });

    // 3 dispatches and gates: a second dispatch of a task, a heartbeat after the reclaim, a gate resolved twice.
    mark();
    const targetKey = 'worktree:every-area';
    const run = await store.runs.startCoordinatorRun({ targetKey });
    const ready = await store.tasks.createTask({
      companyId: company.id,
      title: 'go',
      targetKey,
      requiresFilesystem: false,
      status: 'ready',
    });
    const dispatch = await store.dispatches.createDispatch({
      taskId: ready.id,
      terminalHandle: 'term-1',
      ttlMs: 1_000,
    });
    await expect(store.dispatches.createDispatch({ taskId: ready.id, terminalHandle: 'term-2' })).rejects.toMatchObject(
      { code: expect.stringMatching(/^(DISPATCH_ALREADY_ACTIVE|TASK_NOT_DISPATCHABLE)$/) },
    );
    clock.t += 5_000;
    expect(await store.dispatches.reclaimExpiredDispatches({ runId: run.id })).toHaveLength(1);
    await expect(store.dispatches.heartbeatDispatch(dispatch.lease!)).rejects.toMatchObject({
      code: 'DISPATCH_LEASE_LOST',
    });
    const gated = await store.tasks.createTask({
      companyId: company.id,
      title: 'ask',
      targetKey,
      requiresFilesystem: false,
    });
    const gate = await store.gates.openGate({ question: 'go?', taskId: gated.id });
    await store.gates.resolveGate(gate.id, 'yes');
    await expect(store.gates.resolveGate(gate.id, 'no')).rejects.toMatchObject({ code: 'GATE_ALREADY_RESOLVED' });

    // 4 cleanup claims: a busy claim, a lost renewal.
    mark();
    const doomed = await store.tasks.createTask({ companyId: company.id, title: 'doomed', requiresFilesystem: true });
    await store.ownership.createEnvironment({ ownerTaskId: doomed.id, rootPath: '/w/doomed' });
    const admission = await store.ownership.admitTaskCleanup(doomed.id, 'delete');
    const snapshot = admission.snapshots[0]!.id;
    const held = await store.ownership.claimCleanup(snapshot, 'w1', { ttlMs: 1_000 });
    expect((await store.ownership.tryClaimCleanup(snapshot, 'w2', { ttlMs: 1_000 })).status).toBe('busy');
    clock.t += 5_000;
    await store.ownership.claimCleanup(snapshot, 'w2', { ttlMs: 1_000 });
    await expect(store.ownership.renewCleanupClaim(held)).rejects.toMatchObject({ code: 'CLEANUP_CLAIM_LOST' });
    mark();

    expect(since(0)).toEqual([
      ['conflict', 'scheduler.dispatchRun', null],
      ['conflict', 'scheduler.dispatchRun', null],
      ['conflict', 'scheduler.dispatchRun', 'TASK_NOT_DISPATCHABLE'],
    ]);
    expect(since(1)).toEqual([
      ['conflict', 'paths.tryAcquirePaths', null],
      ['lease.lost', 'paths.renewPaths', 'PATH_LEASE_LOST'],
      ['refused', 'paths.releasePaths', 'PATH_LEASE_LOST'],
    ]);
    expect(since(2)).toEqual([
      ['conflict', 'semaphores.acquire', null],
      ['conflict', 'semaphores.acquireWait', 'SEMAPHORE_TIMEOUT'],
      ['lease.lost', 'semaphores.renew', 'SEMAPHORE_LEASE_LOST'],
      ['refused', 'semaphores.release', 'SEMAPHORE_LEASE_LOST'],
    ]);
    expect(since(3)).toEqual([
      ['conflict', 'dispatches.createDispatch', expect.any(String)],
      ['lease.lost', 'dispatches.heartbeatDispatch', 'DISPATCH_LEASE_LOST'],
      ['conflict', 'gates.resolveGate', 'GATE_ALREADY_RESOLVED'],
    ]);
    expect(since(4)).toEqual([
      ['conflict', 'ownership.tryClaimCleanup', null],
      ['lease.lost', 'ownership.renewCleanupClaim', 'CLEANUP_CLAIM_LOST'],
    ]);
  });

  it('reports the calls of a retried store.transaction callback once per attempt', async () => {
    const seen: TaskfenceEvent[] = [];
    const store: Store = await fx.freshStore({ onEvent: (e) => seen.push(e) });
    const company = await store.org.createCompany({ name: 'Retried callback' });
    const ws = await store.org.createWorkspace({ companyId: company.id, name: 'ws' });
    const run = await store.runs.startCoordinatorRun({ targetKey: 'worktree:retried' });
    await store.locks.claimWorkspaceLock(ws.id, { holder: 'a', runId: run.id, ttlMs: 60_000 });
    const transient = Object.assign(new Error('simulated transient failure'), {
      code: fx.kind === 'sqlite' ? 'SQLITE_BUSY' : '40001',
    });
    const before = store.stats();
    let attempts = 0;
    await store.transaction(async (tx) => {
      attempts++;
      expect((await tx.locks.claimWorkspaceLock(ws.id, { holder: 'b', runId: run.id, ttlMs: 1_000 })).status).toBe(
        'busy',
      );
      if (attempts === 1) throw transient;
    });
    expect(attempts).toBe(2);
    expect(seen.filter((e) => e.type !== 'migration').map((e) => e.type)).toEqual([
      'conflict',
      'transaction.retry',
      'conflict',
    ]);
    const after = store.stats();
    expect(after.conflicts - before.conflicts).toBe(2);
    expect(after.transactions - before.transactions).toBe(2);
  });

  it('reports every retry of a write transaction with its kind and attempt', async () => {
    const seen: TaskfenceEvent[] = [];
    if (fx.kind === 'sqlite') {
      const url = await fx.freshUrl();
      const holder = await fx.open(url);
      await holder.migrate();
      const store = await fx.open(url, { busyTimeoutMs: 10, onEvent: (e) => seen.push(e) });
      const lock = await holdWriteLock(holder, async () => {});
      const writing = store.org.createCompany({ name: 'after the holder' });
      await new Promise((resolve) => setTimeout(resolve, 100));
      await lock.release();
      await writing;
      expect(
        seen
          .filter((e) => e.type === 'transaction.retry')
          .every((e) => e.type === 'transaction.retry' && e.kind === 'busy'),
      ).toBe(true);
    } else {
      const direct = await fx.freshUrl();
      await (await fx.open(direct)).migrate();
      const u = new URL(direct);
      const proxy = await FaultProxy.start({ host: u.hostname, port: Number(u.port || 5432) });
      try {
        const store = await fx.open(proxy.urlThrough(direct), { onEvent: (e) => seen.push(e) });
        proxy.cutBeforeNext('insert into "companies"', 2);
        await store.org.createCompany({ name: 'after two cuts' });
        expect(seen.filter((e) => e.type === 'transaction.retry')).toEqual([
          expect.objectContaining({ kind: 'connection_lost', attempt: 1 }),
          expect.objectContaining({ kind: 'connection_lost', attempt: 2 }),
        ]);
        expect(store.stats().retries).toEqual({ connection_lost: 2 });
      } finally {
        await proxy.close();
      }
    }
    expect(seen.some((e) => e.type === 'transaction.retry')).toBe(true);
  });
}
