import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from 'kysely';
import {
  CoordinatorHandleTakenError,
  CoordinatorRunConflictError,
  CoordinatorRunNotRunningError,
  DISPATCH_FAILURE_LIMIT,
  DispatchAlreadyActiveError,
  DispatchRunMismatchError,
  GateAlreadyResolvedError,
  InvalidArgumentError,
  TaskNotDispatchableError,
  type Store,
} from '../../src/index.js';
import type { DialectFixture } from '../support/fixtures.js';
import { Contenders, partition, type Outcome } from '../support/race.js';
import { ops as OPS } from './runs.ops.js';

const CONTENDERS = 16;
const ROUNDS = 20;

type StartValue = { id: string; handle: string; adoptedTaskCount: number };

/** Real time plus an offset tests can move forward (other processes keep the real clock). */
function movableClock() {
  let offset = 0;
  return { now: () => Date.now() + offset, advance: (ms: number) => void (offset += ms) };
}

/** A clock that only moves when told, for equal timestamps. */
function frozenClock() {
  let now = Date.now();
  return { now: () => now, advance: (ms: number) => void (now += ms) };
}

/** Target keys no other test uses, so tests can share one database. */
function targets() {
  const prefix = Math.random().toString(16).slice(2, 10);
  return (name: string) => `worktree:${prefix}-${name}`;
}

