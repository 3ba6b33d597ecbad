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
    const store: Store = await fx.freshStore({ clock, onEvent: (e) => seen.push(e) });
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
