import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  InvalidArgumentError,
  LATEST_VERSION,
  MAX_DURATION_MS,
  MAX_ID_LENGTH,
  MAX_WRITE_PATHS,
  NotFoundError,
  SchemaOutOfDateError,
  TaskfenceError,
  type Store,
} from '../../src/index.js';
import type { DialectFixture } from '../support/fixtures.js';
import { databaseState } from '../support/db-state.js';
import { Contenders } from '../support/race.js';
import { SHARED_KEY } from './validation.ops.js';
import { ops as OPS } from './validation.ops.js';

/** Runs `fn`, expects a `TaskfenceError` with `code` (and `field`, for INVALID_ARGUMENT), and that the database did not change. */
async function expectRefusal(
  store: Store,
  code: string,
  fn: () => Promise<unknown>,
  field?: string,
): Promise<TaskfenceError> {
  const before = await databaseState(store);
  const error = await fn().then(
    (value) => {
      throw new Error(`expected ${code}, got ${JSON.stringify(value)}`);
    },
    (e: unknown) => e,
  );
  expect(error, String(error)).toBeInstanceOf(TaskfenceError);
  expect((error as TaskfenceError).code, String(error)).toBe(code);
  if (field !== undefined) expect((error as InvalidArgumentError).field).toBe(field);
  expect(await databaseState(store)).toBe(before);
  return error as TaskfenceError;
}