export function defineRunSuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  let sharedStore: Promise<Store> | undefined;
  /** One migrated database for the single-process tests that use only their own targets. */
  const shared = () => (sharedStore ??= fx.freshStore());
  // The race database and its contenders: process start is slow, so they boot while the
  // single-process tests run, once for the whole file.
  let raceSetup: Promise<{ url: string; contenders: Contenders<typeof OPS> }> | undefined;
  beforeAll(() => {
    fx = makeFixture();
    raceSetup = (async () => {
      const url = await fx.freshUrl();
      const migrator = await fx.open(url);
      await migrator.migrate();
      return {
        url,
        contenders: await Contenders.start(CONTENDERS, { url, ops: OPS, storeOptions: { poolSize: 2 } }),
      };
    })();
    raceSetup.catch(() => {}); // surfaced by the races' beforeAll
  });
  afterAll(async () => {
    await (await raceSetup?.catch(() => undefined))?.contenders.close();
    await fx.cleanup();
  });

  async function company(store: Store) {
    return (await store.org.createCompany({ name: 'acme' })).id;
  }

  async function task(
    store: Store,
    companyId: string,
    targetKey: string | null,
    status: 'ready' | 'backlog' = 'ready',
  ) {
    return store.tasks.createTask({ companyId, title: 't', targetKey, status, requiresFilesystem: false });
  }

  /** The database invariant behind SPEC §3: never two running runs for one target (null = ''). */
  async function expectOneRunningPerTarget(store: Store) {
    const duplicates = await store.db
      .selectFrom('coordinator_runs')
      .select([sql<string>`coalesce(target_key, '')`.as('target'), (eb) => eb.fn.countAll<number>().as('n')])
      .where('status', '=', 'running')
      .groupBy(sql`coalesce(target_key, '')`)
      .having((eb) => eb.fn.countAll(), '>', 1)
      .execute();
    expect(duplicates).toEqual([]);
  }

  /** No contender left a transaction open (PostgreSQL: no idle-in-transaction session; SQLite: the write lock is free). */
  async function expectNoOpenTransactions(store: Store) {
    if (fx.kind === 'postgres') {
      const { rows } = await sql<{ n: number }>`
        select count(*)::int as n from pg_stat_activity
        where datname = current_database() and state like 'idle in transaction%'`.execute(store.db);
      expect(rows[0]!.n).toBe(0);
    } else {
      // A zero-wait write transaction only succeeds if no other process holds the write lock.
      await store.dialect.writeTransaction(async () => undefined, { deadlineMs: 0 });
    }
  }

  function expectConflicts(losses: readonly Outcome[], targetKey: string | null, runningRunId: string) {
    for (const loss of losses) {
      expect(loss.ok).toBe(false);
      if (loss.ok) continue;
      expect(loss.error, JSON.stringify(loss.error)).toMatchObject({
        name: 'CoordinatorRunConflictError',
        code: 'COORDINATOR_RUN_CONFLICT',
        targetKey,
        runningRunId,
      });
    }
  }

  describe('coordinator runs', () => {
    it('gives each run a unique coordinator-<hex> handle and lists runs oldest first', async () => {
      const store = await fx.freshStore();
      const a = await store.runs.startCoordinatorRun({ targetKey: 'worktree:a' });
      const b = await store.runs.startCoordinatorRun({ targetKey: 'worktree:b' });
      expect(a.coordinatorHandle).toMatch(/^coordinator-[0-9a-f]{12}$/);
      expect(b.coordinatorHandle).toMatch(/^coordinator-[0-9a-f]{12}$/);
      expect(a.coordinatorHandle).not.toBe(b.coordinatorHandle);
      expect(a).toMatchObject({ status: 'running', targetKey: 'worktree:a', endedAt: null, heartbeatAt: a.startedAt });
      await store.runs.stopCoordinatorRun(a.id, 'completed');
      expect((await store.runs.listCoordinatorRuns()).map((r) => r.id)).toEqual([a.id, b.id]);
      expect((await store.runs.listCoordinatorRuns({ status: 'running' })).map((r) => r.id)).toEqual([b.id]);
      expect((await store.runs.listCoordinatorRuns({ status: ['completed', 'failed'] })).map((r) => r.id)).toEqual([
        a.id,
      ]);
      expect((await store.runs.listCoordinatorRuns({ targetKey: 'worktree:b' })).map((r) => r.id)).toEqual([b.id]);
    });

    it('rejects a second running run on the same target and names the running run', async () => {
      const store = await shared();
      const T = targets();
      const first = await store.runs.startCoordinatorRun({ targetKey: T('x') });
      const error = await store.runs.startCoordinatorRun({ targetKey: T('x') }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(CoordinatorRunConflictError);
      expect(error).toMatchObject({
        targetKey: T('x'),
        runningRunId: first.id,
        runningCoordinatorHandle: first.coordinatorHandle,
      });
      expect((await store.runs.getActiveCoordinatorRunForTarget(T('x')))?.id).toBe(first.id);
      // Losing the race is a result with tryStartCoordinatorRun.
      expect(await store.runs.tryStartCoordinatorRun({ targetKey: T('x') })).toEqual({
        status: 'busy',
        heldBy: {
          holder: first.coordinatorHandle,
          expiresAt: Number.MAX_SAFE_INTEGER,
          runId: first.id,
          targetKey: T('x'),
        },
      });
      // Stopping frees the target.
      await store.runs.stopCoordinatorRun(first.id, 'completed');
      const second = await store.runs.startCoordinatorRun({ targetKey: T('x') });
      expect((await store.runs.getActiveCoordinatorRunForTarget(T('x')))?.id).toBe(second.id);
      await store.runs.stopCoordinatorRun(second.id, 'completed');
      const third = await store.runs.tryStartCoordinatorRun({ targetKey: T('x') });
      expect(third).toMatchObject({
        status: 'acquired',
        lease: { kind: 'coordinator_run', holder: expect.any(String) },
      });
      if (third.status === 'acquired') expect(third.lease.resource).toBe(third.run.id);
      await expectOneRunningPerTarget(store);
    });

    it('lets all null-target runs share one slot, independent of keyed targets', async () => {
      const store = await fx.freshStore();
      const keyed = await store.runs.startCoordinatorRun({ targetKey: 'worktree:k' });
      const nullRun = await store.runs.startCoordinatorRun({ targetKey: null });
      await expect(store.runs.startCoordinatorRun({ targetKey: null })).rejects.toMatchObject({
        targetKey: null,
        runningRunId: nullRun.id,
      });
      expect((await store.runs.getActiveCoordinatorRunForTarget(null))?.id).toBe(nullRun.id);
      expect((await store.runs.getActiveCoordinatorRunForTarget('worktree:k'))?.id).toBe(keyed.id);
    });

    it('has the database itself refuse a second running row, whoever writes it', async () => {
      const store = await fx.freshStore();
      await store.runs.startCoordinatorRun({ targetKey: null });
      await store.runs.startCoordinatorRun({ targetKey: 'worktree:raw' });
      const insert = (targetKey: string | null) =>
        store.db
          .insertInto('coordinator_runs')
          .values({
            id: `raw-${Math.random()}`,
            coordinator_handle: `raw-${Math.random()}`,
            status: 'running',
            spec: null,
            started_at: 1,
            ended_at: null,
            target_key: targetKey,
            heartbeat_at: 1,
          })
          .execute();
      for (const target of ['worktree:raw', null, '']) {
        const error = await insert(target).catch((e: unknown) => e);
        expect(store.dialect.classifyError(error), String(error)).toBe('unique_violation');
      }
      // A non-running row for the same target is fine.
      await store.db
        .insertInto('coordinator_runs')
        .values({
          id: 'raw-done',
          coordinator_handle: 'raw-done',
          status: 'completed',
          spec: null,
          started_at: 1,
          ended_at: 2,
          target_key: 'worktree:raw',
          heartbeat_at: 1,
        })
        .execute();
      await expectOneRunningPerTarget(store);
    });

    it('refuses an empty target key and a handle that another run already has', async () => {
      const store = await shared();
      const T = targets();
      await expect(store.runs.startCoordinatorRun({ targetKey: '' })).rejects.toBeInstanceOf(InvalidArgumentError);
      const first = await store.runs.startCoordinatorRun({
        targetKey: T('h'),
        coordinatorHandle: `coordinator-${T('fixed').slice(9)}`,
      });
      const error = await store.runs
        .startCoordinatorRun({ targetKey: T('other'), coordinatorHandle: `coordinator-${T('fixed').slice(9)}` })
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(CoordinatorHandleTakenError);
      expect(error).toMatchObject({ coordinatorHandle: `coordinator-${T('fixed').slice(9)}`, existingRunId: first.id });
      expect(await store.runs.getActiveCoordinatorRunForTarget(T('other'))).toBeNull();
    });

    it('stops a run by id, never another; a repeat stop is a no-op, and a stopped run cannot be stopped otherwise or heartbeat again', async () => {
      const store = await shared();
      const T = targets();
      const older = await store.runs.startCoordinatorRun({ targetKey: T('1') });
      const newer = await store.runs.startCoordinatorRun({ targetKey: T('2') });
      const stopped = await store.runs.stopCoordinatorRun(older.id, 'cancelled');
      expect(stopped).toMatchObject({ id: older.id, status: 'cancelled' });
      expect(stopped.endedAt).not.toBeNull();
      expect((await store.runs.getCoordinatorRun(newer.id))?.status).toBe('running');
      // The lease protocol's release rule: a repeat stop with the same status is a no-op success.
      expect(await store.runs.stopCoordinatorRun(older.id, 'cancelled')).toMatchObject({
        id: older.id,
        status: 'cancelled',
      });
      await expect(store.runs.stopCoordinatorRun(older.id, 'completed')).rejects.toMatchObject({
        code: 'COORDINATOR_RUN_NOT_RUNNING',
        runId: older.id,
        status: 'cancelled',
      });
      await expect(store.runs.heartbeatCoordinatorRun(older.id)).rejects.toBeInstanceOf(CoordinatorRunNotRunningError);
      await expect(store.runs.stopCoordinatorRun(newer.id, 'running' as never)).rejects.toBeInstanceOf(
        InvalidArgumentError,
      );
      await expect(store.runs.stopCoordinatorRun('no-such-run', 'completed')).rejects.toMatchObject({
        code: 'NOT_FOUND',
      });
    });

    it('reconciles only runs whose heartbeat is older than the bound, and heartbeats keep a run alive', async () => {
      const clock = movableClock();
      const store = await fx.freshStore({ clock });
      const quiet = await store.runs.startCoordinatorRun({ targetKey: 'worktree:quiet' });
      const alive = await store.runs.startCoordinatorRun({ targetKey: 'worktree:alive' });
      clock.advance(50_000);
      const beat = await store.runs.heartbeatCoordinatorRun(alive.id);
      expect(beat.heartbeatAt).toBeGreaterThan(alive.heartbeatAt!);
      clock.advance(20_000);
      expect(await store.runs.reconcileStaleRuns({ staleAfterMs: 120_000 })).toEqual([]);
      const reconciled = await store.runs.reconcileStaleRuns({ staleAfterMs: 60_000 });
      expect(reconciled.map((r) => [r.id, r.status])).toEqual([[quiet.id, 'failed']]);
      expect((await store.runs.getCoordinatorRun(alive.id))?.status).toBe('running');
      // The reconciled run cannot come back; its target is free.
      await expect(store.runs.heartbeatCoordinatorRun(quiet.id)).rejects.toMatchObject({
        code: 'COORDINATOR_RUN_NOT_RUNNING',
        status: 'failed',
      });
      await store.runs.startCoordinatorRun({ targetKey: 'worktree:quiet' });
      await expect(store.runs.reconcileStaleRuns({ staleAfterMs: 0 })).rejects.toBeInstanceOf(InvalidArgumentError);
    });
  });

  describe('task adoption', () => {
    it("gives two runs on different targets disjoint task sets, and never another target's tasks", async () => {
      const store = await shared();
      const T = targets();
      const c = await company(store);
      const onA = [await task(store, c, T('a')), await task(store, c, T('a'))];
      const onB = [await task(store, c, T('b'))];
      const onNull = [await task(store, c, null)];
      const runA = await store.runs.startCoordinatorRun({ targetKey: T('a') });
      const runB = await store.runs.startCoordinatorRun({ targetKey: T('b') });
      expect(runA.adoptedTaskCount).toBe(2);
      expect(runB.adoptedTaskCount).toBe(1);
      expect((await store.tasks.listTasks({ runId: runA.id })).map((t) => t.id).sort()).toEqual(
        onA.map((t) => t.id).sort(),
      );
      expect((await store.tasks.listTasks({ runId: runB.id })).map((t) => t.id)).toEqual(onB.map((t) => t.id));
      expect((await store.tasks.requireTask(onNull[0]!.id)).coordinatorRunId).toBeNull();
    });

    it("never adopts a live run's tasks, but adopts those of a run that stopped", async () => {
      const store = await shared();
      const T = targets();
      const c = await company(store);
      const live = await store.runs.startCoordinatorRun({ targetKey: T('x') });
      const done = await store.runs.startCoordinatorRun({ targetKey: T('old') });
      await store.runs.stopCoordinatorRun(done.id, 'completed');
      // Rows a buggy or legacy writer left: tasks of target y held by other runs.
      const heldByLive = await task(store, c, T('y'));
      const heldByDone = await task(store, c, T('y'));
      const dangling = await task(store, c, T('y'));
      await store.db
        .updateTable('tasks')
        .set({ coordinator_run_id: live.id })
        .where('id', '=', heldByLive.id)
        .execute();
      await store.db
        .updateTable('tasks')
        .set({ coordinator_run_id: done.id })
        .where('id', '=', heldByDone.id)
        .execute();
      await store.db
        .updateTable('tasks')
        .set({ coordinator_run_id: 'deleted-run' })
        .where('id', '=', dangling.id)
        .execute();
      const runY = await store.runs.startCoordinatorRun({ targetKey: T('y') });
      expect(runY.adoptedTaskCount).toBe(2);
      expect((await store.tasks.requireTask(heldByLive.id)).coordinatorRunId).toBe(live.id);
      expect((await store.tasks.requireTask(heldByDone.id)).coordinatorRunId).toBe(runY.id);
      expect((await store.tasks.requireTask(dangling.id)).coordinatorRunId).toBe(runY.id);
    });

    it('puts a task created mid-run into that run, and a task of another target into none', async () => {
      const store = await shared();
      const T = targets();
      const c = await company(store);
      const run = await store.runs.startCoordinatorRun({ targetKey: T('m') });
      const mine = await task(store, c, T('m'));
      const other = await task(store, c, T('n'));
      expect(mine.coordinatorRunId).toBe(run.id);
      expect(other.coordinatorRunId).toBeNull();
      expect((await store.tasks.listTasks({ runId: run.id })).map((t) => t.id)).toEqual([mine.id]);
    });

    it("moves adopted tasks' dispatches and gates to the new run", async () => {
      const store = await shared();
      const T = targets();
      const c = await company(store);
      const first = await store.runs.startCoordinatorRun({ targetKey: T('g') });
      const t = await task(store, c, T('g'));
      const dispatch = await store.dispatches.createDispatch({
        taskId: t.id,
        terminalHandle: 'term-g',
        runId: first.id,
      });
      const gate = await store.gates.openGate({ taskId: t.id, question: 'merge?' });
      expect(dispatch.coordinatorRunId).toBe(first.id);
      expect(gate.coordinatorRunId).toBe(first.id);
      await store.runs.stopCoordinatorRun(first.id, 'failed');
      const second = await store.runs.startCoordinatorRun({ targetKey: T('g') });
      expect(second.adoptedTaskCount).toBe(1);
      expect((await store.dispatches.getDispatch(dispatch.id))?.coordinatorRunId).toBe(second.id);
      expect((await store.gates.listOpenGates(second.id)).map((g) => g.id)).toEqual([gate.id]);
      expect(await store.gates.listOpenGates(first.id)).toEqual([]);
      expect(await store.dispatches.countDispatchesByStatus(second.id)).toEqual({
        active: 1,
        completed: 0,
        failed: 0,
        cancelled: 0,
      });
      expect((await store.dispatches.listDispatches({ runId: first.id })).length).toBe(0);
    });

    it('adoptUnownedTasks adopts on its own, only for a running run on its own target', async () => {
      const store = await shared();
      const T = targets();
      const c = await company(store);
      const run = await store.runs.startCoordinatorRun({ targetKey: T('s') });
      const legacy = await task(store, c, T('s'));
      await store.db.updateTable('tasks').set({ coordinator_run_id: null }).where('id', '=', legacy.id).execute();
      await expect(store.runs.adoptUnownedTasks(run.id, T('other'))).rejects.toBeInstanceOf(InvalidArgumentError);
      expect(await store.runs.adoptUnownedTasks(run.id, T('s'))).toBe(1);
      expect(await store.runs.adoptUnownedTasks(run.id, T('s'))).toBe(0);
      expect((await store.tasks.requireTask(legacy.id)).coordinatorRunId).toBe(run.id);
      await store.runs.stopCoordinatorRun(run.id, 'completed');
      await expect(store.runs.adoptUnownedTasks(run.id, T('s'))).rejects.toBeInstanceOf(CoordinatorRunNotRunningError);
    });
  });

  describe('dispatches', () => {
    it("dispatches only ready tasks, once per task within a run, and only a run's own tasks", async () => {
      const store = await shared();
      const T = targets();
      const c = await company(store);
      const run = await store.runs.startCoordinatorRun({ targetKey: T('d') });
      const other = await store.runs.startCoordinatorRun({ targetKey: T('e') });
      const ready = await task(store, c, T('d'));
      const backlog = await task(store, c, T('d'), 'backlog');
      await expect(
        store.dispatches.createDispatch({ taskId: backlog.id, terminalHandle: 'w1' }),
      ).rejects.toBeInstanceOf(TaskNotDispatchableError);
      await expect(
        store.dispatches.createDispatch({ taskId: ready.id, terminalHandle: 'w1', runId: other.id }),
      ).rejects.toBeInstanceOf(DispatchRunMismatchError);
      const d = await store.dispatches.createDispatch({ taskId: ready.id, terminalHandle: 'w1', runId: run.id });
      expect(d).toMatchObject({ status: 'active', coordinatorRunId: run.id, terminalHandle: 'w1' });
      expect((await store.tasks.requireTask(ready.id)).status).toBe('dispatched');
      // Someone puts the task back to ready while the dispatch is still active: still one per run.
      await store.db.updateTable('tasks').set({ status: 'ready' }).where('id', '=', ready.id).execute();
      await expect(store.dispatches.createDispatch({ taskId: ready.id, terminalHandle: 'w2' })).rejects.toBeInstanceOf(
        DispatchAlreadyActiveError,
      );
      await store.runs.stopCoordinatorRun(run.id, 'completed');
      await expect(
        store.dispatches.createDispatch({ taskId: ready.id, terminalHandle: 'w2', runId: run.id }),
      ).rejects.toBeInstanceOf(CoordinatorRunNotRunningError);
    });

    it('holds one active dispatch per terminal and picks the newest dispatch by insertion order, not time', async () => {
      const clock = frozenClock();
      const store = await fx.freshStore({ clock });
      const c = await company(store);
      const tasks = [await task(store, c, null), await task(store, c, null), await task(store, c, null)];
      const first = await store.dispatches.createDispatch({ taskId: tasks[0]!.id, terminalHandle: 'shared-term' });
      // Issue 22: a second active dispatch on one terminal is refused (the partial unique index decides).
      await expect(
        store.dispatches.createDispatch({ taskId: tasks[1]!.id, terminalHandle: 'shared-term' }),
      ).rejects.toMatchObject({ code: 'TERMINAL_BUSY', terminalHandle: 'shared-term', activeDispatchId: first.id });
      expect((await store.tasks.requireTask(tasks[1]!.id)).status).toBe('ready');
      await store.dispatches.endDispatch(first.id, 'cancelled');
      // The clock is frozen: every dispatch below has the same timestamp, and seq orders them.
      const second = await store.dispatches.createDispatch({ taskId: tasks[1]!.id, terminalHandle: 'shared-term' });
      expect((await store.dispatches.getActiveDispatchForTerminal('shared-term'))?.id).toBe(second.id);
      await store.dispatches.completeDispatch(second.id);
      const third = await store.dispatches.createDispatch({ taskId: tasks[2]!.id, terminalHandle: 'shared-term' });
      expect(third.seq).toBeGreaterThan(second.seq);
      expect((await store.dispatches.listDispatches({ terminalHandle: 'shared-term' })).map((d) => d.id)).toEqual([
        first.id,
        second.id,
        third.id,
      ]);
      await expect(store.dispatches.endDispatch(first.id, 'completed')).rejects.toMatchObject({
        code: 'DISPATCH_NOT_ACTIVE',
        status: 'cancelled',
      });
      expect(await store.dispatches.getActiveDispatchForTerminal('nobody')).toBeNull();
      expect(await store.dispatches.failActiveDispatchOnExit('nobody')).toBeNull();
    });

    it("routes exit escalation to the dispatch's own run, and legacy NULL-run dispatches to a running run", async () => {
      // A clock that moves on every reading: "the latest running run" must not hinge on two runs
      // starting within one millisecond (then the tie is broken by their random ids).
      let t = Date.now();
      const store = await fx.freshStore({ clock: { now: () => ++t } });
      const c = await company(store);
      const runA = await store.runs.startCoordinatorRun({ targetKey: 'worktree:a' });
      const runB = await store.runs.startCoordinatorRun({ targetKey: 'worktree:b' }); // the latest running run
      const own = await task(store, c, 'worktree:a');
      await store.dispatches.createDispatch({ taskId: own.id, terminalHandle: 'term-own', runId: runA.id });
      expect((await store.dispatches.failActiveDispatchOnExit('term-own'))?.escalateTo).toEqual({
        runId: runA.id,
        coordinatorHandle: runA.coordinatorHandle,
        runStatus: 'running',
        via: 'dispatch_run',
      });

      // Legacy rows: no run on the task or its dispatch (written before 0006).
      const legacy = async (targetKey: string | null, terminal: string) => {
        const t = await task(store, c, targetKey);
        await store.db.updateTable('tasks').set({ coordinator_run_id: null }).where('id', '=', t.id).execute();
        const d = await store.dispatches.createDispatch({ taskId: t.id, terminalHandle: terminal });
        expect(d.coordinatorRunId).toBeNull();
        return store.dispatches.failActiveDispatchOnExit(terminal);
      };
      // Its target has a running run: that one, not the latest run anywhere.
      expect((await legacy('worktree:a', 'legacy-a'))?.escalateTo).toMatchObject({
        runId: runA.id,
        via: 'task_target_run',
      });
      // No run on its (null) target: the latest running run.
      expect((await legacy(null, 'legacy-null'))?.escalateTo).toMatchObject({
        runId: runB.id,
        via: 'latest_running_run',
      });
      await store.runs.stopCoordinatorRun(runA.id, 'completed');
      await store.runs.stopCoordinatorRun(runB.id, 'completed');
      expect((await legacy('worktree:a', 'legacy-none'))?.escalateTo).toBeNull();
    });

    it('returns a failed task to ready and trips the circuit breaker on the third failure', async () => {
      const store = await shared();
      const T = targets();
      const c = await company(store);
      const run = await store.runs.startCoordinatorRun({ targetKey: T('cb') });
      const t = await task(store, c, T('cb'));
      for (let failure = 1; failure <= DISPATCH_FAILURE_LIMIT; failure++) {
        await store.dispatches.createDispatch({ taskId: t.id, terminalHandle: `cb-${failure}`, runId: run.id });
        const result = await store.dispatches.failActiveDispatchOnExit(`cb-${failure}`, { error: 'exit 137' });
        expect(result).toMatchObject({
          failureCount: failure,
          circuitBreakerTripped: failure === DISPATCH_FAILURE_LIMIT,
          taskStatus: failure === DISPATCH_FAILURE_LIMIT ? 'failed' : 'ready',
          dispatch: { status: 'failed', error: 'exit 137' },
        });
      }
      expect((await store.tasks.requireTask(t.id)).status).toBe('failed');
      await expect(store.dispatches.createDispatch({ taskId: t.id, terminalHandle: 'cb-4' })).rejects.toBeInstanceOf(
        TaskNotDispatchableError,
      );
      expect(await store.dispatches.countDispatchesByStatus(run.id)).toEqual({
        active: 0,
        completed: 0,
        failed: 3,
        cancelled: 0,
      });
    });
  });

  describe('gates', () => {
    it("opens gates in the task's run, resolves each once, and lists open gates by run", async () => {
      const store = await shared();
      const T = targets();
      const c = await company(store);
      const runA = await store.runs.startCoordinatorRun({ targetKey: T('a') });
      const runB = await store.runs.startCoordinatorRun({ targetKey: T('b') });
      const ta = await task(store, c, T('a'));
      const g1 = await store.gates.openGate({ taskId: ta.id, question: 'ship?' });
      const g2 = await store.gates.openGate({ question: 'scope?', runId: runA.id });
      const gb = await store.gates.openGate({ question: 'other run', runId: runB.id });
      expect(g1.coordinatorRunId).toBe(runA.id);
      await expect(store.gates.openGate({ taskId: ta.id, question: 'x', runId: runB.id })).rejects.toBeInstanceOf(
        InvalidArgumentError,
      );
      expect((await store.gates.listOpenGates(runA.id)).map((g) => g.id).sort()).toEqual([g1.id, g2.id].sort());
      const resolved = await store.gates.resolveGate(g1.id, 'yes');
      expect(resolved).toMatchObject({ status: 'resolved', resolution: 'yes' });
      const again = await store.gates.resolveGate(g1.id, 'no').catch((e: unknown) => e);
      expect(again).toBeInstanceOf(GateAlreadyResolvedError);
      expect(again).toMatchObject({ gateId: g1.id, resolution: 'yes' });
      expect((await store.gates.listOpenGates(runA.id)).map((g) => g.id)).toEqual([g2.id]);
      expect((await store.gates.listOpenGates(runB.id)).map((g) => g.id)).toEqual([gb.id]);
      await store.runs.stopCoordinatorRun(runB.id, 'completed');
      await expect(store.gates.openGate({ question: 'late', runId: runB.id })).rejects.toBeInstanceOf(
        CoordinatorRunNotRunningError,
      );
    });
  });

  describe('messages', () => {
    it('delivers an inbox oldest first, each message once, and only to its handle', async () => {
      const clock = frozenClock();
      const store = await fx.freshStore({ clock });
      const sent = [];
      for (let i = 0; i < 5; i++) {
        sent.push(
          await store.messages.sendMessage({
            allowUnknownRecipient: true,
            from: 'worker-1',
            to: 'coordinator-a',
            kind: 'worker_done',
            payload: { i },
          }),
        );
        clock.advance(1);
      }
      await store.messages.sendMessage({
        allowUnknownRecipient: true,
        from: 'worker-1',
        to: 'coordinator-b',
        kind: 'heartbeat',
      });
      const firstBatch = await store.messages.deliverPendingMessages('coordinator-a', { limit: 3 });
      expect(firstBatch.map((m) => m.payload)).toEqual([{ i: 0 }, { i: 1 }, { i: 2 }]);
      expect(firstBatch.every((m) => m.status === 'delivered' && m.deliveredAt !== null)).toBe(true);
      expect(await store.messages.countPendingMessages('coordinator-a')).toBe(2);
      expect((await store.messages.deliverPendingMessages('coordinator-a')).map((m) => m.id)).toEqual([
        sent[3]!.id,
        sent[4]!.id,
      ]);
      expect(await store.messages.deliverPendingMessages('coordinator-a')).toEqual([]);
      const other = await store.messages.deliverPendingMessages('coordinator-b');
      expect(other).toMatchObject([{ from: 'worker-1', to: 'coordinator-b', kind: 'heartbeat', payload: null }]);
      await expect(store.messages.deliverPendingMessages('coordinator-a', { limit: 0 })).rejects.toBeInstanceOf(
        InvalidArgumentError,
      );
    });
  });

  describe('races across processes', () => {
    let store: Store;
    let contenders: Contenders<typeof OPS>;
    let companyId: string;
    const clock = movableClock();
    beforeAll(async () => {
      const setup = await raceSetup!;
      contenders = setup.contenders;
      store = await fx.open(setup.url, { clock });
      companyId = await company(store);
    });

    it(`lets exactly one of ${CONTENDERS} contenders start a run on one target, ${ROUNDS} rounds, adopting the target's tasks`, async () => {
      const target = 'worktree:contended';
      const bystander = await task(store, companyId, 'worktree:bystander');
      let expectedTasks = 0;
      for (let round = 0; round < ROUNDS; round++) {
        await task(store, companyId, target);
        await task(store, companyId, target);
        expectedTasks += 2;
        const outcomes = await contenders.race('startRun', () => ({ targetKey: target }));
        const { wins, losses } = partition(outcomes);
        expect(wins.length, JSON.stringify(losses.filter((l) => l.error.code !== 'COORDINATOR_RUN_CONFLICT'))).toBe(1);
        const winner = wins[0]!.value;
        expect(losses.length).toBe(CONTENDERS - 1);
        expectConflicts(losses, target, winner.id);
        // Every task of the target, old rounds' included (their run stopped), is the winner's.
        expect(winner.adoptedTaskCount).toBe(expectedTasks);
        const owners = await store.tasks.listTasks({ targetKey: target });
        expect(owners.every((t) => t.coordinatorRunId === winner.id)).toBe(true);
        expect((await store.tasks.requireTask(bystander.id)).coordinatorRunId).toBeNull();
        await expectOneRunningPerTarget(store);
        await expectNoOpenTransactions(store);
        await store.runs.stopCoordinatorRun(winner.id, 'completed');
      }
      expect((await store.runs.listCoordinatorRuns({ targetKey: target })).length).toBe(ROUNDS);
    });

    it('lets every contender win when their targets are disjoint, each adopting only its own tasks', async () => {
      for (let round = 0; round < 3; round++) {
        const targetOf = (i: number) => `worktree:disjoint-${round}-${i}`;
        const taskOf = new Map<string, string>();
        for (let i = 0; i < CONTENDERS; i++) taskOf.set(targetOf(i), (await task(store, companyId, targetOf(i))).id);
        const outcomes = await contenders.race('startRun', (i) => ({ targetKey: targetOf(i) }));
        const { wins, losses } = partition(outcomes);
        expect(losses, JSON.stringify(losses)).toEqual([]);
        expect(wins.length).toBe(CONTENDERS);
        for (const win of wins) {
          expect(win.value.adoptedTaskCount).toBe(1);
          const owned = await store.tasks.listTasks({ runId: win.value.id });
          expect(owned.map((t) => t.id)).toEqual([taskOf.get(targetOf(win.index))]);
        }
        await expectOneRunningPerTarget(store);
        for (const win of wins) await store.runs.stopCoordinatorRun(win.value.id, 'completed');
      }
    });

    it('makes all null-target contenders share one slot, without blocking keyed targets', async () => {
      const keyed = await store.runs.startCoordinatorRun({ targetKey: 'worktree:beside-null' });
      for (let round = 0; round < 5; round++) {
        const outcomes = await contenders.race('startRun', () => ({ targetKey: null }));
        const { wins, losses } = partition(outcomes);
        expect(wins.length).toBe(1);
        expectConflicts(losses, null, wins[0]!.value.id);
        expect((await store.runs.getActiveCoordinatorRunForTarget('worktree:beside-null'))?.id).toBe(keyed.id);
        await expectOneRunningPerTarget(store);
        await expectNoOpenTransactions(store);
        await store.runs.stopCoordinatorRun(wins[0]!.value.id, 'completed');
      }
      await store.runs.stopCoordinatorRun(keyed.id, 'completed');
    });

    it('stamps or adopts every task written under the run-target lock while a run starts on its target', async () => {
      // The protocol every task writer follows (runTargetLockKey): a task created while a run
      // starts is either stamped with it or adopted by it, never left unowned.
      const target = 'worktree:mid-start';
      for (let round = 0; round < 5; round++) {
        const outcomes = await contenders.race(
          'startOrCreate',
          (i) =>
            i === 0
              ? { op: 'startRun', targetKey: target }
              : { op: 'createTasks', companyId, targetKey: target, count: 2, prefix: `r${round}` },
          [0, 1, 2, 3, 4, 5],
        );
        expect(
          outcomes.filter((o) => !o.ok),
          JSON.stringify(outcomes),
        ).toEqual([]);
        const run = (outcomes[0] as { value: StartValue }).value;
        const tasks = await store.tasks.listTasks({ targetKey: target });
        expect(tasks.filter((t) => t.coordinatorRunId !== run.id).map((t) => t.id)).toEqual([]);
        await store.runs.stopCoordinatorRun(run.id, 'completed');
      }
    });

    it('lets 4 consumers drain 1,000 messages from one inbox, each delivered exactly once', async () => {
      const inbox = 'coordinator-drained';
      const sends = await contenders.race(
        'sendMessages',
        () => ({ from: 'worker', to: inbox, count: 250 }),
        [0, 1, 2, 3],
      );
      expect(sends.every((o) => o.ok)).toBe(true);
      const drains = await contenders.race('drainInbox', () => ({ handle: inbox, limit: 10 }), [4, 5, 6, 7]);
      const delivered = drains.flatMap((o) => (o.ok ? o.value : []));
      expect(drains.every((o) => o.ok)).toBe(true);
      expect(delivered.length).toBe(1000);
      expect(new Set(delivered).size).toBe(1000);
      const inDb = await store.db
        .selectFrom('messages')
        .select(['id', 'status'])
        .where('to_handle', '=', inbox)
        .execute();
      expect(new Set(inDb.map((m) => m.id))).toEqual(new Set(delivered));
      expect(inDb.every((m) => m.status === 'delivered')).toBe(true);
      await expectNoOpenTransactions(store);
    });

    it('lets 8 consumers drain 2,000 messages from one inbox, each delivered exactly once', async () => {
      const inbox = 'coordinator-eight';
      const sends = await contenders.race(
        'sendMessages',
        () => ({ from: 'worker', to: inbox, count: 250 }),
        [0, 1, 2, 3, 4, 5, 6, 7],
      );
      expect(sends.every((o) => o.ok)).toBe(true);
      const drains = await contenders.race(
        'drainInbox',
        () => ({ handle: inbox, limit: 5 }),
        [8, 9, 10, 11, 12, 13, 14, 15],
      );
      expect(
        drains.every((o) => o.ok),
        JSON.stringify(drains.filter((o) => !o.ok)),
      ).toBe(true);
      const delivered = drains.flatMap((o) => (o.ok ? o.value : []));
      expect(delivered.length).toBe(2000);
      expect(new Set(delivered).size).toBe(2000);
      const inDb = await store.db
        .selectFrom('messages')
        .select(['id', 'status'])
        .where('to_handle', '=', inbox)
        .execute();
      expect(inDb.every((m) => m.status === 'delivered')).toBe(true);
      await expectNoOpenTransactions(store);
    });

    it('loses no message and delivers none twice while senders and consumers run at once', async () => {
      const inbox = 'coordinator-busy';
      const senders = [0, 1].map((i) =>
        contenders.start(i, 'sendMessages', { from: `worker-${i}`, to: inbox, count: 150 }),
      );
      const consumers = [2, 3, 4, 5].map((i) => contenders.start(i, 'drainInbox', { handle: inbox, limit: 1 }));
      const settled = await Promise.all([...senders, ...consumers]);
      expect(
        settled.every((o) => o.ok),
        JSON.stringify(settled.filter((o) => !o.ok)),
      ).toBe(true);
      // Consumers stop at an empty inbox, which may come before the senders finish: drain the rest.
      const rest = (await store.messages.deliverPendingMessages(inbox, { limit: 1000 })).map((m) => m.id);
      const delivered = [...settled.slice(2).flatMap((o) => (o.ok ? (o.value as string[]) : [])), ...rest];
      expect(delivered.length).toBe(300);
      expect(new Set(delivered).size).toBe(300);
      const inDb = await store.db
        .selectFrom('messages')
        .select(['id', 'status'])
        .where('to_handle', '=', inbox)
        .execute();
      expect(new Set(inDb.map((m) => m.id))).toEqual(new Set(delivered));
      expect(inDb.every((m) => m.status === 'delivered')).toBe(true);
      await expectNoOpenTransactions(store);
    });

    it('lets exactly one of concurrent dispatches of a ready task win', async () => {
      const run = await store.runs.startCoordinatorRun({ targetKey: 'worktree:dispatch-race' });
      for (let round = 0; round < 10; round++) {
        const t = await task(store, companyId, 'worktree:dispatch-race');
        const outcomes = await contenders.race('createDispatch', (i) => ({
          taskId: t.id,
          terminalHandle: `race-${round}-${i}`,
          runId: run.id,
        }));
        const { wins, losses } = partition(outcomes);
        expect(wins.length).toBe(1);
        for (const loss of losses)
          expect(['TASK_NOT_DISPATCHABLE', 'DISPATCH_ALREADY_ACTIVE']).toContain(loss.error.code);
        const active = await store.dispatches.listDispatches({ taskId: t.id, status: 'active' });
        expect(active.length).toBe(1);
        expect(active[0]!.coordinatorRunId).toBe(run.id);
      }
      const perTask = await store.db
        .selectFrom('dispatch_contexts')
        .select(['task_id', (eb) => eb.fn.countAll<number>().as('n')])
        .where('status', '=', 'active')
        .groupBy('task_id')
        .having((eb) => eb.fn.countAll(), '>', 1)
        .execute();
      expect(perTask).toEqual([]);
      await store.runs.stopCoordinatorRun(run.id, 'completed');
    });

    it("fails a terminal's dispatch once however many exit reports race, and trips the breaker on the third", async () => {
      const run = await store.runs.startCoordinatorRun({ targetKey: 'worktree:exit-race' });
      const t = await task(store, companyId, 'worktree:exit-race');
      for (let failure = 1; failure <= DISPATCH_FAILURE_LIMIT; failure++) {
        const terminal = `exit-race-${failure}`;
        const dispatch = await store.dispatches.createDispatch({
          taskId: t.id,
          terminalHandle: terminal,
          runId: run.id,
        });
        const outcomes = await contenders.race(
          'failOnExit',
          () => ({ terminalHandle: terminal }),
          [0, 1, 2, 3, 4, 5, 6, 7],
        );
        expect(outcomes.every((o) => o.ok)).toBe(true);
        const reports = outcomes.flatMap((o) => (o.ok && o.value ? [o.value] : []));
        expect(reports.length).toBe(1);
        expect(reports[0]).toEqual({
          dispatchId: dispatch.id,
          failureCount: failure,
          circuitBreakerTripped: failure === DISPATCH_FAILURE_LIMIT,
          taskStatus: failure === DISPATCH_FAILURE_LIMIT ? 'failed' : 'ready',
          escalateTo: {
            runId: run.id,
            coordinatorHandle: run.coordinatorHandle,
            runStatus: 'running',
            via: 'dispatch_run',
          },
        });
      }
      expect(await store.dispatches.countDispatchesByStatus(run.id)).toEqual({
        active: 0,
        completed: 0,
        failed: 3,
        cancelled: 0,
      });
      await store.runs.stopCoordinatorRun(run.id, 'completed');
    });

    it('lets exactly one of concurrent resolutions of a gate win', async () => {
      for (let round = 0; round < 5; round++) {
        const gate = await store.gates.openGate({ question: `round ${round}?` });
        const outcomes = await contenders.race(
          'resolveGate',
          (i) => ({ gateId: gate.id, resolution: `answer-${i}` }),
          [0, 1, 2, 3, 4, 5, 6, 7],
        );
        const { wins, losses } = partition(outcomes);
        expect(wins.length).toBe(1);
        for (const loss of losses)
          expect(loss.error).toMatchObject({ code: 'GATE_ALREADY_RESOLVED', resolution: wins[0]!.value.resolution });
        expect((await store.gates.getGate(gate.id))?.resolution).toBe(wins[0]!.value.resolution);
      }
    });

    it("frees the target of a SIGKILLed run holder after reconciliation and refuses the dead run's late heartbeat", async () => {
      const [holder, successor, latecomer] = [15, 14, 13];
      const target = 'worktree:crash';
      const holding = contenders.start(holder, 'holdRun', { targetKey: target });
      holding.catch(() => {}); // rejects when the process is killed
      await contenders.waitForSignal(holder, 'started');
      const dead = (await store.runs.getActiveCoordinatorRunForTarget(target))!;
      await contenders.kill(holder);
      await expect(holding).rejects.toThrow(/exited/);

      // The dead holder still blocks its target…
      const blocked = await contenders.run(successor, 'startRun', { targetKey: target });
      expect(blocked).toMatchObject({ ok: false, error: { code: 'COORDINATOR_RUN_CONFLICT', runningRunId: dead.id } });
      // …until its heartbeat is older than the bound.
      expect(await store.runs.reconcileStaleRuns({ staleAfterMs: 60 * 60_000 })).toEqual([]);
      clock.advance(61 * 60_000);
      const reconciled = await store.runs.reconcileStaleRuns({ staleAfterMs: 60 * 60_000 });
      expect(reconciled.map((r) => [r.id, r.status])).toEqual([[dead.id, 'failed']]);

      const replacement = await contenders.run(successor, 'startRun', { targetKey: target });
      expect(replacement.ok).toBe(true);
      const late = await contenders.run(latecomer, 'heartbeat', { runId: dead.id });
      expect(late).toMatchObject({
        ok: false,
        error: { code: 'COORDINATOR_RUN_NOT_RUNNING', runId: dead.id, status: 'failed' },
      });
      expect((await store.runs.getCoordinatorRun(dead.id))?.status).toBe('failed');
      if (replacement.ok) {
        expect((await store.runs.getActiveCoordinatorRunForTarget(target))?.id).toBe(replacement.value.id);
        await store.runs.stopCoordinatorRun(replacement.value.id, 'completed');
      }
      await expectOneRunningPerTarget(store);
      await expectNoOpenTransactions(store);
    });

    it('tells a live holder whose run was reconciled that it lost the run', async () => {
      const holder = 12;
      const holding = contenders.start(holder, 'holdRun', {
        targetKey: 'worktree:stalled',
      });
      await contenders.waitForSignal(holder, 'started');
      const run = (await store.runs.getActiveCoordinatorRunForTarget('worktree:stalled'))!;
      // Seen from the reconciler, the holder stalled past the bound (as if SIGSTOPped).
      clock.advance(120 * 60_000);
      expect((await store.runs.reconcileStaleRuns({ staleAfterMs: 60 * 60_000 })).map((r) => r.id)).toEqual([run.id]);
      // The holder keeps heartbeating; its next heartbeat is refused and it learns it lost the run.
      expect(await holding).toEqual({
        index: holder,
        ok: true,
        value: { runId: run.id, lost: 'COORDINATOR_RUN_NOT_RUNNING' },
      });
      expect((await store.runs.getCoordinatorRun(run.id))?.status).toBe('failed');
      await expectOneRunningPerTarget(store);
    });
  });
}
