/**
 * The audit trail of lease acts (issue 26 item 3) on one dialect: who was granted, renewed, lost
 * or released which lease, and which transfer moved which resource, each row written in the
 * transaction of its act; `audit.leases` picks what is recorded; `prune` removes old rows.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { sql } from 'kysely';
import { InvalidArgumentError, type Clock, type Store } from '../../src/index.js';
import { readAuditTrail, type AuditEvent } from '../../src/inspect/audit.js';
import type { DialectFixture } from '../support/fixtures.js';
import { tbl } from '../support/schema.js';

class ManualClock implements Clock {
  constructor(public t = 7_000_000) {}
  now(): number {
    return this.t;
  }
}

const RANK = ['lease.granted', 'lease.lost', 'lease.renewed', 'lease.released'];

/** The trail of one subject, oldest first (a grant before the loss it recorded at the same time). */
async function trailOf(store: Store, subjectKind: string, subjectId: string): Promise<AuditEvent[]> {
  return (await readAuditTrail(store, { subjectKind, subjectId })).sort(
    (a, b) => a.at - b.at || RANK.indexOf(a.action) - RANK.indexOf(b.action),
  );
}

const brief = (events: readonly AuditEvent[]) => events.map((e) => [e.action, e.actor, e.token]);

export function defineAuditTrailSuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  let clock: ManualClock;
  let all: Store;
  let grants: Store;
  let off: Store;
  let byDefault: Store;
  let n = 0;

  beforeAll(async () => {
    fx = makeFixture();
    clock = new ManualClock();
    // Three stores on one database, one per mode: the rows each writes tell the modes apart.
    all = await fx.freshStore({ clock, audit: { leases: 'all' } });
    const url = await urlOf(all);
    grants = await fx.open(url, { clock, audit: { leases: 'grants' } });
    off = await fx.open(url, { clock, audit: { leases: 'off' } });
    byDefault = await fx.open(url, { clock });
  });
  afterAll(() => fx.cleanup());

  async function urlOf(store: Store): Promise<string> {
    return store.location.url;
  }

  async function workspace(store: Store) {
    const id = `au${++n}`;
    const company = await store.org.createCompany({ id: `${id}-co`, name: 'Acme' });
    const ws = await store.org.createWorkspace({ id: `${id}-ws`, companyId: company.id, name: 'main' });
    return { company, ws };
  }

  async function task(store: Store) {
    const { company } = await workspace(store);
    return (await store.tasks.createTask({ companyId: company.id, title: 'lease me', requiresFilesystem: false })).id;
  }

  it('records a grant, a renewal and a release with holder, token and time (audit.leases: all)', async () => {
    const { ws } = await workspace(all);
    const t0 = clock.t;
    const claim = await all.locks.claimWorkspaceLock(ws.id, { holder: 'w1', runId: 'run-1', ttlMs: 1000 });
    if (claim.status !== 'acquired') throw new Error('expected a grant');
    clock.t += 10;
    const renewed = await all.locks.renewWorkspaceLock(claim.lease, { ttlMs: 2000 });
    clock.t += 10;
    await all.locks.releaseWorkspaceLock(renewed);
    const trail = await trailOf(all, 'workspace_lock', ws.id);
    expect(trail.map((e) => [e.action, e.actor, e.token, e.at])).toEqual([
      ['lease.granted', 'w1', 1, t0],
      ['lease.renewed', 'w1', 1, t0 + 10],
      ['lease.released', 'w1', 1, t0 + 20],
    ]);
    expect(trail[0]!.detail).toEqual({ runId: 'run-1', expiresAt: t0 + 1000 });
    expect(trail[1]!.detail).toMatchObject({ expiresAt: t0 + 10 + 2000 });
  });

  it('records a loss at the grant that takes a lapsed lease over, naming the previous holder and token', async () => {
    const id = await task(all);
    const first = await all.locks.claimTaskLease(id, { holder: 'crashed', ttlMs: 100 });
    if (first.status !== 'acquired') throw new Error('expected a grant');
    clock.t += 101;
    const second = await all.locks.claimTaskLease(id, { holder: 'next', ttlMs: 100 });
    if (second.status !== 'acquired') throw new Error('expected a takeover');
    const trail = await trailOf(all, 'task_lease', id);
    expect(brief(trail)).toEqual([
      ['lease.granted', 'crashed', 1],
      ['lease.granted', 'next', 2],
      ['lease.lost', 'crashed', 1],
    ]);
    expect(trail[2]).toMatchObject({
      at: clock.t,
      detail: { reason: 'superseded', expiresAt: first.lease.expiresAt, by: { holder: 'next', token: 2 } },
    });
    // The refused release of the lost lease rolls back, and with it anything it would record.
    await expect(all.locks.releaseTaskLease(first.lease)).rejects.toMatchObject({ code: 'STALE_TASK_LEASE' });
    expect(await trailOf(all, 'task_lease', id)).toHaveLength(3);
  });

  it('records semaphore, path-lease and dispatch acts in the same vocabulary', async () => {
    const name = `sem-${++n}`;
    const a = await all.semaphores.acquire(name, { holder: 'a', limit: 1, ttlMs: 100 });
    if (a.status !== 'acquired') throw new Error('expected a grant');
    clock.t += 101;
    const b = await all.semaphores.acquire(name, { holder: 'b', limit: 1, ttlMs: 100 });
    if (b.status !== 'acquired') throw new Error('expected a grant');
    clock.t += 1;
    await all.semaphores.release(b.lease);
    expect(brief(await trailOf(all, 'semaphore', name))).toEqual([
      ['lease.granted', 'a', 1],
      ['lease.granted', 'b', 2],
      ['lease.lost', 'a', 1],
      ['lease.released', 'b', 2],
    ]);

    const { ws } = await workspace(all);
    const p = await all.paths.tryAcquirePaths({ workspaceId: ws.id, holder: 'p1', paths: ['src/a'], ttlMs: 100 });
    if (p.status !== 'acquired') throw new Error('expected a grant');
    clock.t += 1;
    const renewed = await all.paths.renewPaths(p.lease, { ttlMs: 100 });
    clock.t += 101;
    const q = await all.paths.tryAcquirePaths({ workspaceId: ws.id, holder: 'p2', paths: ['src/a'], ttlMs: 100 });
    if (q.status !== 'acquired') throw new Error('expected a takeover');
    clock.t += 1;
    await all.paths.releasePaths(q.lease);
    const paths = await trailOf(all, 'path_lease', ws.id);
    expect(brief(paths)).toEqual([
      ['lease.granted', 'p1', 1],
      ['lease.renewed', 'p1', 1],
      ['lease.granted', 'p2', 2],
      ['lease.lost', 'p1', 1],
      ['lease.released', 'p2', 2],
    ]);
    expect(paths[3]!.detail).toMatchObject({ keys: ['src/a'], expiresAt: renewed.expiresAt });

    const targetKey = `worktree:audit-${n}`;
    const run = await all.runs.startCoordinatorRun({ targetKey });
    const taskId = (
      await all.tasks.createTask({
        companyId: (await workspace(all)).company.id,
        title: 'dispatch me',
        requiresFilesystem: false,
        status: 'ready',
        targetKey,
      })
    ).id;
    const d = await all.dispatches.dispatchNext({ runId: run.id, terminalHandle: `term-${n}`, ttlMs: 100 });
    expect(d?.taskId).toBe(taskId);
    clock.t += 1;
    await all.dispatches.heartbeatDispatch(d!.lease!, { ttlMs: 100 });
    clock.t += 1;
    await all.dispatches.completeDispatch(d!.id, { lease: d!.lease! });
    expect(brief(await trailOf(all, 'dispatch', d!.id))).toEqual([
      ['lease.granted', `term-${n}`, d!.seq],
      ['lease.renewed', `term-${n}`, d!.seq],
      ['lease.released', `term-${n}`, d!.seq],
    ]);
  });

  it('records a coordinator run as a lease: start, heartbeat, stop, and the loss of a stale run at its reconcile', async () => {
    const run = await all.runs.startCoordinatorRun({ targetKey: `worktree:audit-run-${++n}` });
    clock.t += 10;
    await all.runs.heartbeatCoordinatorRun(run.id);
    clock.t += 10;
    await all.runs.stopCoordinatorRun(run.id, 'completed');
    await all.runs.stopCoordinatorRun(run.id, 'completed'); // a repeat stop: a no-op, recorded once
    const h = run.coordinatorHandle;
    const trail = await trailOf(all, 'coordinator_run', run.id);
    expect(brief(trail)).toEqual([
      ['lease.granted', h, 1],
      ['lease.renewed', h, 1],
      ['lease.released', h, 1],
    ]);
    expect(trail[0]!.detail).toMatchObject({ targetKey: run.targetKey, adoptedTaskCount: 0 });
    expect(trail[2]!.detail).toEqual({ status: 'completed' });

    const stale = await grants.runs.startCoordinatorRun({ targetKey: `worktree:audit-run-${++n}` });
    clock.t += 10;
    await grants.runs.heartbeatCoordinatorRun(stale.id); // a renewal: not recorded with 'grants'
    const heartbeatAt = clock.t;
    clock.t += 60_000;
    expect((await grants.runs.reconcileStaleRuns({ staleAfterMs: 30_000 })).map((r) => r.id)).toContain(stale.id);
    const lost = await trailOf(grants, 'coordinator_run', stale.id);
    expect(brief(lost)).toEqual([
      ['lease.granted', stale.coordinatorHandle, 1],
      ['lease.lost', stale.coordinatorHandle, 1],
    ]);
    expect(lost[1]).toMatchObject({
      at: clock.t,
      detail: { heartbeatAt, staleAfterMs: 30_000, by: 'runs.reconcileStaleRuns' },
    });
  });

  it('records cleanup claims: claim, renew, the takeover of a lapsed claim, and its completion', async () => {
    const { company } = await workspace(all);
    const owner = await all.tasks.createTask({ companyId: company.id, title: 'clean me', requiresFilesystem: false });
    await all.ownership.createEnvironment({ ownerTaskId: owner.id, rootPath: `/ws/audit-${n}` });
    const [snapshot] = (await all.ownership.admitTaskCleanup(owner.id)).snapshots;
    const a = await all.ownership.claimCleanup(snapshot!.id, 'wa', { ttlMs: 100 });
    clock.t += 1;
    const renewed = await all.ownership.renewCleanupClaim(a, { ttlMs: 100 });
    clock.t += 101;
    const b = await all.ownership.claimCleanup(snapshot!.id, 'wb', { ttlMs: 100 });
    clock.t += 1;
    await all.ownership.completeCleanup(b);
    const trail = await trailOf(all, 'cleanup_claim', snapshot!.id);
    expect(brief(trail)).toEqual([
      ['lease.granted', 'wa', 1],
      ['lease.renewed', 'wa', 1],
      ['lease.granted', 'wb', 2],
      ['lease.lost', 'wa', 1],
      ['lease.released', 'wb', 2],
    ]);
    expect(trail[3]!.detail).toEqual({
      reason: 'superseded',
      expiresAt: renewed.expiresAt,
      by: { holder: 'wb', token: 2 },
    });
    expect(trail[4]!.detail).toEqual({ state: 'completed' });
    // A refused completion with the lost claim rolls back, and records nothing.
    await expect(all.ownership.failCleanup(a, 'late')).rejects.toMatchObject({ code: 'CLEANUP_ALREADY_COMPLETED' });
    expect(await trailOf(all, 'cleanup_claim', snapshot!.id)).toHaveLength(5);
  });

  it('records the path leases and the dispatch a task result releases (paths.submitTaskResult)', async () => {
    const { company, ws } = await workspace(all);
    const targetKey = `worktree:audit-result-${n}`;
    await all.runs.startCoordinatorRun({ targetKey });
    const t = await all.tasks.createTask({
      companyId: company.id,
      title: 'write',
      requiresFilesystem: true,
      workspaceId: ws.id,
      targetKey,
      status: 'ready',
      writes: ['src/r.ts'],
    });
    const d = await all.dispatches.createDispatch({ taskId: t.id, terminalHandle: `term-r${n}` });
    const claim = await all.paths.claimTask(t.id, 'h1');
    if (claim.status !== 'acquired') throw new Error('expected a grant');
    clock.t += 1;
    await all.paths.submitTaskResult(t.id, claim.lease, { status: 'done' });
    const paths = await trailOf(all, 'path_lease', ws.id);
    expect(brief(paths)).toEqual([
      ['lease.granted', 'h1', claim.lease.token],
      ['lease.released', 'h1', claim.lease.token],
    ]);
    expect(paths[1]).toMatchObject({
      at: clock.t,
      detail: { keys: ['src/r.ts'], by: 'paths.submitTaskResult', status: 'done' },
    });
    const dispatch = await trailOf(all, 'dispatch', d.id);
    expect(brief(dispatch)).toEqual([
      ['lease.granted', d.terminalHandle, d.seq],
      ['lease.released', d.terminalHandle, d.seq],
    ]);
    expect(dispatch[1]!.detail).toEqual({ status: 'completed', by: 'paths.submitTaskResult' });
  });

  it('records the release of a dispatch its task’s cancel ended (tasks.transitionTask)', async () => {
    const { company } = await workspace(all);
    const targetKey = `worktree:audit-cancel-${n}`;
    await all.runs.startCoordinatorRun({ targetKey });
    const t = await all.tasks.createTask({
      companyId: company.id,
      title: 'cancel me',
      requiresFilesystem: false,
      targetKey,
      status: 'ready',
    });
    const d = await all.dispatches.createDispatch({ taskId: t.id, terminalHandle: `term-c${n}` });
    clock.t += 1;
    await all.tasks.transitionTask(t.id, { from: 'dispatched', to: 'cancelled', reason: 'not needed' });
    const trail = await trailOf(all, 'dispatch', d.id);
    expect(brief(trail)).toEqual([
      ['lease.granted', d.terminalHandle, d.seq],
      ['lease.released', d.terminalHandle, d.seq],
    ]);
    expect(trail[1]).toMatchObject({ at: clock.t, detail: { status: 'cancelled', by: 'tasks.transitionTask' } });
  });

  it('records grants and losses only with audit.leases grants, and nothing when off (the default)', async () => {
    const id = await task(grants);
    const first = await grants.locks.claimTaskLease(id, { holder: 'a', ttlMs: 100 });
    if (first.status !== 'acquired') throw new Error('expected a grant');
    clock.t += 1;
    await grants.locks.renewTaskLease(first.lease, { ttlMs: 100 });
    clock.t += 101;
    const second = await grants.locks.claimTaskLease(id, { holder: 'b', ttlMs: 100 });
    if (second.status !== 'acquired') throw new Error('expected a takeover');
    await grants.locks.releaseTaskLease(second.lease);
    expect(brief(await trailOf(grants, 'task_lease', id))).toEqual([
      ['lease.granted', 'a', 1],
      ['lease.granted', 'b', 2],
      ['lease.lost', 'a', 1],
    ]);

    for (const store of [off, byDefault]) {
      const quiet = await task(store);
      const q1 = await store.locks.claimTaskLease(quiet, { holder: 'a', ttlMs: 100 });
      if (q1.status !== 'acquired') throw new Error('expected a grant');
      clock.t += 101;
      const q2 = await store.locks.claimTaskLease(quiet, { holder: 'b', ttlMs: 100 });
      if (q2.status !== 'acquired') throw new Error('expected a takeover');
      await store.locks.releaseTaskLease(q2.lease);
      expect(await trailOf(store, 'task_lease', quiet)).toEqual([]);
    }
  });

  it('refuses an unknown mode before opening anything', async () => {
    await expect(fx.open(await urlOf(all), { audit: { leases: 'some' as never } })).rejects.toBeInstanceOf(
      InvalidArgumentError,
    );
  });

  it('writes the row in the transaction of the act: a rolled-back host transaction leaves none', async () => {
    const { ws } = await workspace(all);
    await expect(
      all.transaction(async (tx) => {
        const claim = await all.withTransaction(tx.db).locks.claimWorkspaceLock(ws.id, { holder: 'h', runId: 'r' });
        expect(claim.status).toBe('acquired');
        throw new Error('undo');
      }),
    ).rejects.toThrow('undo');
    expect(await all.locks.getWorkspaceLock(ws.id)).toBeNull();
    expect(await trailOf(all, 'workspace_lock', ws.id)).toEqual([]);
    // Committed, the same act is recorded.
    await all.transaction(async (tx) => {
      await tx.locks.claimWorkspaceLock(ws.id, { holder: 'h', runId: 'r' });
    });
    expect(brief(await trailOf(all, 'workspace_lock', ws.id))).toEqual([['lease.granted', 'h', 1]]);
  });

  it('commits the act only with its row: a grant whose row cannot be written is not granted', async () => {
    const store = await fx.freshStore({ clock, audit: { leases: 'grants' } });
    const { ws } = await workspace(store);
    // The trail's table gone for a moment: the insert fails, inside the claim's transaction.
    await sql`alter table ${tbl(store.db, 'audit_events')} rename to audit_events_away`.execute(store.db);
    try {
      await expect(store.locks.claimWorkspaceLock(ws.id, { holder: 'h', runId: 'r' })).rejects.toThrow();
      expect(await store.locks.getWorkspaceLock(ws.id)).toBeNull();
    } finally {
      await sql`alter table ${tbl(store.db, 'audit_events_away')} rename to audit_events`.execute(store.db);
    }
    const claim = await store.locks.claimWorkspaceLock(ws.id, { holder: 'h', runId: 'r' });
    // Token 1: the refused attempt granted nothing.
    expect(claim).toMatchObject({ status: 'acquired', lease: { token: 1 } });
    expect(brief(await trailOf(store, 'workspace_lock', ws.id))).toEqual([['lease.granted', 'h', 1]]);
  });

  it('is pruned by prune like everything else', async () => {
    const id = await task(all);
    const claim = await all.locks.claimTaskLease(id, { holder: 'old', ttlMs: 100 });
    if (claim.status !== 'acquired') throw new Error('expected a grant');
    expect(await trailOf(all, 'task_lease', id)).toHaveLength(1);
    clock.t += 60_000;
    const dry = await all.maintenance.prune({ olderThanMs: 30_000, dryRun: true });
    expect(dry.deleted.audit_events).toBeGreaterThanOrEqual(1);
    expect(await trailOf(all, 'task_lease', id)).toHaveLength(1);
    const done = await all.maintenance.prune({ olderThanMs: 30_000 });
    expect(done.deleted.audit_events).toBe(dry.deleted.audit_events);
    expect(await trailOf(all, 'task_lease', id)).toEqual([]);
    // Rows newer than the cutoff stay.
    await all.locks.releaseTaskLease(claim.lease);
    await all.maintenance.prune({ olderThanMs: 30_000 });
    expect(brief(await trailOf(all, 'task_lease', id))).toEqual([['lease.released', 'old', 1]]);
  });
}
