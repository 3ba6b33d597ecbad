import { beforeAll, describe, expect, it } from 'vitest';
import type {
  CleanupClaim,
  Lease,
  PathLeaseGrant,
  SemaphoreLease,
  Store,
  TaskLease,
  WorkspaceLock,
} from '../../src/index.js';
import type { DialectFixture } from '../support/fixtures.js';

/** A clock the test moves by hand, so a re-run of a call would answer differently from its replay. */
function manualClock(start = 1_800_000_000_000) {
  let now = start;
  return { now: () => now, advance: (ms: number) => (now += ms) };
}

/** The outcome as plain data: a result, or a refusal's class, code and own fields. */
async function outcomeOf(call: () => Promise<unknown>): Promise<unknown> {
  try {
    return { ok: JSON.parse(JSON.stringify((await call()) ?? null)) as unknown };
  } catch (error) {
    const e = error as Error & { code?: string };
    return { refused: e.constructor.name, code: e.code, fields: JSON.parse(JSON.stringify({ ...e })) as unknown };
  }
}

/**
 * Idempotency keys on every mutation without a natural id (issue 23 item 3), one table per area:
 * each row calls a mutation under a key, changes the world so that running the call again would
 * answer otherwise, and checks that the retry with the key returns the first outcome (a result,
 * or the same typed refusal), and that other input under the key is IDEMPOTENCY_KEY_CONFLICT.
 */
