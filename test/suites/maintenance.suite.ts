import { afterAll, beforeAll, expect, it } from 'vitest';
import { IDEMPOTENCY_WINDOW_MS, InvalidArgumentError, type Store } from '../../src/index.js';
import { recordAuditEvent } from '../../src/repositories/shared/audit.js';
import type { DialectFixture } from '../support/fixtures.js';
import { Contenders } from '../support/race.js';
import { ops as OPS } from './maintenance.ops.js';

class FakeClock {
  constructor(public t: number) {}
  now() {
    return this.t;
  }
}

/** Retention (`store.maintenance.prune`): removes only what is finished and old, also while other processes work. */
export function defineMaintenanceSuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  beforeAll(() => {
    fx = makeFixture();
  });
  afterAll(() => fx.cleanup());

  const count = async (
    store: Store,
    table:
      | 'messages'
      | 'decision_gates'
      | 'dispatch_contexts'
      | 'coordinator_runs'
      | 'cleanup_snapshots'
      | 'path_leases'
      | 'workspace_locks'
      | 'tasks',
  ) =>
    Number(
      (
        await store.db
          .selectFrom(table)
          .select((eb) => eb.fn.countAll<number>().as('n'))
          .executeTakeFirstOrThrow()
      ).n,
    );

  it('deletes what finished before the cutoff and keeps everything live, referenced or fencing; a dry run deletes nothing', async () => {
    const clock = new FakeClock(1_000);
    const store = await fx.freshStore({ clock });
    const company = await store.org.createCompany({ name: 'Old' });
    const ws = await store.org.createWorkspace({ companyId: company.id, name: 'ws' });
    // An old, finished run with a completed dispatch and a resolved gate.
    const task = await store.tasks.createTask({
      companyId: company.id,
      title: 'old',
      targetKey: 'worktree:old',
      requiresFilesystem: false,
      status: 'ready',
    });
    const oldRun = await store.runs.startCoordinatorRun({ targetKey: 'worktree:old' });
    const dispatch = await store.dispatches.createDispatch({ taskId: task.id, terminalHandle: 'term-1' });
    await store.dispatches.endDispatch(dispatch.id, 'completed');
    const oldGate = await store.gates.openGate({ question: 'old?', runId: oldRun.id });
    await store.gates.resolveGate(oldGate.id, 'yes');
    await store.runs.stopCoordinatorRun(oldRun.id, 'completed');
    // A running run whose resolved gate must stay.
    const live = await store.runs.startCoordinatorRun({ targetKey: 'worktree:live' });
    const liveGate = await store.gates.openGate({ question: 'live?', runId: live.id });
    await store.gates.resolveGate(liveGate.id, 'yes');
    const openGate = await store.gates.openGate({ question: 'open?', runId: live.id });
    // Messages: one delivered, one pending nobody can read (no run or terminal has its handle),
    // one pending for the live run, one dead for the live run.
    await store.messages.sendMessage({ allowUnknownRecipient: true, from: 'a', to: 'inbox', kind: 'k' });
    await store.messages.deliverPendingMessages('inbox');
    await store.messages.sendMessage({ allowUnknownRecipient: true, from: 'a', to: 'inbox', kind: 'k' });
    await store.messages.sendMessage({ from: 'a', to: live.coordinatorHandle, kind: 'k' });
    await store.messages.sendMessage({ from: 'a', to: live.coordinatorHandle, kind: 'dead' });
    const [toKill] = await store.messages.receiveMessages(live.coordinatorHandle, { limit: 1, visibilityMs: 100 });
    for (let attempt = 1; attempt < 5; attempt++) {
      clock.t += 100;
      await store.messages.receiveMessages(live.coordinatorHandle, { limit: 1, visibilityMs: 100 });
    }
    clock.t += 100;
    // The next receive of the inbox dead-letters the lapsed last attempt (and hands out the other).
    await store.messages.receiveMessages(live.coordinatorHandle, { limit: 1, visibilityMs: 1_000_000 });
    expect((await store.messages.listDeadMessages(live.coordinatorHandle)).map((m) => m.id)).toEqual([toKill!.id]);
    // A workspace lock granted and released: its row carries the fencing token and must stay.
    const claim = await store.locks.claimWorkspaceLock(ws.id, { holder: 'x', runId: live.id, ttlMs: 100 });
    if (claim.status !== 'acquired') throw new Error('not claimed');
    await store.locks.releaseWorkspaceLock(ws.id, { token: claim.lease.token });
    // Path leases: one that expires soon, one long-lived (in a workspace of their own: a live path
    // lease makes the exclusive workspace lock busy, and the lock is claimed again below).
    const pathsWs = await store.org.createWorkspace({ companyId: company.id, name: 'paths' });
    await store.paths.tryAcquirePaths({ workspaceId: pathsWs.id, holder: 'h1', paths: ['a'], ttlMs: 500 });
    await store.paths.tryAcquirePaths({ workspaceId: pathsWs.id, holder: 'h2', paths: ['b'], ttlMs: 1_000_000 });
    // A completed cleanup and a pending one.
    const doomed = await store.tasks.createTask({ companyId: company.id, title: 'doomed', requiresFilesystem: true });
    await store.ownership.createEnvironment({ ownerTaskId: doomed.id, rootPath: '/w/doomed' });
    const admission = await store.ownership.admitTaskCleanup(doomed.id, 'delete');
    const cleanupClaim = await store.ownership.claimCleanup(admission.snapshots[0]!.id, 'worker', { ttlMs: 60_000 });
    await store.ownership.completeCleanup(cleanupClaim);
    const pendingTask = await store.tasks.createTask({
      companyId: company.id,
      title: 'pending cleanup',
      requiresFilesystem: true,
    });
    await store.ownership.createEnvironment({ ownerTaskId: pendingTask.id, rootPath: '/w/pending' });
    await store.ownership.admitTaskCleanup(pendingTask.id, 'archive');

    // Audit events through the trail's one writer: two before the cutoff (50 000), one at it and
    // one after it. Only the two before it are pruned.
    const audit = (id: string, at: number) =>
      recordAuditEvent(store.db, {
        id,
        at,
        actor: 'operator',
        action: 'operator.release-workspace-lock',
        subjectKind: 'workspace_lock',
        subjectId: ws.id,
        token: claim.lease.token,
        detail: { via: 'test' },
      });
    for (const [id, at] of [
      ['audit-old-1', 1_000],
      ['audit-old-2', 49_999],
      ['audit-at-cutoff', 50_000],
      ['audit-new', 90_000],
    ] as const)
      await audit(id, at);

    clock.t = 100_000;
    const before = {
      messages: await count(store, 'messages'),
      gates: await count(store, 'decision_gates'),
      runs: await count(store, 'coordinator_runs'),
      snapshots: await count(store, 'cleanup_snapshots'),
    };
    // Messages are ids a resend converges on: kept for IDEMPOTENCY_WINDOW_MS whatever the cutoff
    // (pruned in the test below, once the window has passed).
    const expected = {
      messages: 0,
      decision_gates: 1,
      dispatch_contexts: 1,
      coordinator_runs: 1,
      cleanup_snapshots: 1,
      audit_events: 2,
      path_leases: 1,
      idempotency_keys: 0,
    };
    const dry = await store.maintenance.prune({ olderThanMs: 50_000, dryRun: true });
    expect(dry).toEqual({ cutoff: 50_000, dryRun: true, deleted: expected });
    expect(await count(store, 'messages')).toBe(before.messages);

    const result = await store.maintenance.prune({ olderThanMs: 50_000, batchSize: 1 });
    expect(result.deleted).toEqual(expected);
    expect(await store.runs.getCoordinatorRun(oldRun.id)).toBeNull();
    expect(await store.runs.getCoordinatorRun(live.id)).toMatchObject({ status: 'running' });
    expect(await store.gates.getGate(liveGate.id)).not.toBeNull();
    expect(await store.gates.getGate(openGate.id)).not.toBeNull();
    expect(await store.gates.getGate(oldGate.id)).toBeNull();
    expect(await store.messages.countPendingMessages('inbox')).toBe(1);
    expect(await store.messages.countPendingMessages(live.coordinatorHandle)).toBe(1);
    expect((await store.paths.listPathLeases({ workspaceId: pathsWs.id })).map((l) => l.holder)).toEqual(['h2']);
    expect(await count(store, 'workspace_locks')).toBe(1);
    expect(await count(store, 'cleanup_snapshots')).toBe(before.snapshots - 1);
    expect(await count(store, 'tasks')).toBe(3);
    const kept = await store.db.selectFrom('audit_events').select('id').orderBy('at').execute();
    expect(kept.map((e) => e.id)).toEqual(['audit-at-cutoff', 'audit-new']);
    // The pruned run's task is unowned, as a stopped run's would be; it is done (its dispatch
    // completed it), and run start adopts only unfinished tasks (issue 22): it stays out of the next run.
    const next = await store.runs.startCoordinatorRun({ targetKey: 'worktree:old' });
    expect(next.adoptedTaskCount).toBe(0);
    expect((await store.tasks.requireTask(task.id)).status).toBe('done');
    // The fencing token goes on increasing.
    const again = await store.locks.claimWorkspaceLock(ws.id, { holder: 'y', runId: live.id, ttlMs: 100 });
    expect(again).toMatchObject({ status: 'acquired', lease: { token: claim.lease.token + 1 } });
    // A second prune finds nothing more.
    expect(Object.values((await store.maintenance.prune({ olderThanMs: 50_000 })).deleted).every((n) => n === 0)).toBe(
      true,
    );
  });

  it('keeps message ids and idempotency keys for IDEMPOTENCY_WINDOW_MS whatever olderThanMs, and prunes them after', async () => {
    const clock = new FakeClock(1_000);
    const store = await fx.freshStore({ clock });
    const run = await store.runs.startCoordinatorRun({ targetKey: 'worktree:window' });
    const inbox = run.coordinatorHandle;
    // An acked message, an unreadable pending one, and a key.
    await store.messages.sendMessage({ id: 'acked', from: 'a', to: inbox, kind: 'k' });
    const [handed] = await store.messages.receiveMessages(inbox, { limit: 1 });
    await store.messages.ackMessages(inbox, [handed!.receipt], { idempotencyKey: 'ack-key' });
    await store.messages.sendMessage({ id: 'orphan', allowUnknownRecipient: true, from: 'a', to: 'nobody', kind: 'k' });
    const ids = async () =>
      (await store.db.selectFrom('messages').select('id').orderBy('id').execute()).map((r) => r.id);
    const keys = async () =>
      Number(
        (
          await store.db
            .selectFrom('idempotency_keys')
            .select((eb) => eb.fn.countAll<number>().as('n'))
            .executeTakeFirstOrThrow()
        ).n,
      );
    // Just inside the window: an olderThanMs of 0 deletes neither, and a resend with the id converges.
    clock.t = 1_000 + IDEMPOTENCY_WINDOW_MS - 1;
    const early = await store.maintenance.prune({ olderThanMs: 0 });
    expect(early.deleted).toMatchObject({ messages: 0, idempotency_keys: 0 });
    expect(await ids()).toEqual(['acked', 'orphan']);
    expect(await keys()).toBe(1);
    expect((await store.messages.sendMessage({ id: 'acked', from: 'a', to: inbox, kind: 'k' })).status).toBe(
      'delivered',
    );
    // Past the window: both go.
    clock.t = 1_000 + IDEMPOTENCY_WINDOW_MS + 1;
    const late = await store.maintenance.prune({ olderThanMs: 0 });
    expect(late.deleted).toMatchObject({ messages: 2, idempotency_keys: 1 });
    expect(await ids()).toEqual([]);
    expect(await keys()).toBe(0);
  });

  it('refuses bad options without deleting anything', async () => {
    const store = await fx.freshStore();
    for (const options of [
      { olderThanMs: -1 },
      { olderThanMs: 1.5 },
      { olderThanMs: 0, batchSize: 0 },
      { olderThanMs: 0, dryRun: 'yes' },
      {},
    ]) {
      await expect(store.maintenance.prune(options as never)).rejects.toBeInstanceOf(InvalidArgumentError);
    }
  });

  it('prunes while 4 processes keep starting runs, claiming locks and exchanging messages: every call of theirs succeeds and tokens keep increasing', async () => {
    const url = await fx.freshUrl();
    const store = await fx.open(url);
    await store.migrate();
    const company = await store.org.createCompany({ name: 'Busy' });
    const workspaces = await Promise.all(
      [0, 1, 2, 3].map((i) => store.org.createWorkspace({ companyId: company.id, name: `ws${i}` })),
    );
    const contenders = await Contenders.start(4, { url, ops: OPS, storeOptions: { poolSize: 2 } });
    try {
      let pruning = true;
      const pruned = { messages: 0, coordinator_runs: 0, decision_gates: 0 };
      const pruner = (async () => {
        while (pruning) {
          const { deleted } = await store.maintenance.prune({ olderThanMs: 0, batchSize: 3 });
          pruned.messages += deleted.messages;
          pruned.coordinator_runs += deleted.coordinator_runs;
          pruned.decision_gates += deleted.decision_gates;
          // SQLite calls complete without a macrotask turn: yield, or the children's results are never read.
          await new Promise((resolve) => setImmediate(resolve));
        }
      })();
      const outcomes = await contenders.race('churn', (i) => ({
        workspaceId: workspaces[i]!.id,
        tag: `svc-${i}`,
        rounds: 25,
      }));
      pruning = false;
      await pruner;
      expect(outcomes.filter((o) => !o.ok)).toEqual([]);
      for (const o of outcomes) {
        if (!o.ok) continue;
        expect(o.value).toEqual([...o.value].sort((a, b) => a - b));
        expect(new Set(o.value).size).toBe(o.value.length);
      }
      // Each store judges time on its own estimate of the database clock (PostgreSQL), a few ms
      // apart: a run that ended in the last moment may still be "younger" than this store's
      // cutoff. Prune again until the last ones are older than it.
      for (let round = 0; round < 100; round++) {
        const final = await store.maintenance.prune({ olderThanMs: 0 });
        pruned.coordinator_runs += final.deleted.coordinator_runs;
        pruned.messages += final.deleted.messages;
        if ((await count(store, 'coordinator_runs')) === 0) break;
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      // Everything the services finished is gone now; the fencing rows stay, and so do the acked
      // messages: their ids are kept IDEMPOTENCY_WINDOW_MS whatever olderThanMs says.
      expect(pruned.coordinator_runs).toBe(100);
      expect(pruned.messages).toBe(0);
      expect(await count(store, 'messages')).toBe(100);
      expect(await count(store, 'coordinator_runs')).toBe(0);
      expect(await count(store, 'workspace_locks')).toBe(4);
    } finally {
      await contenders.close();
    }
  });
}