/** Bad input stops at the boundary (issue 12): each case of the issue, by name, on both dialects. */
export function defineValidationSuite(makeFixture: () => DialectFixture): void {
  describe(`bad input stops at the boundary (${makeFixture.name})`, () => {
    let fx: DialectFixture;
    let store: Store;
    let companyId: string;
    let workspaceId: string;
    let agentId: string;
    let taskId: string;
    beforeAll(async () => {
      fx = makeFixture();
      store = await fx.freshStore();
      companyId = (await store.org.createCompany({ name: 'acme' })).id;
      workspaceId = (await store.org.createWorkspace({ companyId, name: 'ws' })).id;
      agentId = (await store.org.createAgent({ companyId, name: 'a', workspaceId })).id;
      taskId = (
        await store.tasks.createTask({ companyId, title: 't', requiresFilesystem: false, status: 'ready', workspaceId })
      ).id;
    });
    afterAll(async () => fx.cleanup());

    describe('text the database cannot store', () => {
      it('refuses a NUL byte in a title, a name and a message handle on both dialects alike, storing nothing', async () => {
        await expectRefusal(
          store,
          'INVALID_ARGUMENT',
          () => store.tasks.createTask({ companyId, title: 'a\u0000b', requiresFilesystem: false }),
          'title',
        );
        await expectRefusal(store, 'INVALID_ARGUMENT', () => store.org.createCompany({ name: 'x\u0000' }), 'name');
        await expectRefusal(
          store,
          'INVALID_ARGUMENT',
          () => store.messages.sendMessage({ from: 'w\u0000', to: 'c', kind: 'k' }),
          'from',
        );
      });

      it('refuses a lone UTF-16 surrogate instead of storing U+FFFD', async () => {
        await expectRefusal(
          store,
          'INVALID_ARGUMENT',
          () => store.tasks.createTask({ companyId, title: 'x\ud800', requiresFilesystem: false }),
          'title',
        );
        await expectRefusal(store, 'INVALID_ARGUMENT', () => store.org.createCompany({ name: '\udfffy' }), 'name');
        await expectRefusal(
          store,
          'INVALID_ARGUMENT',
          () => store.messages.sendMessage({ from: 'w', to: 'c\udc00', kind: 'k' }),
          'to',
        );
        // A proper pair is fine and round-trips.
        const ok = await store.org.createCompany({ name: 'smile \ud83d\ude00' });
        expect(ok.name).toBe('smile \ud83d\ude00');
      });

      it('refuses an identifier longer than MAX_ID_LENGTH', async () => {
        await expectRefusal(
          store,
          'INVALID_ARGUMENT',
          () => store.locks.getTaskLease('t'.repeat(MAX_ID_LENGTH + 1)),
          'taskId',
        );
        expect(await store.locks.getTaskLease('t'.repeat(MAX_ID_LENGTH))).toBeNull();
      });

      it('bounds a caller-chosen coordinator run id by MAX_ID_LENGTH, like every other id', async () => {
        await expectRefusal(
          store,
          'INVALID_ARGUMENT',
          () => store.runs.startCoordinatorRun({ id: 'r'.repeat(MAX_ID_LENGTH + 1), targetKey: 'id-bound' }),
          'id',
        );
        const run = await store.runs.startCoordinatorRun({ id: 'r'.repeat(MAX_ID_LENGTH), targetKey: 'id-bound' });
        expect(run.id.length).toBe(MAX_ID_LENGTH);
        await store.runs.stopCoordinatorRun(run.id, 'completed');
      });
    });

    describe('numbers out of range', () => {
      it('refuses ttlMs of 1e19, 1e300, NaN, Infinity, 0, -1, 1.5 and beyond 10 years', async () => {
        for (const ttlMs of [1e19, 1e300, Number.NaN, Number.POSITIVE_INFINITY, 0, -1, 1.5, MAX_DURATION_MS + 1]) {
          await expectRefusal(
            store,
            'INVALID_ARGUMENT',
            () => store.locks.claimWorkspaceLock(workspaceId, { holder: 'h', runId: 'r', ttlMs }),
            'ttlMs',
          );
          await expectRefusal(
            store,
            'INVALID_ARGUMENT',
            () => store.paths.tryAcquirePaths({ workspaceId, holder: 'h', paths: ['a'], ttlMs }),
            'ttlMs',
          );
        }
      });

      it('refuses staleAfterMs of 1e300', async () => {
        await expectRefusal(
          store,
          'INVALID_ARGUMENT',
          () => store.runs.reconcileStaleRuns({ staleAfterMs: 1e300 }),
          'staleAfterMs',
        );
      });

      it('grants, renews and releases fencing tokens beyond 32 bits (64-bit columns on both dialects)', async () => {
        const ws = (await store.org.createWorkspace({ companyId, name: 'wide' })).id;
        const first = await store.locks.claimWorkspaceLock(ws, { holder: 'h', runId: 'r', ttlMs: 60_000 });
        expect(first.status).toBe('acquired');
        await store.locks.releaseWorkspaceLock(ws, { token: (first as { lease: { token: number } }).lease.token });
        const big = 2 ** 40;
        await store.db.updateTable('workspace_locks').set({ token: big }).where('workspace_id', '=', ws).execute();
        const claim = await store.locks.claimWorkspaceLock(ws, { holder: 'h', runId: 'r', ttlMs: 60_000 });
        expect(claim).toMatchObject({ status: 'acquired', lease: { token: big + 1 } });
        await store.locks.renewWorkspaceLock(ws, { token: big + 1, ttlMs: 60_000 });
        await store.locks.releaseWorkspaceLock(ws, { token: big + 1 });
      });

      it('transfers an environment whose generation is beyond 32 bits', async () => {
        const owner = await store.tasks.createTask({ companyId, title: 'o', requiresFilesystem: true });
        const next = await store.tasks.createTask({ companyId, title: 'n', requiresFilesystem: true });
        const env = await store.ownership.createEnvironment({ ownerTaskId: owner.id, rootPath: '/w/o' });
        const big = 2 ** 33;
        await store.db
          .updateTable('task_environments')
          .set({ ownership_generation: big })
          .where('id', '=', env.id)
          .execute();
        const moved = await store.ownership.transferEnvironmentOwnership({
          environmentId: env.id,
          expectedOwnerTaskId: owner.id,
          expectedGeneration: big,
          newOwnerTaskId: next.id,
        });
        expect(moved.generation).toBe(big + 1);
      });

      it('refuses a token that is not a positive safe integer', async () => {
        for (const token of [2 ** 60, 0, -3, 1.5, Number.NaN, '1' as unknown as number]) {
          await expectRefusal(
            store,
            'INVALID_ARGUMENT',
            () => store.locks.releaseTaskLease(taskId, { token }),
            'token',
          );
        }
      });
    });

    describe('wrong types from plain JavaScript', () => {
      it('refuses an object where an id is expected, on reads and writes', async () => {
        const obj = { a: 1 } as unknown as string;
        await expectRefusal(store, 'INVALID_ARGUMENT', () => store.tasks.getTask(obj), 'id');
        await expectRefusal(
          store,
          'INVALID_ARGUMENT',
          () => store.locks.claimTaskLease(obj, { holder: 'h', ttlMs: 1000 }),
          'taskId',
        );
        await expectRefusal(
          store,
          'INVALID_ARGUMENT',
          () => store.tasks.createTask({ companyId: obj, title: 't', requiresFilesystem: false }),
          'companyId',
        );
        await expectRefusal(
          store,
          'INVALID_ARGUMENT',
          () => store.org.createWorkspace({ companyId, name: 'w', id: obj }),
          'id',
        );
      });

      it('refuses a BigInt, a circular and a function payload with INVALID_ARGUMENT', async () => {
        const circular: Record<string, unknown> = {};
        circular.self = circular;
        for (const payload of [10n, { n: 1n }, circular, () => 1, Symbol('s')]) {
          await expectRefusal(
            store,
            'INVALID_ARGUMENT',
            () => store.messages.sendMessage({ from: 'w', to: 'c', kind: 'k', payload }),
            'payload',
          );
        }
      });

      it('refuses listTasks({ status: 5 }) and unknown statuses', async () => {
        await expectRefusal(store, 'INVALID_ARGUMENT', () => store.tasks.listTasks({ status: 5 as never }), 'status');
        await expectRefusal(
          store,
          'INVALID_ARGUMENT',
          () => store.tasks.listTasks({ status: ['ready', 'nope'] as never }),
          'status',
        );
        await expectRefusal(
          store,
          'INVALID_ARGUMENT',
          () => store.runs.listCoordinatorRuns({ status: {} as never }),
          'status',
        );
        expect(await store.tasks.listTasks({ status: [] })).toEqual([]);
      });

      it('refuses undefined and null inputs instead of failing with "Cannot read properties of undefined"', async () => {
        const u = undefined as never;
        await expectRefusal(store, 'INVALID_ARGUMENT', () => store.tasks.createTask(u), 'input');
        await expectRefusal(store, 'INVALID_ARGUMENT', () => store.paths.tryAcquirePaths(u), 'input');
        await expectRefusal(
          store,
          'INVALID_ARGUMENT',
          () => store.paths.tryAcquirePaths({ workspaceId, holder: 'h', paths: u, ttlMs: 1000 }),
          'paths',
        );
        await expectRefusal(store, 'INVALID_ARGUMENT', () => store.runs.reconcileStaleRuns(u), 'options');
        await expectRefusal(store, 'INVALID_ARGUMENT', () => store.ownership.completeCleanup(null as never), 'claim');
        await expectRefusal(store, 'INVALID_ARGUMENT', () => store.scheduler.dispatchRun(u), 'input');
        await expectRefusal(store, 'INVALID_ARGUMENT', () => store.locks.renewTaskLease(taskId, u), 'input');
      });
    });

    describe('half-applied refusals', () => {
      it('dispatchRun with a missing agent is NOT_FOUND and leaves the task lease and its token untouched', async () => {
        const error = await expectRefusal(store, 'NOT_FOUND', () =>
          store.scheduler.dispatchRun({ taskId, agentId: 'no-such-agent', runId: 'run-1', mode: 'heartbeat' }),
        );
        expect(error).toMatchObject({ entity: 'agent', id: 'no-such-agent' });
        expect(await store.db.selectFrom('task_leases').selectAll().where('task_id', '=', taskId).execute()).toEqual(
          [],
        );
        // The agent exists: the dispatch goes through.
        expect(
          (await store.scheduler.dispatchRun({ taskId, agentId, runId: 'run-1', mode: 'heartbeat' })).outcome,
        ).toBe('dispatched');
      });

      it('createDispatch with a missing agent is NOT_FOUND and leaves the task ready', async () => {
        const t = await store.tasks.createTask({ companyId, title: 'd', requiresFilesystem: false, status: 'ready' });
        const error = await expectRefusal(store, 'NOT_FOUND', () =>
          store.dispatches.createDispatch({ taskId: t.id, terminalHandle: 'term', agentId: 'ghost' }),
        );
        expect(error).toMatchObject({ entity: 'agent', id: 'ghost' });
      });
    });

    describe('large write sets', () => {
      const many = (n: number, prefix = 'f') => Array.from({ length: n }, (_, i) => `${prefix}/${i}`);

      it(`acquires, finds a conflict on the last key of, renews and releases ${MAX_WRITE_PATHS} paths`, async () => {
        const ws = (await store.org.createWorkspace({ companyId, name: 'big' })).id;
        const paths = many(MAX_WRITE_PATHS);
        const got = await store.paths.tryAcquirePaths({ workspaceId: ws, holder: 'h1', paths, ttlMs: 600_000 });
        expect(got.acquired).toBe(true);
        expect((got as unknown as { leases: unknown[] }).leases).toHaveLength(MAX_WRITE_PATHS);
        // Another holder asking for the same large set is told about conflicts, capped at the report limit.
        const other = await store.paths.tryAcquirePaths({
          workspaceId: ws,
          holder: 'h2',
          paths: [...many(MAX_WRITE_PATHS - 1, 'g'), `f/${MAX_WRITE_PATHS - 1}`],
          ttlMs: 1_000,
        });
        expect(other).toMatchObject({
          acquired: false,
          conflicts: [{ key: `f/${MAX_WRITE_PATHS - 1}`, holder: 'h1' }],
        });
        const renewed = await store.paths.renewPaths({ workspaceId: ws, holder: 'h1', paths, ttlMs: 600_000 });
        expect(renewed.renewed).toHaveLength(MAX_WRITE_PATHS);
        expect(renewed.lost).toEqual([]);
        const released = await store.paths.releasePaths({ workspaceId: ws, holder: 'h1', paths });
        expect(released.released).toHaveLength(MAX_WRITE_PATHS);
        expect(await store.paths.listPathLeases({ workspaceId: ws })).toEqual([]);
      });

      it(`claims a task that writes ${MAX_WRITE_PATHS} paths`, async () => {
        const ws = (await store.org.createWorkspace({ companyId, name: 'claim' })).id;
        const task = await store.tasks.createTask({
          companyId,
          title: 'big',
          requiresFilesystem: true,
          workspaceId: ws,
          writes: many(MAX_WRITE_PATHS),
          status: 'ready',
        });
        const claim = await store.paths.claimTask(task.id, 'agent-1', { ttlMs: 600_000 });
        expect(claim).toMatchObject({ claimed: true, mode: 'paths' });
        expect((claim as unknown as { leases: unknown[] }).leases).toHaveLength(MAX_WRITE_PATHS);
        expect((await store.paths.submitTaskResult(task.id, 'agent-1', { status: 'done' })).released).toHaveLength(
          MAX_WRITE_PATHS,
        );
      });

      it('of 6 processes racing large overlapping sets (3,000 paths each, the overlap in the last chunk), exactly one wins each round', async () => {
        const contenders = await Contenders.start(6, {
          url: store.location.url,
          ops: OPS,
          // The six take the workspace's path lock in turn, each inserting 3,000 rows: on a loaded
          // 2-core runner the last one can wait longer than the default 10 s lock_timeout.
          storeOptions: { poolSize: 1, lockTimeoutMs: 60_000 },
        });
        try {
          for (let round = 0; round < 3; round++) {
            const ws = (await store.org.createWorkspace({ companyId, name: `race-${round}` })).id;
            const outcomes = await contenders.race('acquireLargeSet', () => ({ workspaceId: ws, n: 3_000 }));
            const values = outcomes.map((o) => {
              if (!o.ok) throw new Error(`contender ${o.index} failed: ${JSON.stringify(o.error)}`);
              return o.value;
            });
            const winners = outcomes.filter((o, k) => values[k]!.acquired).map((o) => `c${o.index}`);
            expect(winners, `round ${round}`).toHaveLength(1);
            for (const v of values.filter((x) => !x.acquired))
              expect(v.conflicts).toEqual([expect.objectContaining({ key: SHARED_KEY, holder: winners[0] })]);
            // The losers leased nothing: every lease is the winner's, the whole set of it.
            const leases = await store.paths.listPathLeases({ workspaceId: ws });
            expect(new Set(leases.map((l) => l.holder))).toEqual(new Set(winners));
            expect(leases).toHaveLength(3_001);
          }
        } finally {
          await contenders.close();
        }
      });

      it('refuses a write set above the maximum at createTask and at every path call', async () => {
        const paths = many(MAX_WRITE_PATHS + 1);
        await expectRefusal(
          store,
          'INVALID_ARGUMENT',
          () => store.tasks.createTask({ companyId, title: 'x', requiresFilesystem: true, writes: paths }),
          'writes',
        );
        await expectRefusal(
          store,
          'INVALID_ARGUMENT',
          () => store.paths.tryAcquirePaths({ workspaceId, holder: 'h', paths, ttlMs: 1_000 }),
          'paths',
        );
        await expectRefusal(
          store,
          'INVALID_ARGUMENT',
          () => store.paths.acquirePaths({ workspaceId, holder: 'h', paths, ttlMs: 1_000 }, { timeoutMs: 10 }),
          'paths',
        );
        await expectRefusal(
          store,
          'INVALID_ARGUMENT',
          () => store.paths.renewPaths({ workspaceId, holder: 'h', paths, ttlMs: 1_000 }),
          'paths',
        );
        await expectRefusal(
          store,
          'INVALID_ARGUMENT',
          () => store.paths.releasePaths({ workspaceId, holder: 'h', paths }),
          'paths',
        );
      });
    });

    describe('heartbeats learn about lost leases', () => {
      it('tells a holder whose leases expired and were taken over, on its next renewal', async () => {
        let t = 5_000_000;
        const clocked = await fx.open(store.location.url, { clock: { now: () => t } });
        const ws = (await clocked.org.createWorkspace({ companyId, name: 'hb' })).id;
        await clocked.paths.tryAcquirePaths({
          workspaceId: ws,
          holder: 'h1',
          paths: ['src', 'docs', 'lib/a'],
          ttlMs: 1_000,
        });
        t += 1_000; // every lease of h1 expired
        expect(
          (await clocked.paths.tryAcquirePaths({ workspaceId: ws, holder: 'h2', paths: ['src'], ttlMs: 1_000 }))
            .acquired,
        ).toBe(true);
        await clocked.paths.pruneExpiredPaths(ws); // and the others are gone altogether
        const beat = await clocked.paths.renewPaths({
          workspaceId: ws,
          holder: 'h1',
          paths: ['src', 'docs', 'lib/a'],
          ttlMs: 1_000,
        });
        expect(beat).toEqual({ renewed: [], lost: ['docs', 'lib/a', 'src'] });
      });

      it('refuses renewPaths without paths', async () => {
        await expectRefusal(
          store,
          'INVALID_ARGUMENT',
          () => store.paths.renewPaths({ workspaceId, holder: 'h1', ttlMs: 1_000 } as never),
          'paths',
        );
      });

      it('answers listPathLeases on an unknown workspace with NOT_FOUND, like tryAcquirePaths', async () => {
        await expectRefusal(store, 'NOT_FOUND', () => store.paths.listPathLeases({ workspaceId: 'no-such-ws' }));
        await expectRefusal(store, 'NOT_FOUND', () =>
          store.paths.tryAcquirePaths({ workspaceId: 'no-such-ws', holder: 'h', paths: ['a'], ttlMs: 1_000 }),
        );
      });
    });

    describe('an unmigrated or outdated database', () => {
      it('throws SCHEMA_OUT_OF_DATE on an empty database, never "no such table"', async () => {
        const empty = await fx.open(await fx.freshUrl());
        const error = await empty.org.createCompany({ name: 'x' }).catch((e: unknown) => e);
        expect(error).toBeInstanceOf(SchemaOutOfDateError);
        expect(error).toMatchObject({ currentVersion: 0, expectedVersion: LATEST_VERSION });
        expect(String((error as Error).message)).toMatch(/taskfence migrate/);
        await expect(empty.tasks.listTasks()).rejects.toBeInstanceOf(SchemaOutOfDateError);
      });

      it('guards calls through tx.* too: SCHEMA_OUT_OF_DATE inside store.transaction, never "no such table"', async () => {
        const empty = await fx.open(await fx.freshUrl());
        const error = await empty.transaction((tx) => tx.org.createCompany({ name: 'x' })).catch((e: unknown) => e);
        expect(error).toBeInstanceOf(SchemaOutOfDateError);
        expect(error).toMatchObject({ currentVersion: 0, expectedVersion: LATEST_VERSION });
        await expect(empty.transaction((tx) => tx.tasks.listTasks())).rejects.toBeInstanceOf(SchemaOutOfDateError);
      });

      it('throws SCHEMA_OUT_OF_DATE on a database at an older version', async () => {
        const old = await fx.freshStore({ to: 52 });
        const c = await old.org.createCompany({ name: 'c' });
        await expect(
          old.tasks.createTask({ companyId: c.id, title: 't', requiresFilesystem: false, writes: ['a'] }),
        ).rejects.toMatchObject({
          code: 'SCHEMA_OUT_OF_DATE',
          currentVersion: 52,
        });
        await old.migrate();
        expect(
          (await old.tasks.createTask({ companyId: c.id, title: 't', requiresFilesystem: false, writes: ['a'] }))
            .writes,
        ).toEqual(['a']);
      });
    });

    describe('constraint violations are domain errors', () => {
      // These rely on the idempotent creates (FK violation → NOT_FOUND, same id with other input → ALREADY_EXISTS).
      it('refuses a create whose company, workspace, assignee or project is missing with NOT_FOUND naming it', async () => {
        const missing = async (entity: RegExp, id: string, fn: () => Promise<unknown>) => {
          const error = await expectRefusal(store, 'NOT_FOUND', fn);
          expect(error).toMatchObject({ id });
          expect((error as NotFoundError).entity).toMatch(entity);
        };
        await missing(/company/, 'no-co', () => store.org.createWorkspace({ companyId: 'no-co', name: 'w' }));
        await missing(/company/, 'no-co', () => store.org.createAgent({ companyId: 'no-co', name: 'a' }));
        await missing(/workspace/, 'no-ws', () =>
          store.org.createAgent({ companyId, name: 'a', workspaceId: 'no-ws' }),
        );
        await missing(/company/, 'no-co', () => store.org.createProject({ companyId: 'no-co', name: 'p' }));
        await missing(/company/, 'no-co', () =>
          store.tasks.createTask({ companyId: 'no-co', title: 't', requiresFilesystem: false }),
        );
        await missing(/agent|assignee/, 'no-agent', () =>
          store.tasks.createTask({ companyId, title: 't', requiresFilesystem: false, assigneeAgentId: 'no-agent' }),
        );
        await missing(/project/, 'no-project', () =>
          store.tasks.createTask({ companyId, title: 't', requiresFilesystem: false, projectId: 'no-project' }),
        );
        await missing(/workspace/, 'no-ws', () =>
          store.tasks.createTask({ companyId, title: 't', requiresFilesystem: false, workspaceId: 'no-ws' }),
        );
      });

      it('refuses a taken id with different input with ALREADY_EXISTS, and returns the row for the same input', async () => {
        const first = await store.org.createCompany({ id: 'taken-co', name: 'one' });
        await expectRefusal(store, 'ALREADY_EXISTS', () => store.org.createCompany({ id: 'taken-co', name: 'two' }));
        expect(await store.org.createCompany({ id: 'taken-co', name: 'one' })).toMatchObject({
          id: first.id,
          name: 'one',
        });
        await expectRefusal(store, 'ALREADY_EXISTS', () =>
          store.tasks.createTask({ id: taskId, companyId, title: 'other title', requiresFilesystem: true }),
        );
      });

      it('refuses a lock or lease on a missing workspace or task with NOT_FOUND naming it', async () => {
        const a = await expectRefusal(store, 'NOT_FOUND', () =>
          store.locks.claimWorkspaceLock('ghost-ws', { holder: 'h', runId: 'r', ttlMs: 1_000 }),
        );
        expect(a).toMatchObject({ entity: 'workspace', id: 'ghost-ws' });
        const b = await expectRefusal(store, 'NOT_FOUND', () =>
          store.locks.claimTaskLease('ghost-task', { holder: 'h', ttlMs: 1_000 }),
        );
        expect(b).toMatchObject({ entity: 'task', id: 'ghost-task' });
        await expect(store.org.getAgent('ghost')).resolves.toBeNull();
        await expect(store.org.requireAgent('ghost')).rejects.toBeInstanceOf(NotFoundError);
      });
    });
  });
}