export function defineIdempotencyKeySuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  let store: Store;
  const clock = manualClock();
  let n = 0;
  beforeAll(async () => {
    fx = makeFixture();
    store = await fx.freshStore({ clock });
    await store.org.createCompany({ id: 'co', name: 'Acme' });
    await store.org.createWorkspace({ id: 'ws', companyId: 'co', name: 'main', rootPath: '/w' });
    await store.org.createAgent({ id: 'ag', companyId: 'co', name: 'dev', role: 'Engineer', workspaceId: 'ws' });
    return () => fx.cleanup();
  });

  /** A fresh run and `count` ready tasks of it, each with a workspace; unique ids per call. */
  async function world(count = 1, extra: { writes?: string[] } = {}) {
    const tag = `k${++n}`;
    const run = await store.runs.startCoordinatorRun({ targetKey: `t:${tag}` });
    const workspace = await store.org.createWorkspace({
      id: `ws-${tag}`,
      companyId: 'co',
      name: tag,
      rootPath: `/w/${tag}`,
    });
    const tasks = [];
    for (let i = 0; i < count; i++)
      tasks.push(
        await store.tasks.createTask({
          companyId: 'co',
          title: `${tag}-${i}`,
          requiresFilesystem: false,
          workspaceId: workspace.id,
          targetKey: `t:${tag}`,
          status: 'ready',
          ...extra,
        }),
      );
    return { tag, run, workspace, tasks };
  }

  /**
   * Calls `call(key)` twice around `between` (which makes a re-run answer differently) and expects
   * the same outcome, then `other(key)` to be a key conflict. Returns the first outcome.
   */
  async function replays(
    call: (key: string) => Promise<unknown>,
    other: (key: string) => Promise<unknown>,
    between: () => Promise<unknown> = async () => clock.advance(1_000),
  ) {
    const key = `key-${++n}`;
    const first = await outcomeOf(() => call(key));
    await between();
    expect(await outcomeOf(() => call(key))).toEqual(first);
    await expect(other(key)).rejects.toMatchObject({ code: 'IDEMPOTENCY_KEY_CONFLICT' });
    return first as { ok?: unknown; refused?: string; code?: string };
  }

  describe('locks', () => {
    it('task lease and workspace lock: claim, renew and release replay their first outcome', async () => {
      const { run, workspace, tasks } = await world();
      const taskId = tasks[0]!.id;
      const claim = await replays(
        (k) => store.locks.claimTaskLease(taskId, { holder: 'h', ttlMs: 5_000, idempotencyKey: k }),
        (k) => store.locks.claimTaskLease(taskId, { holder: 'other', ttlMs: 5_000, idempotencyKey: k }),
      );
      const lease = (claim.ok as { status: string; lease: TaskLease }).lease;
      expect(lease.token).toBe(1);
      // One effect: the lease row was bumped once.
      expect((await store.locks.getTaskLease(taskId))?.token).toBe(1);
      const renewed = await replays(
        (k) => store.locks.renewTaskLease(lease, { ttlMs: 5_000, idempotencyKey: k }),
        (k) => store.locks.renewTaskLease(lease, { ttlMs: 9_000, idempotencyKey: k }),
      );
      expect(renewed.ok).toMatchObject({ token: 1 });
      await replays(
        (k) => store.locks.releaseTaskLease(lease, { idempotencyKey: k }),
        (k) => store.locks.releaseTaskLease({ ...lease, token: 7 }, { idempotencyKey: k }),
      );
      // A refusal replays as the same typed refusal, even after a re-run would succeed.
      const next = await store.locks.claimTaskLease(taskId, { holder: 'h2' });
      const stale = await replays(
        (k) => store.locks.renewTaskLease(lease, { idempotencyKey: k }),
        (k) => store.locks.renewTaskLease(lease, { ttlMs: 1, idempotencyKey: k }),
      );
      expect(stale).toMatchObject({ refused: 'StaleTaskLeaseError', code: 'STALE_TASK_LEASE' });
      expect(next.status).toBe('acquired');

      const ws = await replays(
        (k) => store.locks.claimWorkspaceLock(workspace.id, { holder: 'h', runId: run.id, idempotencyKey: k }),
        (k) => store.locks.claimWorkspaceLock(workspace.id, { holder: 'x', runId: run.id, idempotencyKey: k }),
      );
      const wsLease = (ws.ok as { lease: WorkspaceLock }).lease;
      expect(wsLease.token).toBe(1);
      await replays(
        (k) => store.locks.renewWorkspaceLock(wsLease, { idempotencyKey: k }),
        (k) => store.locks.renewWorkspaceLock(wsLease, { ttlMs: 3, idempotencyKey: k }),
      );
      await replays(
        (k) => store.locks.releaseWorkspaceLock(wsLease, { idempotencyKey: k }),
        (k) => store.locks.releaseWorkspaceLock({ ...wsLease, token: 9 }, { idempotencyKey: k }),
      );
    });
  });

  describe('paths', () => {
    it('tryAcquirePaths, acquirePaths, renewPaths, releasePaths, claimTask, submitTaskResult', async () => {
      const { workspace, tasks } = await world(2, { writes: ['src'] });
      const input = { workspaceId: workspace.id, holder: 'h', paths: ['docs'], ttlMs: 5_000 };
      const acquired = await replays(
        (k) => store.paths.tryAcquirePaths({ ...input, idempotencyKey: k }),
        (k) => store.paths.tryAcquirePaths({ ...input, paths: ['other'], idempotencyKey: k }),
      );
      const grant = (acquired.ok as { status: string; lease: PathLeaseGrant }).lease;
      expect(acquired.ok).toMatchObject({ status: 'acquired' });
      await replays(
        (k) => store.paths.renewPaths(grant, { ttlMs: 5_000, idempotencyKey: k }),
        (k) => store.paths.renewPaths(grant, { ttlMs: 6_000, idempotencyKey: k }),
      );
      const released = await replays(
        (k) => store.paths.releasePaths(grant, { idempotencyKey: k }),
        (k) => store.paths.releasePaths({ ...grant, token: grant.token + 5 }, { idempotencyKey: k }),
      );
      expect(released.ok).toEqual({ released: ['docs'] });
      const waited = await replays(
        (k) => store.paths.acquirePaths({ ...input, idempotencyKey: k }, { timeoutMs: 1_000 }),
        (k) => store.paths.acquirePaths({ ...input, ttlMs: 1, idempotencyKey: k }, { timeoutMs: 1_000 }),
      );
      expect((waited.ok as unknown[]).length).toBe(1);

      const claimed = await replays(
        (k) => store.paths.claimTask(tasks[0]!.id, 'agent', { idempotencyKey: k }),
        (k) => store.paths.claimTask(tasks[0]!.id, 'other', { idempotencyKey: k }),
      );
      expect(claimed.ok).toMatchObject({ status: 'acquired', claimed: true });
      const claimGrant = (claimed.ok as { lease: PathLeaseGrant }).lease;
      const submitted = await replays(
        (k) => store.paths.submitTaskResult(tasks[0]!.id, claimGrant, { status: 'done' }, { idempotencyKey: k }),
        (k) => store.paths.submitTaskResult(tasks[0]!.id, claimGrant, { status: 'failed' }, { idempotencyKey: k }),
      );
      expect(submitted.ok).toMatchObject({ status: 'done' });
      // The finished task refuses a claim; the refusal replays.
      const refused = await replays(
        (k) => store.paths.claimTask(tasks[0]!.id, 'agent', { idempotencyKey: k }),
        (k) => store.paths.claimTask(tasks[1]!.id, 'agent', { idempotencyKey: k }),
      );
      expect(refused).toMatchObject({ refused: 'PathClaimRefusedError' });
    });
  });

  describe('semaphores', () => {
    it('acquire, renew and release replay; a lost lease replays as the same refusal', async () => {
      const name = `sem-${++n}`;
      const acquired = await replays(
        (k) => store.semaphores.acquire(name, { holder: 'h', limit: 1, idempotencyKey: k }),
        (k) => store.semaphores.acquire(name, { holder: 'h', limit: 2, idempotencyKey: k }),
      );
      const lease = (acquired.ok as { status: string; lease: SemaphoreLease }).lease;
      expect(acquired.ok).toMatchObject({ status: 'acquired' });
      expect(await store.semaphores.listHolders(name)).toHaveLength(1);
      await replays(
        (k) => store.semaphores.renew(lease, { ttlMs: 5_000, idempotencyKey: k }),
        (k) => store.semaphores.renew(lease, { ttlMs: 7_000, idempotencyKey: k }),
      );
      await replays(
        (k) => store.semaphores.release(lease, { idempotencyKey: k }),
        (k) => store.semaphores.release({ ...lease, token: lease.token + 3 }, { idempotencyKey: k }),
      );
      const lost = await replays(
        (k) => store.semaphores.renew(lease, { idempotencyKey: k }),
        (k) => store.semaphores.renew(lease, { ttlMs: 2, idempotencyKey: k }),
      );
      expect(lost).toMatchObject({ refused: 'SemaphoreLeaseLostError' });
    });
  });

  describe('tasks', () => {
    it('transitionTask and addDependency replay; a stale transition stays refused after the task moves', async () => {
      const { tasks } = await world(3);
      const [a, b, c] = tasks.map((t) => t.id);
      const moved = await replays(
        (k) => store.tasks.transitionTask(a!, { from: 'ready', to: 'blocked', reason: 'r', idempotencyKey: k }),
        (k) => store.tasks.transitionTask(a!, { from: 'ready', to: 'cancelled', idempotencyKey: k }),
      );
      expect(moved.ok).toMatchObject({ status: 'blocked' });
      const stale = await replays(
        (k) => store.tasks.transitionTask(b!, { from: 'blocked', to: 'ready', idempotencyKey: k }),
        (k) => store.tasks.transitionTask(b!, { from: 'blocked', to: 'backlog', idempotencyKey: k }),
        // A re-run would now succeed.
        () => store.tasks.transitionTask(b!, { from: 'ready', to: 'blocked' }),
      );
      expect(stale).toMatchObject({ refused: 'TaskTransitionRefusedError', code: 'TASK_TRANSITION_REFUSED' });
      const dep = await replays(
        (k) => store.tasks.addDependency(c!, b!, { idempotencyKey: k }),
        (k) => store.tasks.addDependency(c!, a!, { idempotencyKey: k }),
        () => store.tasks.transitionTask(c!, { from: 'blocked', to: 'backlog' }),
      );
      expect(dep.ok).toMatchObject({ id: c, status: 'blocked' });
    });
  });

  describe('dispatches and the scheduler', () => {
    it('dispatchNext, heartbeat, complete, end, exit, batch and reclaim replay their first outcome', async () => {
      const { run, tasks } = await world(4);
      const next = await replays(
        (k) => store.dispatches.dispatchNext({ runId: run.id, terminalHandle: 'term-1', idempotencyKey: k }),
        (k) => store.dispatches.dispatchNext({ runId: run.id, terminalHandle: 'term-2', idempotencyKey: k }),
      );
      const dispatch = next.ok as { id: string; lease: Lease<'dispatch'> };
      expect(await store.dispatches.listDispatches({ runId: run.id, status: 'active' })).toHaveLength(1);
      await replays(
        (k) => store.dispatches.heartbeatDispatch(dispatch.lease, { ttlMs: 5_000, idempotencyKey: k }),
        (k) => store.dispatches.heartbeatDispatch(dispatch.lease, { ttlMs: 6_000, idempotencyKey: k }),
      );
      const completed = await replays(
        (k) => store.dispatches.completeDispatch(dispatch.id, { result: { ok: 1 }, idempotencyKey: k }),
        (k) => store.dispatches.completeDispatch(dispatch.id, { result: { ok: 2 }, idempotencyKey: k }),
      );
      expect(completed.ok).toMatchObject({ dispatch: { id: dispatch.id, status: 'completed' } });
      // A report on an ended dispatch is a refusal, and replays as one.
      const late = await replays(
        (k) => store.dispatches.endDispatch(dispatch.id, 'cancelled', { idempotencyKey: k }),
        (k) => store.dispatches.endDispatch(dispatch.id, 'completed', { idempotencyKey: k }),
      );
      expect(late).toMatchObject({ refused: 'DispatchNotActiveError' });

      const batch = await replays(
        (k) =>
          store.dispatches.dispatchNextBatch({
            runId: run.id,
            terminalHandles: ['term-3', 'term-4'],
            idempotencyKey: k,
          }),
        (k) => store.dispatches.dispatchNextBatch({ runId: run.id, terminalHandles: ['term-3'], idempotencyKey: k }),
      );
      const [d3, d4] = batch.ok as { id: string }[];
      expect(await store.dispatches.listDispatches({ runId: run.id, status: 'active' })).toHaveLength(2);
      const ended = await replays(
        (k) => store.dispatches.endDispatch(d3!.id, 'cancelled', { idempotencyKey: k }),
        (k) => store.dispatches.endDispatch(d3!.id, 'completed', { idempotencyKey: k }),
      );
      expect(ended.ok).toMatchObject({ id: d3!.id, status: 'cancelled' });
      const exit = await replays(
        (k) => store.dispatches.failActiveDispatchOnExit('term-4', { error: 'gone', idempotencyKey: k }),
        (k) => store.dispatches.failActiveDispatchOnExit('term-4', { error: 'other', idempotencyKey: k }),
      );
      expect(exit.ok).toMatchObject({ dispatch: { id: d4!.id, status: 'failed' } });

      await store.dispatches.dispatchNext({ runId: run.id, terminalHandle: 'term-5', ttlMs: 10 });
      clock.advance(1_000);
      const reclaimed = await replays(
        (k) => store.dispatches.reclaimExpiredDispatches({ runId: run.id, idempotencyKey: k }),
        (k) => store.dispatches.reclaimExpiredDispatches({ runId: run.id, limit: 3, idempotencyKey: k }),
        async () => {
          await store.dispatches.dispatchNext({ runId: run.id, terminalHandle: 'term-6', ttlMs: 10 });
          clock.advance(1_000);
        },
      );
      expect(reclaimed.ok as unknown[]).toHaveLength(1);
      expect(tasks).toHaveLength(4);
    });

    it('createDispatch and openGate take a caller-chosen id: the same input returns the row, other input is ALREADY_EXISTS', async () => {
      const { run, tasks } = await world(1);
      const input = { id: `d-${n}`, taskId: tasks[0]!.id, terminalHandle: 'term-c', runId: run.id };
      const created = await store.dispatches.createDispatch(input);
      expect(await store.dispatches.createDispatch(input)).toEqual(created);
      await expect(store.dispatches.createDispatch({ ...input, terminalHandle: 'term-x' })).rejects.toMatchObject({
        code: 'ALREADY_EXISTS',
        differences: ['terminalHandle'],
      });
      const gate = await store.gates.openGate({ id: `g-${n}`, question: 'go?', runId: run.id, ttlMs: 1_000 });
      expect(await store.gates.openGate({ id: `g-${n}`, question: 'go?', runId: run.id, ttlMs: 1_000 })).toEqual(gate);
      await expect(store.gates.openGate({ id: `g-${n}`, question: 'stop?', runId: run.id })).rejects.toMatchObject({
        code: 'ALREADY_EXISTS',
        differences: ['question', 'ttlMs'],
      });
      expect(await store.db.selectFrom('decision_gates').select('id').where('id', '=', gate.id).execute()).toHaveLength(
        1,
      );
    });

    it('scheduler.dispatchRun, runs, gates and dead messages replay under a key', async () => {
      const { run, tasks } = await world(1);
      const dispatched = await replays(
        (k) =>
          store.scheduler.dispatchRun({
            taskId: tasks[0]!.id,
            agentId: 'ag',
            runId: run.id,
            mode: 'heartbeat',
            idempotencyKey: k,
          }),
        (k) =>
          store.scheduler.dispatchRun({
            taskId: tasks[0]!.id,
            agentId: 'ag',
            runId: run.id,
            mode: 'task-runner',
            idempotencyKey: k,
          }),
      );
      expect(dispatched.ok).toMatchObject({ outcome: 'dispatched', taskLease: { token: 1 } });
      expect((await store.locks.getTaskLease(tasks[0]!.id))?.token).toBe(1);

      await store.gates.openGate({ question: 'q', runId: run.id, ttlMs: 10 });
      clock.advance(1_000);
      const expired = await replays(
        (k) => store.gates.expireGates({ runId: run.id, idempotencyKey: k }),
        (k) => store.gates.expireGates({ idempotencyKey: k }),
      );
      expect(expired.ok as unknown[]).toHaveLength(1);

      const beat = await replays(
        (k) => store.runs.heartbeatCoordinatorRun(run.id, { idempotencyKey: k }),
        (k) => store.runs.heartbeatCoordinatorRun('other-run', { idempotencyKey: k }),
      );
      expect(beat.ok).toMatchObject({ id: run.id, status: 'running' });
      const stopped = await replays(
        (k) => store.runs.stopCoordinatorRun(run.id, 'completed', { idempotencyKey: k }),
        (k) => store.runs.stopCoordinatorRun(run.id, 'failed', { idempotencyKey: k }),
      );
      expect(stopped.ok).toMatchObject({ status: 'completed' });
      const dead = await replays(
        (k) => store.runs.heartbeatCoordinatorRun(run.id, { idempotencyKey: k }),
        (k) => store.runs.heartbeatCoordinatorRun('x', { idempotencyKey: k }),
      );
      expect(dead).toMatchObject({ refused: 'CoordinatorRunNotRunningError' });

      const requeued = await replays(
        (k) => store.messages.requeueDeadMessages('nobody', ['m1'], { idempotencyKey: k }),
        (k) => store.messages.requeueDeadMessages('nobody', ['m2'], { idempotencyKey: k }),
      );
      expect(requeued.ok).toEqual([]);
    });
  });

  describe('ownership', () => {
    it('transfers and every cleanup step replay; a busy claim replays as busy', async () => {
      const { tasks } = await world(3);
      const [a, b] = tasks.map((t) => t.id);
      const env = await store.ownership.createEnvironment({ ownerTaskId: a!, rootPath: `/w/env-${n}` });
      const moved = await replays(
        (k) =>
          store.ownership.transferEnvironmentOwnership({
            environmentId: env.id,
            expectedOwnerTaskId: a!,
            expectedGeneration: env.generation,
            newOwnerTaskId: b!,
            idempotencyKey: k,
          }),
        (k) =>
          store.ownership.transferEnvironmentOwnership({
            environmentId: env.id,
            expectedOwnerTaskId: a!,
            expectedGeneration: env.generation,
            newOwnerTaskId: a!,
            idempotencyKey: k,
          }),
      );
      expect(moved.ok).toMatchObject({ ownerTaskId: b, changed: true, generation: env.generation + 1 });
      expect((await store.ownership.getEnvironment(env.id))?.generation).toBe(env.generation + 1);

      const admitted = await replays(
        (k) => store.ownership.admitTaskCleanup(b!, 'archive', { idempotencyKey: k }),
        (k) => store.ownership.admitTaskCleanup(b!, 'delete', { idempotencyKey: k }),
      );
      const snapshotId = (admitted.ok as { snapshots: { id: string }[] }).snapshots[0]!.id;
      const claimed = await replays(
        (k) => store.ownership.claimCleanup(snapshotId, 'w1', { idempotencyKey: k }),
        (k) => store.ownership.claimCleanup(snapshotId, 'w2', { idempotencyKey: k }),
      );
      const claim = claimed.ok as CleanupClaim;
      const busy = await replays(
        (k) => store.ownership.tryClaimCleanup(snapshotId, 'w2', { idempotencyKey: k }),
        (k) => store.ownership.tryClaimCleanup(snapshotId, 'w3', { idempotencyKey: k }),
      );
      expect(busy.ok).toMatchObject({ status: 'busy', heldBy: { holder: 'w1' } });
      await replays(
        (k) => store.ownership.renewCleanupClaim(claim, { ttlMs: 5_000, idempotencyKey: k }),
        (k) => store.ownership.renewCleanupClaim(claim, { ttlMs: 6_000, idempotencyKey: k }),
      );
      const failed = await replays(
        (k) => store.ownership.failCleanup(claim, 'disk', { idempotencyKey: k }),
        (k) => store.ownership.failCleanup(claim, 'net', { idempotencyKey: k }),
      );
      expect(failed.ok).toMatchObject({ state: 'failed' });
      const again = await store.ownership.claimCleanup(snapshotId, 'w1');
      const released = await replays(
        (k) => store.ownership.releaseCleanupClaim(again, { idempotencyKey: k }),
        (k) => store.ownership.releaseCleanupClaim({ ...again, claimant: 'w9' }, { idempotencyKey: k }),
      );
      expect(released.ok).toMatchObject({ state: 'pending' });
      const last = await store.ownership.claimCleanup(snapshotId, 'w1');
      const done = await replays(
        (k) => store.ownership.completeCleanup(last, { idempotencyKey: k }),
        (k) => store.ownership.completeCleanup({ ...last, claimant: 'w9' }, { idempotencyKey: k }),
      );
      expect(done.ok).toMatchObject({ state: 'completed' });
    });
  });
}
