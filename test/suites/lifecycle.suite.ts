/**
 * The work lifecycle (issue 22), single process: every row of the state machine walked through
 * its call, the combined completion, guarded transitions, one active dispatch per terminal,
 * dependencies and the ready queue, and dispatch leases.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  DEFAULT_DISPATCH_LEASE_TTL_MS,
  DISPATCH_TRANSITIONS,
  DispatchLeaseLostError,
  TASK_TRANSITIONS,
  TaskDependencyRefusedError,
  GateAlreadyResolvedError,
  GateOpenError,
  TaskNotDispatchableError,
  TaskTransitionRefusedError,
  TerminalBusyError,
  type Dispatch,
  type InitialTaskStatus,
  type Store,
  type Task,
  type TaskStatus,
} from '../../src/index.js';
import type { DialectFixture } from '../support/fixtures.js';
import { tbl } from '../support/schema.js';
import { CompiledQuery, sql } from 'kysely';

/** Real time plus an offset the test moves forward. */
function movableClock() {
  let offset = 0;
  return { now: () => Date.now() + offset, advance: (ms: number) => void (offset += ms) };
}

export function defineLifecycleSuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  let store: Store;
  let company: string;
  const clock = movableClock();
  let n = 0;
  const unique = (name: string) => `${name}-${++n}-${Math.random().toString(16).slice(2, 8)}`;

  beforeAll(async () => {
    fx = makeFixture();
    store = await fx.freshStore({ clock });
    company = (await store.org.createCompany({ name: 'acme' })).id;
  }, 120_000);
  afterAll(() => fx.cleanup());

  /** A target with a running run: tasks created on it are the run's. */
  async function runOn() {
    const targetKey = `worktree:${unique('t')}`;
    const run = await store.runs.startCoordinatorRun({ targetKey });
    const create = (extra: Partial<Parameters<Store['tasks']['createTask']>[0]> = {}) =>
      store.tasks.createTask({
        companyId: company,
        title: 't',
        targetKey,
        requiresFilesystem: false,
        status: 'ready',
        ...extra,
      });
    return { run, targetKey, create };
  }

  /** A dispatch of a ready task (on a terminal of its own). */
  const dispatchOf = (task: Task, ttlMs?: number) =>
    store.dispatches.createDispatch({ taskId: task.id, terminalHandle: unique('term'), ...(ttlMs ? { ttlMs } : {}) });

  /** A task of `create` put in `status` through the public calls (finished ones by a direct write). */
  async function taskIn(create: () => Promise<Task>, status: TaskStatus): Promise<{ task: Task; dispatch?: Dispatch }> {
    if (status === 'dispatched' || status === 'in_progress') {
      const task = await create();
      const dispatch = await dispatchOf(task);
      if (status === 'in_progress')
        await store.tasks.transitionTask(task.id, { from: 'dispatched', to: 'in_progress' });
      return { task, dispatch };
    }
    if (['done', 'failed', 'cancelled'].includes(status)) {
      const task = await create();
      await store.db.updateTable('tasks').set({ status }).where('id', '=', task.id).execute();
      return { task };
    }
    return { task: await store.tasks.createTask({ ...(await baseOf(create)), status: status as InitialTaskStatus }) };
  }
  /** The createTask input `create` uses, read back from one task it creates (then cancelled). */
  async function baseOf(create: () => Promise<Task>) {
    const probe = await create();
    await store.tasks.transitionTask(probe.id, { from: probe.status, to: 'cancelled' });
    return { companyId: company, title: 't', targetKey: probe.targetKey, requiresFilesystem: false };
  }

  /** Exit failures of a task before the one the row makes (the breaker rows need two). */
  async function failTimes(task: Task, times: number) {
    for (let i = 0; i < times; i++) {
      const d = await dispatchOf(task);
      await store.dispatches.failActiveDispatchOnExit(d.terminalHandle);
    }
  }

  /** Makes the row's call on a task in `row.from`; returns the task and dispatch afterwards. */
  async function perform(row: { from: string; to: string; call: string }) {
    const { run, create } = await runOn();
    const from = row.from as TaskStatus;
    const breaker = row.call.endsWith('(breaker)');
    const gated = row.call.endsWith('(open gate)');
    const call = row.call.replace(' (breaker)', '').replace(' (open gate)', '');
    if (call === 'dependency done' || call === 'dependency failed') {
      const dep = await create();
      const task = await create({ dependsOn: [dep.id] });
      expect(task.status).toBe('blocked');
      const d = await dispatchOf(dep);
      if (call === 'dependency done') await store.dispatches.completeDispatch(d.id);
      else await store.tasks.transitionTask(dep.id, { from: 'dispatched', to: 'cancelled' });
      return {
        task: await store.tasks.requireTask(task.id),
        dispatch: await store.dispatches.getDispatch(d.id),
        depId: dep.id,
      };
    }
    if (call === 'gates.openGate') {
      const { task } = await taskIn(create, from);
      await store.gates.openGate({ question: 'go?', taskId: task.id });
      return { task: await store.tasks.requireTask(task.id), dispatch: null };
    }
    if (call === 'gates.resolveGate') {
      const task = await create();
      const gate = await store.gates.openGate({ question: 'go?', taskId: task.id });
      expect((await store.tasks.requireTask(task.id)).status).toBe(from);
      await store.gates.resolveGate(gate.id, 'yes');
      return { task: await store.tasks.requireTask(task.id), dispatch: null };
    }
    if (call.startsWith('dispatches.createDispatch') || call.startsWith('dispatches.dispatchNext')) {
      const task = await create();
      const terminal = unique('term');
      const dispatch =
        call === 'dispatches.createDispatch'
          ? await store.dispatches.createDispatch({ taskId: task.id, terminalHandle: terminal })
          : call === 'dispatches.dispatchNext'
            ? await store.dispatches.dispatchNext({ runId: run.id, terminalHandle: terminal })
            : (await store.dispatches.dispatchNextBatch({ runId: run.id, terminalHandles: [terminal] }))[0];
      expect(dispatch?.taskId).toBe(task.id);
      return { task: await store.tasks.requireTask(task.id), dispatch: dispatch ?? null };
    }
    if (call === 'paths.claimTask') {
      const workspaceId = (await store.org.createWorkspace({ companyId: company, name: unique('ws') })).id;
      const task = await create({ workspaceId, writes: [] });
      if (from !== 'ready') await dispatchOf(task);
      if (from === 'in_progress') await store.paths.claimTask(task.id, 'first');
      expect((await store.tasks.requireTask(task.id)).status).toBe(from);
      expect(await store.paths.claimTask(task.id, 'worker')).toMatchObject({ status: 'acquired' });
      return { task: await store.tasks.requireTask(task.id), dispatch: null };
    }
    if (call.startsWith('paths.submitTaskResult')) {
      const workspaceId = (await store.org.createWorkspace({ companyId: company, name: unique('ws') })).id;
      const task = await create({ workspaceId, writes: [] });
      const dispatch = await dispatchOf(task);
      const claim = await store.paths.claimTask(task.id, 'worker');
      if (claim.status !== 'acquired') throw new Error('claim busy');
      const status = (call === 'paths.submitTaskResult' ? row.to : call.includes("'done'") ? 'done' : 'failed') as
        | 'done'
        | 'failed';
      await store.paths.submitTaskResult(task.id, claim.lease, { status, dispatchLease: dispatch.lease! });
      return {
        task: await store.tasks.requireTask(task.id),
        dispatch: await store.dispatches.getDispatch(dispatch.id),
      };
    }
    if (call === 'tasks.transitionTask' || call === "tasks.transitionTask(→ 'cancelled')") {
      const { task, dispatch } = await taskIn(create, call === 'tasks.transitionTask' ? from : 'dispatched');
      const to = (call === 'tasks.transitionTask' ? row.to : 'cancelled') as TaskStatus;
      await store.tasks.transitionTask(task.id, { from: call === 'tasks.transitionTask' ? from : 'dispatched', to });
      return {
        task: await store.tasks.requireTask(task.id),
        dispatch: dispatch ? await store.dispatches.getDispatch(dispatch.id) : null,
      };
    }
    // The dispatch calls on an in-flight task (or, for dispatch rows, on a dispatched one).
    const inFlight = from === 'in_progress' ? 'in_progress' : 'dispatched';
    const task = await create();
    if (breaker) await failTimes(task, 2);
    const dispatch = await dispatchOf(task, call === 'dispatches.reclaimExpiredDispatches' ? 1_000 : undefined);
    if (inFlight === 'in_progress')
      await store.tasks.transitionTask(task.id, { from: 'dispatched', to: 'in_progress' });
    // A gate opened while the task is in flight: it keeps running, and the gate holds it afterwards.
    if (gated) await store.gates.openGate({ question: 'hold?', taskId: task.id });
    if (call === 'dispatches.completeDispatch')
      await store.dispatches.completeDispatch(dispatch.id, { result: { ok: 1 } });
    else if (call === "dispatches.endDispatch(id, 'completed')")
      await store.dispatches.endDispatch(dispatch.id, 'completed');
    else if (call === "dispatches.endDispatch(id, 'cancelled')")
      await store.dispatches.endDispatch(dispatch.id, 'cancelled');
    else if (call === 'dispatches.failActiveDispatchOnExit')
      await store.dispatches.failActiveDispatchOnExit(dispatch.terminalHandle);
    else if (call === 'dispatches.reclaimExpiredDispatches') {
      clock.advance(1_001);
      const reclaimed = await store.dispatches.reclaimExpiredDispatches({ runId: run.id });
      expect(reclaimed.map((r) => r.dispatch.id)).toEqual([dispatch.id]);
    } else throw new Error(`no way to make the call ${row.call}`);
    return { task: await store.tasks.requireTask(task.id), dispatch: await store.dispatches.getDispatch(dispatch.id) };
  }

  describe('migration 0090', () => {
    it('numbers legacy rows in their old order (created_at, id) and keeps only the newest active dispatch of a terminal', async () => {
      const legacy = await fx.freshStore({ to: 80 });
      try {
        await legacy.db.insertInto('companies').values({ id: 'c1', name: 'Acme', created_at: 1 }).execute();
        const t = (id: string, at: number) => ({
          id,
          company_id: 'c1',
          title: id,
          status: 'dispatched' as const,
          created_at: at,
          updated_at: at,
          requires_filesystem: 0 as const,
        });
        await legacy.db
          .insertInto('tasks')
          .values([t('t-b', 5), t('t-a', 5), t('t-c', 3)])
          .execute();
        const d = (id: string, task: string, terminal: string, at: number) => ({
          id,
          task_id: task,
          terminal_handle: terminal,
          status: 'active' as const,
          created_at: at,
          updated_at: at,
        });
        await legacy.db
          .insertInto('dispatch_contexts')
          .values([d('d2', 't-b', 'x', 5), d('d1', 't-a', 'x', 5), d('d3', 't-c', 'y', 3)])
          .execute();
        await legacy.migrate();
        expect((await legacy.tasks.listTasks()).map((task) => task.id)).toEqual(['t-c', 't-a', 't-b']);
        const dispatches = await legacy.dispatches.listDispatches();
        expect(dispatches.map((x) => [x.id, x.status])).toEqual([
          ['d3', 'active'],
          ['d1', 'failed'],
          ['d2', 'active'],
        ]);
        expect((await legacy.tasks.requireTask('t-a')).status).toBe('ready');
        expect((await legacy.dispatches.getActiveDispatchForTerminal('x'))?.id).toBe('d2');
        const fresh = await legacy.tasks.createTask({ companyId: 'c1', title: 'new', requiresFilesystem: false });
        expect(fresh.seq).toBeGreaterThan(Math.max(...(await legacy.tasks.listTasks()).slice(0, 3).map((x) => x.seq)));
        expect(dispatches.every((x) => x.lease === null || x.status === 'active')).toBe(true);
      } finally {
        await legacy.close();
      }
    });
  });

  describe('the state machine', () => {
    it('walks every row of TASK_TRANSITIONS through the call it names', async () => {
      for (const row of TASK_TRANSITIONS) {
        const { task, depId } = await perform(row);
        expect({ ...row, status: task.status }).toEqual({ ...row, status: row.to });
        // `blocked → blocked` changes only the reason: the row is made when the reason names the failed dependency.
        // Mutant "failure-does-not-block" (propagateFinish ignores failed/cancelled) fails here.
        if (row.call === 'dependency failed')
          expect(task.blockedReason).toBe(`dependency_failed: task ${depId} is cancelled`);
        if (row.call === 'dependency done' || (row.to === 'ready' && row.from === 'blocked'))
          expect(task.blockedReason).toBeNull();
      }
    }, 120_000);

    it('refuses every (from, to) pair the table does not give transitionTask, with the typed refusal', async () => {
      const statuses: TaskStatus[] = [
        'backlog',
        'todo',
        'ready',
        'blocked',
        'dispatched',
        'in_progress',
        'done',
        'failed',
        'cancelled',
      ];
      const allowed = new Set(
        TASK_TRANSITIONS.filter((r) => r.call === 'tasks.transitionTask').map((r) => `${r.from}>${r.to}`),
      );
      const { create } = await runOn();
      let walked = 0;
      for (const from of statuses) {
        // One task in `from` serves every refused pair from it: a refusal changes nothing.
        const { task, dispatch } = await taskIn(create, from);
        for (const to of statuses) {
          if (allowed.has(`${from}>${to}`)) continue;
          const refused = await store.tasks.transitionTask(task.id, { from, to }).catch((e: unknown) => e);
          expect({ from, to, refused }).toMatchObject({
            from,
            to,
            refused: { code: 'TASK_TRANSITION_REFUSED', refusal: 'not_in_table', current: from },
          });
          expect(refused).toBeInstanceOf(TaskTransitionRefusedError);
          walked++;
        }
        expect((await store.tasks.requireTask(task.id)).status).toBe(from);
        if (dispatch) expect((await store.dispatches.getDispatch(dispatch.id))?.status).toBe('active');
      }
      expect(walked).toBe(statuses.length * statuses.length - allowed.size);
    }, 60_000);

    it('walks every row of DISPATCH_TRANSITIONS through the call it names', async () => {
      for (const row of DISPATCH_TRANSITIONS) {
        const { dispatch } = await perform({ ...row, from: 'dispatched' });
        expect({ ...row, status: dispatch?.status }).toEqual({ ...row, status: row.to });
      }
    }, 60_000);

    it('refuses a transition not in the table, a stale from, and ready with open dependencies, changing nothing', async () => {
      const { create } = await runOn();
      const task = await create();
      await expect(store.tasks.transitionTask(task.id, { from: 'ready', to: 'done' })).rejects.toMatchObject({
        code: 'TASK_TRANSITION_REFUSED',
        refusal: 'not_in_table',
      });
      await expect(store.tasks.transitionTask(task.id, { from: 'todo', to: 'ready' })).rejects.toMatchObject({
        code: 'TASK_TRANSITION_REFUSED',
        refusal: 'stale_from',
        current: 'ready',
      });
      const dependent = await create({ dependsOn: [task.id], status: 'blocked' });
      await expect(store.tasks.transitionTask(dependent.id, { from: 'blocked', to: 'ready' })).rejects.toMatchObject({
        code: 'TASK_TRANSITION_REFUSED',
        refusal: 'open_dependencies',
      });
      expect((await store.tasks.requireTask(dependent.id)).status).toBe('blocked');
      expect((await store.tasks.requireTask(task.id)).status).toBe('ready');
    });

    it('createTask starts a task only where the table starts one; open dependencies always store it blocked', async () => {
      const { create } = await runOn();
      for (const status of ['dispatched', 'in_progress', 'done', 'failed', 'cancelled'] as const) {
        const refused = await create({ status: status as never }).catch((e: unknown) => e);
        // Mutant "create-any-status" (createTask checks status against every TaskStatus) fails here.
        expect({ status, refused }).toMatchObject({ status, refused: { code: 'INVALID_ARGUMENT', field: 'status' } });
      }
      const dep = await create();
      for (const status of ['backlog', 'todo', 'ready', 'blocked'] as const) {
        expect((await create({ status })).status).toBe(status);
        const waiting = await create({ status, dependsOn: [dep.id] });
        // Mutant "deps-block-only-ready" (only ready/blocked asks are stored blocked) fails here.
        expect({ ...waiting, asked: status }).toMatchObject({
          status: 'blocked',
          blockedReason: `dependencies: waiting for ${dep.id}`,
        });
      }
      // The README's Library snippet: a task created ready is dispatchable.
      expect((await create({ status: 'ready' })).status).toBe('ready');
    });

    it('completeDispatch ends the dispatch and completes the task in one call, with its result', async () => {
      const { create } = await runOn();
      const task = await create({ spec: { goal: 'x' }, priority: 3 });
      expect(task).toMatchObject({ spec: { goal: 'x' }, priority: 3, blockedReason: null });
      const d = await dispatchOf(task);
      const done = await store.dispatches.completeDispatch(d.id, { result: { lines: 12 } });
      expect(done.dispatch).toMatchObject({ id: d.id, status: 'completed', lease: null });
      expect(done.task).toMatchObject({ id: task.id, status: 'done', result: { lines: 12 } });
      // A later exit of that terminal counts nothing against the finished task.
      expect(await store.dispatches.failActiveDispatchOnExit(d.terminalHandle)).toBeNull();
      await expect(store.dispatches.completeDispatch(d.id)).rejects.toMatchObject({ code: 'DISPATCH_NOT_ACTIVE' });
    });
  });

  describe('gates that gate', () => {
    it('an open gate holds its task out of the ready queue; resolving its last gate releases it', async () => {
      const { run, create } = await runOn();
      const task = await create();
      const g1 = await store.gates.openGate({ question: 'which db?', taskId: task.id });
      const g2 = await store.gates.openGate({ question: 'which port?', taskId: task.id });
      expect(await store.tasks.requireTask(task.id)).toMatchObject({
        status: 'blocked',
        blockedReason: `gate: ${g1.id}`,
      });
      // Mutant "gate-does-not-block" (openGate leaves the task ready) fails here.
      expect(await store.dispatches.dispatchNext({ runId: run.id, terminalHandle: unique('term') })).toBeNull();
      await expect(store.tasks.transitionTask(task.id, { from: 'blocked', to: 'ready' })).rejects.toMatchObject({
        code: 'TASK_TRANSITION_REFUSED',
        refusal: 'open_gate',
      });
      await store.gates.resolveGate(g1.id, 'postgres');
      expect(await store.tasks.requireTask(task.id)).toMatchObject({
        status: 'blocked',
        blockedReason: `gate: ${g2.id}`,
      });
      await store.gates.resolveGate(g2.id, '5432');
      expect(await store.tasks.requireTask(task.id)).toMatchObject({ status: 'ready', blockedReason: null });
      const d = await store.dispatches.dispatchNext({ runId: run.id, terminalHandle: unique('term') });
      expect(d?.taskId).toBe(task.id);
    });

    it('an in-flight task keeps running, but its completion is refused while a gate on it is open', async () => {
      const { create } = await runOn();
      const task = await create();
      const d = await dispatchOf(task);
      const gate = await store.gates.openGate({ question: 'ship it?', taskId: task.id });
      expect((await store.tasks.requireTask(task.id)).status).toBe('dispatched');
      const refused = await store.dispatches.completeDispatch(d.id, { result: { ok: 1 } }).catch((e: unknown) => e);
      // Mutant "completion-ignores-gate" (no requireNoOpenGate in endIn) fails here.
      expect(refused).toBeInstanceOf(GateOpenError);
      expect(refused).toMatchObject({ code: 'GATE_OPEN', taskId: task.id, gateId: gate.id });
      expect((await store.dispatches.getDispatch(d.id))?.status).toBe('active');
      await expect(store.dispatches.endDispatch(d.id, 'completed')).rejects.toBeInstanceOf(GateOpenError);
      await store.gates.resolveGate(gate.id, 'yes');
      expect((await store.tasks.requireTask(task.id)).status).toBe('dispatched');
      expect((await store.dispatches.completeDispatch(d.id)).task.status).toBe('done');
    });

    it('a gate opened in flight still holds its task when the dispatch ends by exit, reclaim or cancel', async () => {
      const { run, create } = await runOn();
      const ends: [string, (d: Dispatch) => Promise<unknown>][] = [
        ['exit', (d) => store.dispatches.failActiveDispatchOnExit(d.terminalHandle)],
        [
          'reclaim',
          async () => {
            clock.advance(1_001);
            return store.dispatches.reclaimExpiredDispatches({ runId: run.id });
          },
        ],
        ['cancel', (d) => store.dispatches.endDispatch(d.id, 'cancelled')],
      ];
      for (const [how, end] of ends) {
        const task = await create();
        const d = await dispatchOf(task, 1_000);
        const gate = await store.gates.openGate({ question: `${how}?`, taskId: task.id });
        await end(d);
        // Mutant "re-ready-ignores-gate" (no openGateOf in moveInFlightTask) fails here.
        expect({ how, ...(await store.tasks.requireTask(task.id)) }).toMatchObject({
          how,
          status: 'blocked',
          blockedReason: `gate: ${gate.id}`,
        });
        expect(await store.dispatches.dispatchNext({ runId: run.id, terminalHandle: unique('term') })).toBeNull();
        await store.gates.resolveGate(gate.id, 'go');
        expect(await store.tasks.requireTask(task.id)).toMatchObject({ status: 'ready', blockedReason: null });
        const again = await store.dispatches.dispatchNext({ runId: run.id, terminalHandle: unique('term') });
        expect(again?.taskId).toBe(task.id);
        await store.dispatches.completeDispatch(again!.id);
      }
    });

    it('a dependency done does not ready a gated task; the resolution does, with the dependencies done', async () => {
      const { create } = await runOn();
      const dep = await create();
      const task = await create({ dependsOn: [dep.id] });
      const gate = await store.gates.openGate({ question: 'go?', taskId: task.id });
      expect((await store.tasks.requireTask(task.id)).status).toBe('blocked');
      await store.dispatches.completeDispatch((await dispatchOf(dep)).id);
      // Mutant "dependency-readies-gated" (no open-gate check in propagateFinish) fails here.
      expect((await store.tasks.requireTask(task.id)).status).toBe('blocked');
      await store.gates.resolveGate(gate.id, 'go');
      expect((await store.tasks.requireTask(task.id)).status).toBe('ready');
      // And a gate resolved before the dependency is done leaves the task waiting on it.
      const dep2 = await create();
      const t2 = await create({ dependsOn: [dep2.id] });
      const g2 = await store.gates.openGate({ question: 'go?', taskId: t2.id });
      await store.gates.resolveGate(g2.id, 'go');
      expect(await store.tasks.requireTask(t2.id)).toMatchObject({
        status: 'blocked',
        blockedReason: expect.stringMatching(/^dependencies: waiting for /),
      });
    });

    it('a gate with ttlMs times out: expireGates reports it, its task stays blocked for the coordinator, a late resolve is refused', async () => {
      const { run, create } = await runOn();
      const task = await create();
      const gate = await store.gates.openGate({ question: 'approve?', taskId: task.id, ttlMs: 1_000 });
      expect(gate.expiresAt).toBe(gate.createdAt + 1_000);
      expect(await store.gates.expireGates({ runId: run.id })).toEqual([]);
      clock.advance(1_001);
      const expired = await store.gates.expireGates({ runId: run.id });
      expect(expired.map((g) => [g.id, g.status])).toEqual([[gate.id, 'timeout']]);
      expect(await store.tasks.requireTask(task.id)).toMatchObject({
        status: 'blocked',
        blockedReason: `gate_timeout: ${gate.id}`,
      });
      const late = await store.gates.resolveGate(gate.id, 'yes').catch((e: unknown) => e);
      expect(late).toBeInstanceOf(GateAlreadyResolvedError);
      expect(late).toMatchObject({ status: 'timeout' });
      expect(await store.gates.listOpenGates(run.id)).toEqual([]);
      // The coordinator goes on without the decision.
      expect((await store.tasks.transitionTask(task.id, { from: 'blocked', to: 'ready' })).status).toBe('ready');
    });
  });

  describe('one active dispatch per terminal', () => {
    it('refuses a second dispatch on a busy terminal with TerminalBusyError, also when they race', async () => {
      const { create } = await runOn();
      const tasks = await Promise.all(Array.from({ length: 8 }, () => create()));
      const terminal = unique('term');
      const outcomes = await Promise.allSettled(
        tasks.map((t) => store.dispatches.createDispatch({ taskId: t.id, terminalHandle: terminal })),
      );
      expect(outcomes.filter((o) => o.status === 'fulfilled')).toHaveLength(1);
      for (const o of outcomes) if (o.status === 'rejected') expect(o.reason).toBeInstanceOf(TerminalBusyError);
      // The losers' tasks are still ready: nothing of their transaction stayed.
      const statuses = await Promise.all(tasks.map(async (t) => (await store.tasks.requireTask(t.id)).status));
      expect(statuses.filter((s) => s === 'dispatched')).toHaveLength(1);
      expect(statuses.filter((s) => s === 'ready')).toHaveLength(7);
    });

    it("ends the terminal's active work exactly once on exit, and an exit naming an old dispatch fails nothing new", async () => {
      const { create } = await runOn();
      const task = await create();
      const terminal = unique('term');
      const old = await store.dispatches.createDispatch({ taskId: task.id, terminalHandle: terminal });
      const exits = await Promise.all(
        Array.from({ length: 4 }, () => store.dispatches.failActiveDispatchOnExit(terminal)),
      );
      expect(exits.filter((e) => e !== null)).toHaveLength(1);
      expect(exits.find((e) => e !== null)).toMatchObject({ failureCount: 1, taskStatus: 'ready' });
      const fresh = await store.dispatches.createDispatch({ taskId: task.id, terminalHandle: terminal });
      // A reaper acting on the old dispatch does not fail the terminal's new, healthy one.
      expect(await store.dispatches.failActiveDispatchOnExit(terminal, { dispatchId: old.id })).toBeNull();
      expect((await store.dispatches.getDispatch(fresh.id))?.status).toBe('active');
      expect(await store.dispatches.listDispatches({ terminalHandle: terminal, status: 'active' })).toHaveLength(1);
    });
  });

  describe('dependencies and the ready queue', () => {
    it('stores a task with open dependencies blocked, readies it when the last is done, blocks it on a failure', async () => {
      const { create } = await runOn();
      const a = await create();
      const b = await create();
      const c = await create({ dependsOn: [a.id, b.id] });
      expect(c).toMatchObject({ status: 'blocked' });
      expect(c.blockedReason).toContain(a.id);
      expect((await store.tasks.listDependencies(c.id)).map((d) => d.dependsOnId)).toEqual([a.id, b.id]);
      await store.dispatches.completeDispatch((await dispatchOf(a)).id);
      expect((await store.tasks.requireTask(c.id)).status).toBe('blocked');
      const done = await store.dispatches.completeDispatch((await dispatchOf(b)).id);
      expect(done.task.status).toBe('done');
      expect((await store.tasks.requireTask(c.id)).status).toBe('ready');

      const d = await create();
      const e = await create({ dependsOn: [d.id] });
      await failTimes(d, 3);
      expect((await store.tasks.requireTask(d.id)).status).toBe('failed');
      expect(await store.tasks.requireTask(e.id)).toMatchObject({
        status: 'blocked',
        blockedReason: `dependency_failed: task ${d.id} is failed`,
      });
      // Retry of the dependency, then its completion, readies the dependent.
      await store.tasks.transitionTask(d.id, { from: 'failed', to: 'ready' });
      await store.dispatches.completeDispatch((await dispatchOf(d)).id);
      expect((await store.tasks.requireTask(e.id)).status).toBe('ready');
    });

    it('refuses cycles and edges across runs and targets, atomically under concurrent inserts', async () => {
      const { create } = await runOn();
      const other = await runOn();
      const a = await create();
      const b = await create();
      const c = await create();
      await store.tasks.addDependency(b.id, a.id);
      await store.tasks.addDependency(c.id, b.id);
      await expect(store.tasks.addDependency(a.id, c.id)).rejects.toMatchObject({ refusal: 'cycle' });
      await expect(store.tasks.addDependency(a.id, a.id)).rejects.toMatchObject({ refusal: 'self' });
      const foreign = await other.create();
      await expect(store.tasks.addDependency(a.id, foreign.id)).rejects.toMatchObject({ refusal: 'cross_target' });
      await expect(create({ dependsOn: [foreign.id] })).rejects.toBeInstanceOf(TaskDependencyRefusedError);
      // Two edges that together close a cycle, inserted at once: exactly one is kept.
      for (let round = 0; round < 5; round++) {
        const x = await create();
        const y = await create();
        const outcomes = await Promise.allSettled([
          store.tasks.addDependency(x.id, y.id),
          store.tasks.addDependency(y.id, x.id),
        ]);
        expect(outcomes.filter((o) => o.status === 'fulfilled')).toHaveLength(1);
        const rejected = outcomes.find((o) => o.status === 'rejected');
        expect(rejected?.reason).toMatchObject({ code: 'TASK_DEPENDENCY_REFUSED', refusal: 'cycle' });
      }
    });

    it('dispatchNext takes the highest priority, then the oldest, ready task whose dependencies are done; null when none', async () => {
      const { run, create } = await runOn();
      const low = await create({ priority: 1 });
      const highOld = await create({ priority: 5 });
      const highNew = await create({ priority: 5 });
      const gate = await create({ priority: 0 });
      const waiting = await create({ priority: 9, dependsOn: [gate.id] });
      const order: string[] = [];
      for (let i = 0; i < 4; i++) {
        const d = await store.dispatches.dispatchNext({ runId: run.id, terminalHandle: unique('term') });
        order.push(d!.taskId);
      }
      expect(order).toEqual([highOld.id, highNew.id, low.id, gate.id]);
      expect(await store.dispatches.dispatchNext({ runId: run.id, terminalHandle: unique('term') })).toBeNull();
      const gateDispatch = (await store.dispatches.listDispatches({ taskId: gate.id }))[0]!;
      await store.dispatches.completeDispatch(gateDispatch.id);
      const terminals = [unique('term'), unique('term')];
      const batch = await store.dispatches.dispatchNextBatch({ runId: run.id, terminalHandles: terminals });
      expect(batch.map((d) => d.taskId)).toEqual([waiting.id]);
      await expect(
        store.dispatches.dispatchNext({ runId: run.id, terminalHandle: batch[0]!.terminalHandle }),
      ).rejects.toBeInstanceOf(TerminalBusyError);
    });
  });

  describe('claim-next: refusals', () => {
    it('a refused dispatchNext (busy terminal, missing agent, stopped run) claims and writes nothing', async () => {
      const { run, create } = await runOn();
      await create({ priority: 5 });
      const waiting = await create({ priority: 1 });
      const terminal = unique('term');
      await store.dispatches.dispatchNext({ runId: run.id, terminalHandle: terminal });
      const untouched = async () => {
        expect((await store.tasks.getTask(waiting.id))?.status).toBe('ready');
        expect(await store.dispatches.listDispatches({ taskId: waiting.id })).toEqual([]);
      };
      // On PostgreSQL the call's BEGIN also commits: its guards alone keep these from claiming.
      await expect(store.dispatches.dispatchNext({ runId: run.id, terminalHandle: terminal })).rejects.toBeInstanceOf(
        TerminalBusyError,
      );
      await untouched();
      await expect(
        store.dispatches.dispatchNext({ runId: run.id, terminalHandle: unique('term'), agentId: 'no-such-agent' }),
      ).rejects.toMatchObject({ code: 'NOT_FOUND' });
      await untouched();
      await store.runs.stopCoordinatorRun(run.id, 'completed');
      await expect(
        store.dispatches.dispatchNext({ runId: run.id, terminalHandle: unique('term') }),
      ).rejects.toMatchObject({ code: 'COORDINATOR_RUN_NOT_RUNNING' });
      await untouched();
    });

    it('a refused dispatchNextBatch (missing agent, stopped run) refuses typed and claims nothing', async () => {
      const { run, create } = await runOn();
      const waiting = await create({ priority: 1 });
      const terminals = [unique('term'), unique('term')];
      const untouched = async () => {
        expect((await store.tasks.getTask(waiting.id))?.status).toBe('ready');
        expect(await store.dispatches.listDispatches({ taskId: waiting.id })).toEqual([]);
      };
      // Mutant "batch-fn-no-guards" (the batch function claims whatever its guards read) reaches
      // the insert with the missing agent: a raw foreign-key error instead of NOT_FOUND.
      await expect(
        store.dispatches.dispatchNextBatch({ runId: run.id, terminalHandles: terminals, agentId: 'no-such-agent' }),
      ).rejects.toMatchObject({ code: 'NOT_FOUND' });
      await untouched();
      await store.runs.stopCoordinatorRun(run.id, 'completed');
      await expect(
        store.dispatches.dispatchNextBatch({ runId: run.id, terminalHandles: terminals }),
      ).rejects.toMatchObject({ code: 'COORDINATOR_RUN_NOT_RUNNING' });
      await untouched();
      await expect(
        store.dispatches.dispatchNextBatch({ runId: 'no-such-run', terminalHandles: terminals }),
      ).rejects.toMatchObject({ code: 'NOT_FOUND' });
    });
  });

  describe('the worker loop: completeDispatch with next', () => {
    it("completes, readies the dependents, and claims the terminal's next task in the same call", async () => {
      const { run, create } = await runOn();
      const first = await create({ priority: 5 });
      const last = await create({ priority: 1 });
      const unlocked = await create({ priority: 9, dependsOn: [first.id] });
      const terminal = unique('term');
      const d = (await store.dispatches.dispatchNext({ runId: run.id, terminalHandle: terminal }))!;
      expect(d.taskId).toBe(first.id);
      // The claim runs after the completion in its transaction: it sees the dependent it readied.
      // Mutant "next-before-complete" (the function claims, then completes) finds the terminal
      // busy and claims nothing here.
      const done = await store.dispatches.completeDispatch(d.id, { lease: d.lease!, result: { n: 1 }, next: true });
      expect(done.dispatch).toMatchObject({ id: d.id, status: 'completed', lease: null });
      expect(done.task).toMatchObject({ id: first.id, status: 'done', result: { n: 1 } });
      expect(done.next).toMatchObject({ taskId: unlocked.id, terminalHandle: terminal, status: 'active' });
      expect(done.next!.lease).toMatchObject({ kind: 'dispatch', resource: done.next!.id, token: done.next!.seq });
      expect((await store.tasks.requireTask(unlocked.id)).status).toBe('dispatched');
      const second = await store.dispatches.completeDispatch(done.next!.id, { lease: done.next!.lease!, next: {} });
      expect(second.next).toMatchObject({ taskId: last.id, terminalHandle: terminal });
      const third = await store.dispatches.completeDispatch(second.next!.id, {
        lease: second.next!.lease!,
        next: true,
      });
      expect(third.task.status).toBe('done');
      expect(third.next).toBeNull();
      expect(await store.dispatches.listDispatches({ runId: run.id, status: 'active' })).toEqual([]);
      // Without next, the result has no next.
      const plain = await create();
      const p = (await store.dispatches.dispatchNext({ runId: run.id, terminalHandle: terminal }))!;
      expect(p.taskId).toBe(plain.id);
      expect('next' in (await store.dispatches.completeDispatch(p.id))).toBe(false);
    });

    it("next takes dispatchNext's options: the agent, the filter, the lease's lifetime", async () => {
      const { run, create } = await runOn();
      const agent = await store.org.createAgent({ companyId: company, name: unique('agent') });
      await create({ priority: 1 });
      const mine = await create({ priority: 2, assigneeAgentId: agent.id });
      const first = await create({ priority: 9 });
      const terminal = unique('term');
      const d = (await store.dispatches.dispatchNext({ runId: run.id, terminalHandle: terminal }))!;
      expect(d.taskId).toBe(first.id);
      const before = clock.now();
      const done = await store.dispatches.completeDispatch(d.id, {
        next: { agentId: agent.id, filter: { assigneeAgentId: agent.id, minPriority: 2 }, ttlMs: 5_000 },
      });
      expect(done.next).toMatchObject({ taskId: mine.id, agentId: agent.id });
      expect(done.next!.leaseExpiresAt! - before).toBeGreaterThanOrEqual(5_000);
      expect(done.next!.leaseExpiresAt! - before).toBeLessThan(60_000);
      await expect(store.dispatches.completeDispatch(d.id, { next: 'yes' as never })).rejects.toMatchObject({
        code: 'INVALID_ARGUMENT',
      });
    });

    it('a refused completion claims nothing; a missing agent refuses before anything changes; a stopped run keeps the completion', async () => {
      const { run, create } = await runOn();
      const waiting = await create({ priority: 1 });
      const gated = await create({ priority: 9 });
      const terminal = unique('term');
      const d = (await store.dispatches.dispatchNext({ runId: run.id, terminalHandle: terminal }))!;
      expect(d.taskId).toBe(gated.id);
      const untouched = async () => {
        expect((await store.tasks.getTask(waiting.id))?.status).toBe('ready');
        expect(await store.dispatches.listDispatches({ taskId: waiting.id })).toEqual([]);
      };
      // An open gate refuses the completion: nothing is claimed (the terminal is still busy).
      const gate = await store.gates.openGate({ question: 'go?', taskId: gated.id });
      await expect(store.dispatches.completeDispatch(d.id, { next: true })).rejects.toBeInstanceOf(GateOpenError);
      await untouched();
      await store.gates.resolveGate(gate.id, 'yes');
      // A missing agent: NOT_FOUND, and the dispatch is still active (mutant "next-agent-after-complete"
      // checks the agent after completing: the completion would stand).
      await expect(
        store.dispatches.completeDispatch(d.id, { lease: d.lease!, next: { agentId: 'no-such-agent' } }),
      ).rejects.toMatchObject({ code: 'NOT_FOUND' });
      expect((await store.dispatches.getDispatch(d.id))?.status).toBe('active');
      expect((await store.tasks.requireTask(gated.id)).status).toBe('dispatched');
      await untouched();
      // A reclaimed dispatch: its late completion is refused and claims nothing, though the
      // terminal is free (mutant "next-after-refusal" claims here).
      await store.db.updateTable('dispatch_contexts').set({ lease_expires_at: 1 }).where('id', '=', d.id).execute();
      await store.dispatches.reclaimExpiredDispatches({ runId: run.id });
      await expect(store.dispatches.completeDispatch(d.id, { lease: d.lease!, next: true })).rejects.toBeInstanceOf(
        DispatchLeaseLostError,
      );
      expect(await store.dispatches.getActiveDispatchForTerminal(terminal)).toBeNull();
      await untouched();
      // A run stopped meanwhile: the completion stands, and nothing is claimed.
      const again = (await store.dispatches.dispatchNext({ runId: run.id, terminalHandle: terminal }))!;
      expect(again.taskId).toBe(gated.id);
      await store.runs.stopCoordinatorRun(run.id, 'completed');
      const done = await store.dispatches.completeDispatch(again.id, { lease: again.lease!, next: true });
      expect(done.task.status).toBe('done');
      expect(done.next).toBeNull();
      await untouched();
    });

    it('a keyed completion with next replays its next dispatch; another terminal claim in between is TerminalBusyError, nothing lost', async () => {
      const { run, create } = await runOn();
      await create({ priority: 1 });
      await create({ priority: 2 });
      const terminal = unique('term');
      const d = (await store.dispatches.dispatchNext({ runId: run.id, terminalHandle: terminal }))!;
      const key = unique('key');
      const done = await store.dispatches.completeDispatch(d.id, { idempotencyKey: key, next: true });
      const replay = await store.dispatches.completeDispatch(d.id, { idempotencyKey: key, next: true });
      expect(replay.next?.id).toBe(done.next!.id);
      await expect(store.dispatches.completeDispatch(d.id, { idempotencyKey: key })).rejects.toMatchObject({
        code: 'IDEMPOTENCY_KEY_CONFLICT',
      });
      expect(await store.dispatches.listDispatches({ runId: run.id, status: 'active' })).toHaveLength(1);
    });
  });

  describe('claim-next: batches and filters', () => {
    it('dispatchNextBatch fills terminals in order with the best ready tasks, up to limit, skipping busy ones', async () => {
      const { run, create } = await runOn();
      const p1 = await create({ priority: 1 });
      const p7old = await create({ priority: 7 });
      const p3 = await create({ priority: 3 });
      const p7new = await create({ priority: 7 });
      const p0 = await create({ priority: 0 });
      const terminals = Array.from({ length: 5 }, () => unique('term'));
      // Mutant "batch-ignores-limit" (no limit check in the loop) fails here.
      const first = await store.dispatches.dispatchNextBatch({ runId: run.id, terminalHandles: terminals, limit: 3 });
      expect(first.map((d) => [d.terminalHandle, d.taskId])).toEqual([
        [terminals[0], p7old.id],
        [terminals[1], p7new.id],
        [terminals[2], p3.id],
      ]);
      expect(first.every((d) => d.status === 'active' && d.lease !== null)).toBe(true);
      expect((await store.tasks.requireTask(p1.id)).status).toBe('ready');
      // The default limit is one per terminal; a busy terminal is skipped, not refused.
      const more = [unique('term'), unique('term'), unique('term')];
      const second = await store.dispatches.dispatchNextBatch({
        runId: run.id,
        terminalHandles: [terminals[0]!, ...more],
      });
      expect(second.map((d) => [d.terminalHandle, d.taskId])).toEqual([
        [more[0], p1.id],
        [more[1], p0.id],
      ]);
      expect(await store.dispatches.dispatchNextBatch({ runId: run.id, terminalHandles: [unique('term')] })).toEqual(
        [],
      );
      await expect(
        store.dispatches.dispatchNextBatch({ runId: run.id, terminalHandles: [unique('term')], limit: 0 }),
      ).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', field: 'limit' });
    });

    it('dispatchNext filters by assignee (an agent, or null for unassigned) and minPriority, then ranks by priority', async () => {
      const { run, create } = await runOn();
      const a = await store.org.createAgent({ companyId: company, name: unique('a'), role: 'engineer' });
      const b = await store.org.createAgent({ companyId: company, name: unique('b'), role: 'engineer' });
      const aLow = await create({ priority: 1, assigneeAgentId: a.id });
      const aHigh = await create({ priority: 8, assigneeAgentId: a.id });
      const bTop = await create({ priority: 9, assigneeAgentId: b.id });
      const none5 = await create({ priority: 5 });
      const none2 = await create({ priority: 2 });
      const next = async (filter?: { assigneeAgentId?: string | null; minPriority?: number }) =>
        (await store.dispatches.dispatchNext({ runId: run.id, terminalHandle: unique('term'), filter }))?.taskId ??
        null;
      // Mutant "filter-assignee-ignored" fails the first two; "filter-min-priority-ignored" the next two.
      expect(await next({ assigneeAgentId: a.id })).toBe(aHigh.id);
      expect(await next({ assigneeAgentId: null })).toBe(none5.id);
      expect(await next({ minPriority: 6 })).toBe(bTop.id);
      expect(await next({ minPriority: 6 })).toBeNull();
      expect(await next({ assigneeAgentId: a.id, minPriority: 2 })).toBeNull();
      expect(await next({ assigneeAgentId: b.id })).toBeNull();
      expect(await next({ assigneeAgentId: a.id })).toBe(aLow.id);
      expect(await next({ assigneeAgentId: null, minPriority: 2 })).toBe(none2.id);
      expect(await next()).toBeNull();
      // The batch form takes the same filter.
      const c = await create({ priority: 4, assigneeAgentId: b.id });
      const d = await create({ priority: 6 });
      const batch = await store.dispatches.dispatchNextBatch({
        runId: run.id,
        terminalHandles: [unique('term'), unique('term')],
        filter: { assigneeAgentId: b.id },
      });
      expect(batch.map((x) => x.taskId)).toEqual([c.id]);
      expect((await store.tasks.requireTask(d.id)).status).toBe('ready');
      await expect(
        store.dispatches.dispatchNext({ runId: run.id, terminalHandle: unique('term'), filter: { minPriority: 1.5 } }),
      ).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', field: 'filter.minPriority' });
    });
  });

  describe('dispatch leases', () => {
    it('heartbeats extend the lease; an expired dispatch is reclaimed once and its late reports are refused', async () => {
      const { run, create } = await runOn();
      const task = await create();
      const d = await dispatchOf(task, 1_000);
      expect(d.lease).toMatchObject({ kind: 'dispatch', resource: d.id, token: d.seq, holder: d.terminalHandle });
      clock.advance(600);
      const renewed = await store.dispatches.heartbeatDispatch(d.lease!, { ttlMs: 1_000 });
      expect(renewed.expiresAt).toBeGreaterThan(d.lease!.expiresAt);
      clock.advance(600);
      expect(await store.dispatches.reclaimExpiredDispatches({ runId: run.id })).toEqual([]);
      await store.transaction(async (tx) => tx.assertLease(renewed));
      clock.advance(1_000);
      const [a, b] = await Promise.all([
        store.dispatches.reclaimExpiredDispatches({ runId: run.id }),
        store.dispatches.reclaimExpiredDispatches({ runId: run.id }),
      ]);
      expect([...a, ...b]).toHaveLength(1);
      expect([...a, ...b][0]).toMatchObject({
        taskStatus: 'ready',
        failureCount: 1,
        dispatch: { error: 'lease_expired' },
      });
      // The late worker: every report with the old token is refused and changes nothing.
      await expect(store.dispatches.completeDispatch(d.id, { lease: renewed })).rejects.toMatchObject({
        code: 'DISPATCH_LEASE_LOST',
        reason: 'expired',
      });
      await expect(store.dispatches.heartbeatDispatch(renewed)).rejects.toBeInstanceOf(DispatchLeaseLostError);
      await expect(store.transaction(async (tx) => tx.assertLease(renewed))).rejects.toBeInstanceOf(
        DispatchLeaseLostError,
      );
      const again = await dispatchOf(await store.tasks.requireTask(task.id));
      await expect(store.dispatches.completeDispatch(d.id)).rejects.toMatchObject({ reason: 'superseded' });
      expect((await store.tasks.requireTask(task.id)).status).toBe('dispatched');
      expect((await store.dispatches.getDispatch(again.id))?.status).toBe('active');
    });
  });

  describe('legacy dispatches without a lease', () => {
    it('are reclaimed one default lease TTL after their last update, exactly like a lapsed lease', async () => {
      const { run, create } = await runOn();
      const now = clock.now();
      /** A dispatch as a release before 0090's lease wrote it: active, `lease_expires_at` NULL. */
      async function legacyDispatch(updatedAt: number) {
        const task = await create();
        await store.db.updateTable('tasks').set({ status: 'dispatched' }).where('id', '=', task.id).execute();
        const id = unique('legacy');
        await sql`insert into ${tbl(store.db, 'dispatch_contexts')}
            (id, task_id, terminal_handle, status, created_at, updated_at, coordinator_run_id, lease_expires_at)
            values (${id}, ${task.id}, ${unique('term')}, 'active', ${updatedAt}, ${updatedAt}, ${run.id}, null)`.execute(
          store.db,
        );
        return { task, id };
      }
      const old = await legacyDispatch(now - DEFAULT_DISPATCH_LEASE_TTL_MS - 1);
      const recent = await legacyDispatch(now);
      expect((await store.dispatches.getDispatch(old.id))?.lease).toBeNull();

      // Mutant "legacy-never-expires" (the reclaim query without its NULL branch) fails here.
      const first = await store.dispatches.reclaimExpiredDispatches({ runId: run.id });
      expect(first.map((r) => r.dispatch.id)).toEqual([old.id]);
      expect(first[0]).toMatchObject({ taskStatus: 'ready', failureCount: 1, dispatch: { error: 'lease_expired' } });
      expect((await store.tasks.requireTask(old.task.id)).status).toBe('ready');
      // Mutant "legacy-expired-at-once" (NULL counted as lapsed whatever its age) fails here.
      expect((await store.dispatches.getDispatch(recent.id))?.status).toBe('active');

      clock.advance(DEFAULT_DISPATCH_LEASE_TTL_MS + 1);
      const second = await store.dispatches.reclaimExpiredDispatches({ runId: run.id });
      expect(second.map((r) => r.dispatch.id)).toEqual([recent.id]);
      expect((await store.tasks.requireTask(recent.task.id)).status).toBe('ready');
      // The late legacy worker's report is refused like any reclaimed worker's.
      await expect(store.dispatches.completeDispatch(recent.id)).rejects.toMatchObject({
        code: 'DISPATCH_LEASE_LOST',
        reason: 'expired',
      });
      expect(await store.dispatches.reclaimExpiredDispatches({ runId: run.id })).toEqual([]);
    });
  });

  describe('dispatch lease renewal', () => {
    it('a heartbeat never revives a lapsed dispatch lease: refused expired, and the dispatch stays reclaimable', async () => {
      const { run, create } = await runOn();
      const task = await create();
      const d = await dispatchOf(task, 1_000);
      clock.advance(1_001);
      const refused = await store.dispatches.heartbeatDispatch(d.lease!, { ttlMs: 60_000 }).catch((e: unknown) => e);
      // Mutant "heartbeat-revives" (no lease_expires_at > now in heartbeatDispatch) fails here.
      expect(refused).toBeInstanceOf(DispatchLeaseLostError);
      expect(refused).toMatchObject({ code: 'DISPATCH_LEASE_LOST', reason: 'expired', dispatchId: d.id });
      expect((await store.dispatches.getDispatch(d.id))?.leaseExpiresAt).toBe(d.lease!.expiresAt);
      const reclaimed = await store.dispatches.reclaimExpiredDispatches({ runId: run.id });
      expect(reclaimed.map((r) => r.dispatch.id)).toEqual([d.id]);
    });
  });

  describe('path claims and results follow the table and the dispatch lease', () => {
    async function pathTask(create: (extra?: object) => Promise<Task>, extra: object = {}) {
      const workspaceId = (await store.org.createWorkspace({ companyId: company, name: unique('ws') })).id;
      return create({ workspaceId, writes: [], ...extra });
    }

    it('claimTask and submitTaskResult refuse a task the table does not let them move, changing nothing', async () => {
      const { create } = await runOn();
      for (const status of ['backlog', 'todo', 'blocked'] as const) {
        const task = await pathTask(create, { status });
        const refused = await store.paths.claimTask(task.id, 'worker').catch((e: unknown) => e);
        // Mutant "claim-any-status" (no CLAIMABLE check in claimTask) fails here.
        expect(refused).toBeInstanceOf(TaskTransitionRefusedError);
        expect(refused).toMatchObject({ from: status, to: 'in_progress', refusal: 'not_in_table' });
        const result = await store.paths.submitTaskResult(task.id, 'worker', { status: 'done' }).catch((e) => e);
        // Mutant "submit-any-status" (no SUBMITTABLE check in submitTaskResult) fails here.
        expect(result).toMatchObject({ code: 'TASK_TRANSITION_REFUSED', from: status, to: 'done' });
        expect((await store.tasks.requireTask(task.id)).status).toBe(status);
      }
      // A dispatched task that nobody claimed takes no result either.
      const dispatched = await pathTask(create);
      const d = await dispatchOf(dispatched);
      await expect(
        store.paths.submitTaskResult(dispatched.id, 'worker', { status: 'done', dispatchLease: d.lease! }),
      ).rejects.toMatchObject({ code: 'TASK_TRANSITION_REFUSED', from: 'dispatched' });
      expect((await store.dispatches.getDispatch(d.id))?.status).toBe('active');
    });

    it("after a takeover, the old worker's result is refused and the new holder's dispatch stays active", async () => {
      const { run, create } = await runOn();
      const task = await pathTask(create);
      const old = await dispatchOf(task, 1_000);
      const oldClaim = await store.paths.claimTask(task.id, 'worker-a', { dispatchLease: old.lease! });
      if (oldClaim.status !== 'acquired') throw new Error('claim busy');
      clock.advance(1_001);
      expect(await store.dispatches.reclaimExpiredDispatches({ runId: run.id })).toHaveLength(1);
      // While the task waits in the queue, the old worker's result is not the table's (ready → done).
      await expect(store.paths.submitTaskResult(task.id, oldClaim.lease, { status: 'done' })).rejects.toBeInstanceOf(
        TaskTransitionRefusedError,
      );
      const fresh = await dispatchOf(await store.tasks.requireTask(task.id));
      await store.tasks.transitionTask(task.id, { from: 'dispatched', to: 'in_progress' });
      // Mutant "dispatch-keeps-claim" (insertDispatch leaves the task's path claim) fails here.
      await expect(store.paths.submitTaskResult(task.id, oldClaim.lease, { status: 'done' })).rejects.toMatchObject({
        code: 'PATH_LEASE_LOST',
        reason: 'superseded',
      });
      // Mutant "no-dispatch-fence" (requireTaskDispatchLease ignores the lease) fails here.
      await expect(
        store.paths.submitTaskResult(task.id, 'worker-a', { status: 'done', dispatchLease: old.lease! }),
      ).rejects.toMatchObject({ code: 'DISPATCH_LEASE_LOST', reason: 'superseded' });
      await expect(store.paths.submitTaskResult(task.id, 'worker-a', { status: 'failed' })).rejects.toMatchObject({
        code: 'PATH_CLAIM_REFUSED',
        reason: 'not_dispatch_holder',
      });
      await expect(store.paths.claimTask(task.id, 'worker-a', { dispatchLease: old.lease! })).rejects.toBeInstanceOf(
        DispatchLeaseLostError,
      );
      expect((await store.tasks.requireTask(task.id)).status).toBe('in_progress');
      expect((await store.dispatches.getDispatch(fresh.id))?.status).toBe('active');
      // The new holder claims under its dispatch and reports with its lease.
      const claim = await store.paths.claimTask(task.id, 'worker-b', { dispatchLease: fresh.lease! });
      if (claim.status !== 'acquired') throw new Error('claim busy');
      await store.paths.submitTaskResult(task.id, claim.lease, { status: 'done', dispatchLease: fresh.lease! });
      expect((await store.tasks.requireTask(task.id)).status).toBe('done');
      expect((await store.dispatches.getDispatch(fresh.id))?.status).toBe('completed');
    });
  });

  describe('run start and dispatchRun', () => {
    it('adopts only unfinished tasks; dispatchRun refuses blocked and finished tasks', async () => {
      const targetKey = `worktree:${unique('adopt')}`;
      const first = await store.runs.startCoordinatorRun({ targetKey });
      const mk = () =>
        store.tasks.createTask({
          companyId: company,
          title: 't',
          targetKey,
          requiresFilesystem: false,
          status: 'ready',
        });
      const finished = await mk();
      const open = await mk();
      await store.dispatches.completeDispatch((await dispatchOf(finished)).id);
      await store.runs.stopCoordinatorRun(first.id, 'completed');
      const second = await store.runs.startCoordinatorRun({ targetKey });
      expect(second.adoptedTaskCount).toBe(1);
      expect((await store.tasks.requireTask(finished.id)).coordinatorRunId).toBe(first.id);
      expect((await store.tasks.requireTask(open.id)).coordinatorRunId).toBe(second.id);
      const agent = await store.org.createAgent({ companyId: company, name: 'dev', role: 'engineer' });
      await expect(
        store.scheduler.dispatchRun({ taskId: finished.id, agentId: agent.id, runId: second.id, mode: 'heartbeat' }),
      ).rejects.toMatchObject({ code: 'TASK_NOT_DISPATCHABLE', status: 'done' });
    });

    it("a finish reaches its dependents through task_dependencies, never reading the store's blocked or ready tasks", async () => {
      const statements: { sql: string; parameters: readonly unknown[] }[] = [];
      const own = await fx.freshStore({ onQuery: (q) => statements.push(q) });
      try {
        const ownCompany = (await own.org.createCompany({ name: 'finish' })).id;
        // 3,000 blocked and 3,000 ready tasks elsewhere in the store.
        const values = Array.from(
          { length: 6_000 },
          (_, i) =>
            sql`(${`bg${i}`}, ${ownCompany}, 't', ${i % 2 ? 'blocked' : 'ready'}, 0, 0, ${i % 2 ? 'dependencies: waiting for x' : null}, 0)`,
        );
        for (let i = 0; i < values.length; i += 500) {
          await sql`insert into ${tbl(own.db, 'tasks')} (id, company_id, title, status, created_at, updated_at, blocked_reason, requires_filesystem)
            values ${sql.join(values.slice(i, i + 500))}`.execute(own.db);
        }
        if (fx.kind === 'postgres') await sql`analyze ${tbl(own.db, 'tasks')}`.execute(own.db);
        const base = { companyId: ownCompany, title: 't', requiresFilesystem: false };
        const done = await own.tasks.createTask({ ...base, status: 'ready' });
        const cancelled = await own.tasks.createTask({ ...base, status: 'ready' });
        for (const dep of [done, cancelled]) await own.tasks.createTask({ ...base, dependsOn: [dep.id] });
        const dispatch = await own.dispatches.createDispatch({ taskId: done.id, terminalHandle: unique('term') });
        statements.length = 0;
        await own.dispatches.endDispatch(dispatch.id, 'completed');
        await own.tasks.transitionTask(cancelled.id, { from: 'ready', to: 'cancelled' });
        // The dependents' moves: to ready (the done task's) and to blocked (the cancelled one's).
        // PostgreSQL completes in a function (0104), whose plans kept-plans.test.ts counts: only the
        // cancellation's move is a statement there.
        const moves = statements.filter((q) =>
          /^\s*update (?:"?\w+"?\.)?"?tasks"? set status = '(ready|blocked)'/.test(q.sql),
        );
        expect(moves.length, statements.map((q) => q.sql).join('\n')).toBe(fx.kind === 'postgres' ? 1 : 2);
        const explain = fx.kind === 'postgres' ? 'explain ' : 'explain query plan ';
        for (const q of moves) {
          const plan = JSON.stringify(
            (await own.db.executeQuery(CompiledQuery.raw(explain + q.sql, [...q.parameters]))).rows,
          );
          // Mutant "the re-checks as plain `status = …`": SQLite walks tasks_status_idx, every blocked
          // task of the store (and every ready one for the cancellation).
          expect(plan, q.sql).not.toContain('tasks_status_idx');
          expect(plan, q.sql).toContain('task_dependencies');
        }
      } finally {
        await own.close();
      }
    });

    it('run start reaches the target through tasks_unfinished_target_idx, never reading its history', async () => {
      const statements: { sql: string; parameters: readonly unknown[] }[] = [];
      const own = await fx.freshStore({ onQuery: (q) => statements.push(q) });
      try {
        const ownCompany = (await own.org.createCompany({ name: 'history' })).id;
        const targetKey = `worktree:${unique('history')}`;
        // 3,000 finished tasks of the target: its history.
        const values = Array.from(
          { length: 3_000 },
          (_, i) => sql`(${`h${i}`}, ${ownCompany}, 't', 'done', 0, 0, ${targetKey}, 0)`,
        );
        for (let i = 0; i < values.length; i += 500) {
          await sql`insert into ${tbl(own.db, 'tasks')} (id, company_id, title, status, created_at, updated_at, target_key, requires_filesystem)
            values ${sql.join(values.slice(i, i + 500))}`.execute(own.db);
        }
        if (fx.kind === 'postgres') await sql`analyze ${tbl(own.db, 'tasks')}`.execute(own.db);
        statements.length = 0;
        const run = await own.runs.startCoordinatorRun({ targetKey });
        expect(run.adoptedTaskCount).toBe(0);
        // The adoption's UPDATE, alone (SQLite) or a CTE of one statement (PostgreSQL: ADOPT_ALL).
        const adopt = statements.find((q) => /update ("\w+"\.)?"?tasks"? set "coordinator_run_id"/.test(q.sql));
        if (!adopt) throw new Error(`no adoption statement among ${statements.length}`);
        const explain = fx.kind === 'postgres' ? 'explain ' : 'explain query plan ';
        const plan = await own.db.executeQuery(CompiledQuery.raw(explain + adopt.sql, [...adopt.parameters]));
        // Mutant "adoption states the statuses as parameters": SQLite cannot match the partial index.
        expect(JSON.stringify(plan.rows)).toContain('tasks_unfinished_target_idx');
      } finally {
        await own.close();
      }
    });

    it('dispatchRun refuses a task blocked by a dependency or a gate, done, failed or cancelled, and leases nothing', async () => {
      const { run, create } = await runOn();
      const agent = await store.org.createAgent({ companyId: company, name: 'dev', role: 'engineer' });
      const dep = await create();
      const byDependency = await create({ dependsOn: [dep.id] });
      const byGate = await create();
      await store.gates.openGate({ question: 'go?', taskId: byGate.id });
      const finished = await create();
      await store.dispatches.completeDispatch((await dispatchOf(finished)).id);
      const failed = await create();
      await failTimes(failed, 3);
      const cancelled = await create();
      await store.tasks.transitionTask(cancelled.id, { from: 'ready', to: 'cancelled' });
      const cases: [Task, TaskStatus][] = [
        [byDependency, 'blocked'],
        [byGate, 'blocked'],
        [finished, 'done'],
        [failed, 'failed'],
        [cancelled, 'cancelled'],
      ];
      for (const [task, status] of cases) {
        expect((await store.tasks.requireTask(task.id)).status).toBe(status);
        const refused = await store.scheduler
          .dispatchRun({ taskId: task.id, agentId: agent.id, runId: run.id, mode: 'heartbeat' })
          .catch((e: unknown) => e);
        expect(refused).toBeInstanceOf(TaskNotDispatchableError);
        expect(refused).toMatchObject({ code: 'TASK_NOT_DISPATCHABLE', taskId: task.id, status });
        // Refused inside the claim's transaction, before the upsert: no lease row, no token spent.
        expect(
          await store.db.selectFrom('task_leases').select('token').where('task_id', '=', task.id).executeTakeFirst(),
        ).toBeUndefined();
      }
      // Keyed, the refusal is replayed, not skipped: a retry under the same key is refused again
      // even after the task became runnable (the key records the first call's outcome).
      const keyed = { taskId: byGate.id, agentId: agent.id, runId: run.id, mode: 'heartbeat' as const };
      const key = unique('key');
      await expect(store.scheduler.dispatchRun({ ...keyed, idempotencyKey: key })).rejects.toMatchObject({
        code: 'TASK_NOT_DISPATCHABLE',
      });
      await expect(store.scheduler.dispatchRun({ ...keyed, idempotencyKey: key })).rejects.toMatchObject({
        code: 'TASK_NOT_DISPATCHABLE',
      });
      expect(await store.locks.getTaskLease(byGate.id)).toBeNull();
      // The dependency done, the dependent is ready and dispatchRun leases it.
      await store.dispatches.completeDispatch((await dispatchOf(dep)).id);
      const ok = await store.scheduler.dispatchRun({
        taskId: byDependency.id,
        agentId: agent.id,
        runId: run.id,
        mode: 'heartbeat',
      });
      expect(ok).toMatchObject({ outcome: 'dispatched', taskLease: { token: 1 } });
    });
  });
}
