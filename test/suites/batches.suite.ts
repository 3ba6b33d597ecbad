/**
 * Batch calls (issue 24 item 3): N items in one write transaction, one commit. Each batch is
 * atomic and idempotent by its ids like its single form, and is raced like it: concurrent batch
 * creators of the same ids (each on its own store, so its own connections) converge on one row each.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  AlreadyExistsError,
  InvalidArgumentError,
  NotFoundError,
  PathLeaseLostError,
  UnknownRecipientError,
} from '../../src/index.js';
import type { Lease, Store } from '../../src/index.js';
import type { DialectFixture } from '../support/fixtures.js';
import { statementCounter } from './round-trips.ops.js';

export function defineBatchSuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  let url: string;
  let store: Store;
  let company: string;
  const counter = statementCounter();
  let n = 0;
  const unique = (name: string) => `${name}-${++n}-${Math.random().toString(16).slice(2, 8)}`;

  beforeAll(async () => {
    fx = makeFixture();
    url = await fx.freshUrl();
    store = await fx.open(url, { onQuery: counter.onQuery });
    await store.migrate();
    company = (await store.org.createCompany({ name: 'acme' })).id;
  }, 120_000);
  afterAll(() => fx.cleanup());

  const taskInput = (targetKey: string, id: string, extra: object = {}) => ({
    id,
    companyId: company,
    title: id,
    targetKey,
    requiresFilesystem: false,
    status: 'ready' as const,
    ...extra,
  });

  describe('tasks.createTasks', () => {
    it('creates every task in one transaction, stamped with the running run, in input order', async () => {
      const targetKey = `worktree:${unique('t')}`;
      const run = await store.runs.startCoordinatorRun({ targetKey });
      const ids = Array.from({ length: 100 }, (_, i) => unique(`task${i}`));
      const before = counter.count();
      const tasks = await store.tasks.createTasks(ids.map((id) => taskInput(targetKey, id)));
      const statements = counter.count() - before;
      expect(tasks.map((t) => t.id)).toEqual(ids);
      expect(tasks.every((t) => t.coordinatorRunId === run.id && t.status === 'ready')).toBe(true);
      // One commit: a handful of statements, whatever the batch's size.
      expect(statements).toBeLessThanOrEqual(8);
      const seqs = tasks.map((t) => t.seq);
      expect([...seqs].sort((a, b) => a - b)).toEqual(seqs);
    });

    it('allows dependencies on earlier tasks of the batch, and stores a waiting task blocked', async () => {
      const targetKey = `worktree:${unique('t')}`;
      await store.runs.startCoordinatorRun({ targetKey });
      const [a, b, c] = [unique('a'), unique('b'), unique('c')];
      const tasks = await store.tasks.createTasks([
        taskInput(targetKey, a),
        taskInput(targetKey, b, { dependsOn: [a] }),
        taskInput(targetKey, c, { dependsOn: [a, b] }),
      ]);
      expect(tasks.map((t) => t.status)).toEqual(['ready', 'blocked', 'blocked']);
      expect((await store.tasks.listDependencies(c)).map((d) => d.dependsOnId).sort()).toEqual([a, b].sort());
      expect(tasks[1]!.blockedReason).toContain(a);
    });

    it('refuses a dependency on a later task of the batch, and a repeated id, before any statement', async () => {
      const targetKey = `worktree:${unique('t')}`;
      const [a, b] = [unique('a'), unique('b')];
      await expect(
        store.tasks.createTasks([taskInput(targetKey, a, { dependsOn: [b] }), taskInput(targetKey, b)]),
      ).rejects.toBeInstanceOf(InvalidArgumentError);
      await expect(store.tasks.createTasks([taskInput(targetKey, a), taskInput(targetKey, a)])).rejects.toBeInstanceOf(
        InvalidArgumentError,
      );
      expect(await store.tasks.getTask(a)).toBeNull();
    });

    it('is atomic: a missing dependency creates none of the batch', async () => {
      const targetKey = `worktree:${unique('t')}`;
      const [a, b] = [unique('a'), unique('b')];
      await expect(
        store.tasks.createTasks([taskInput(targetKey, a), taskInput(targetKey, b, { dependsOn: ['no-such-task'] })]),
      ).rejects.toBeInstanceOf(NotFoundError);
      expect(await store.tasks.getTask(a)).toBeNull();
      expect(await store.tasks.getTask(b)).toBeNull();
    });

    it('is idempotent by id: a retry returns the stored tasks, other input is ALREADY_EXISTS', async () => {
      const targetKey = `worktree:${unique('t')}`;
      const inputs = [taskInput(targetKey, unique('a')), taskInput(targetKey, unique('b'))];
      const first = await store.tasks.createTasks(inputs);
      expect(await store.tasks.createTasks(inputs)).toEqual(first);
      // A retry may also carry new tasks: the stored ones come back, the new one is created.
      const extra = taskInput(targetKey, unique('c'), { dependsOn: [inputs[0]!.id] });
      const again = await store.tasks.createTasks([...inputs, extra]);
      expect(again.slice(0, 2)).toEqual(first);
      expect(again[2]!.id).toBe(extra.id);
      await expect(store.tasks.createTasks([{ ...inputs[0]!, title: 'other' }])).rejects.toBeInstanceOf(
        AlreadyExistsError,
      );
    });

    it('concurrent batch creators of the same ids converge on one row each, all seeing the same tasks', async () => {
      const targetKey = `worktree:${unique('t')}`;
      await store.runs.startCoordinatorRun({ targetKey });
      const creators = await Promise.all(Array.from({ length: 4 }, () => fx.open(url)));
      for (let round = 0; round < 5; round++) {
        const ids = Array.from({ length: 20 }, (_, i) => unique(`r${round}-${i}`));
        const inputs = ids.map((id, i) => taskInput(targetKey, id, i > 0 ? { dependsOn: [ids[i - 1]!] } : {}));
        // Each creator sends the batch in its own order of chunks: overlapping, not identical, batches.
        const results = await Promise.all(
          creators.map((creator, c) => creator.tasks.createTasks(c % 2 === 0 ? inputs : inputs.slice(0, 10))),
        );
        for (const result of results) expect(result).toEqual(results[0]!.slice(0, result.length));
        const rows = await store.db.selectFrom('tasks').select('id').where('id', 'in', ids).execute();
        expect(rows).toHaveLength(ids.length);
        const edges = await store.db
          .selectFrom('task_dependencies')
          .select('task_id')
          .where('task_id', 'in', ids)
          .execute();
        expect(edges).toHaveLength(ids.length - 1);
      }
    });
  });

  describe('messages.sendMessages', () => {
    it('queues every message in one transaction, handed out in input order', async () => {
      const run = await store.runs.startCoordinatorRun({ targetKey: `worktree:${unique('t')}` });
      const inbox = run.coordinatorHandle;
      const inputs = Array.from({ length: 50 }, (_, i) => ({
        id: unique(`m${i}`),
        from: 'w',
        to: inbox,
        kind: 'k',
        payload: { i },
      }));
      const before = counter.count();
      const sent = await store.messages.sendMessages(inputs);
      expect(counter.count() - before).toBeLessThanOrEqual(8);
      expect(sent.map((m) => m.id)).toEqual(inputs.map((m) => m.id));
      const received = await store.messages.receiveMessages(inbox, { limit: 100, visibilityMs: 60_000 });
      expect(received.map((m) => m.id)).toEqual(inputs.map((m) => m.id));
    });

    it('is atomic: an unknown recipient queues none of the batch', async () => {
      const run = await store.runs.startCoordinatorRun({ targetKey: `worktree:${unique('t')}` });
      const ok = { id: unique('m'), from: 'w', to: run.coordinatorHandle, kind: 'k' };
      await expect(
        store.messages.sendMessages([ok, { id: unique('m'), from: 'w', to: 'nobody', kind: 'k' }]),
      ).rejects.toBeInstanceOf(UnknownRecipientError);
      expect(await store.messages.countPendingMessages(run.coordinatorHandle)).toBe(0);
      // allowUnknownRecipient is per message.
      const sent = await store.messages.sendMessages([
        ok,
        { id: unique('m'), from: 'w', to: 'nobody', kind: 'k', allowUnknownRecipient: true },
      ]);
      expect(sent).toHaveLength(2);
    });

    it('is idempotent by id, also when concurrent senders race on the same ids', async () => {
      const run = await store.runs.startCoordinatorRun({ targetKey: `worktree:${unique('t')}` });
      const inbox = run.coordinatorHandle;
      const senders = await Promise.all(Array.from({ length: 4 }, () => fx.open(url)));
      const inputs = Array.from({ length: 30 }, (_, i) => ({
        id: unique(`m${i}`),
        from: 'w',
        to: inbox,
        kind: 'k',
        payload: i,
      }));
      const results = await Promise.all(senders.map((s) => s.messages.sendMessages(inputs)));
      for (const result of results) expect(result).toEqual(results[0]);
      expect(await store.messages.countPendingMessages(inbox)).toBe(inputs.length);
      expect(await store.messages.sendMessages(inputs)).toEqual(results[0]);
      await expect(store.messages.sendMessages([{ ...inputs[3]!, payload: 'other' }])).rejects.toBeInstanceOf(
        AlreadyExistsError,
      );
    });
  });

  describe('renewLeases (a heartbeat)', () => {
    /** A worker's leases: a task lease, a dispatch, a path grant and a semaphore slot. */
    async function workerLeases(on: Store = store) {
      const targetKey = `worktree:${unique('hb')}`;
      await on.runs.startCoordinatorRun({ targetKey });
      const [leased, dispatched] = await on.tasks.createTasks([
        taskInput(targetKey, unique('leased')),
        taskInput(targetKey, unique('dispatched')),
      ]);
      const taskLease = await on.locks.claimTaskLease(leased!.id, { holder: 'w', ttlMs: 5_000 });
      const dispatch = await on.dispatches.createDispatch({ taskId: dispatched!.id, terminalHandle: unique('term') });
      const ws = await on.org.createWorkspace({ companyId: company, name: unique('ws') });
      const paths = await on.paths.tryAcquirePaths({ workspaceId: ws.id, holder: 'w', paths: ['src'], ttlMs: 5_000 });
      const slot = await on.semaphores.acquire(unique('sem'), { holder: 'w', limit: 2, ttlMs: 5_000 });
      if (taskLease.status !== 'acquired' || paths.status !== 'acquired' || slot.status !== 'acquired')
        throw new Error('a lease was busy');
      return [taskLease.lease, dispatch.lease!, paths.lease, slot.lease] as const;
    }

    it('renews a task lease, a dispatch, a path grant and a semaphore slot in one commit, in input order', async () => {
      const leases = await workerLeases();
      const commits = statementCounter();
      const counted = await fx.open(url, {
        onQuery: (q) => void (/\bcommit$/i.test(q.sql.trim()) && commits.onQuery(q)),
      });
      try {
        const t0 = Date.now();
        const { renewed, lost } = await counted.renewLeases(leases, { ttlMs: 60_000 });
        const t1 = Date.now();
        expect(lost).toEqual([]);
        expect(renewed.map((l) => [l.kind, l.resource, l.token])).toEqual(
          leases.map((l) => [l.kind, l.resource, l.token]),
        );
        // Every one now lapses 60 s after the renewal (the dispatch's was 5 min after its creation).
        for (const lease of renewed) {
          expect(lease.expiresAt).toBeGreaterThan(t0 + 55_000);
          expect(lease.expiresAt).toBeLessThan(t1 + 65_000);
        }
        expect(commits.count()).toBe(1);
        // Each renewed grant works as its own renewal's result: renewed again, one by one.
        await store.semaphores.renew(renewed[3] as never);
        await store.paths.renewPaths(renewed[2] as never);
      } finally {
        await counted.close();
      }
    });

    it('reports a lost lease per item, with the error its own renewal throws, and renews the rest', async () => {
      const [taskLease, dispatchLease, pathsLease, slot] = await workerLeases();
      await store.paths.releasePaths(pathsLease);
      const { renewed, lost } = await store.renewLeases([slot, pathsLease, taskLease, dispatchLease]);
      expect(renewed.map((l) => l.kind)).toEqual(['semaphore', 'task_lease', 'dispatch']);
      expect(lost).toHaveLength(1);
      expect(lost[0]).toMatchObject({ index: 1, lease: pathsLease });
      expect(lost[0]!.error).toBeInstanceOf(PathLeaseLostError);
      expect(lost[0]!.error.reason).toBe('released');
      expect(await store.renewLeases([])).toEqual({ renewed: [], lost: [] });
    });

    it('refuses a cleanup claim, a non-array and a bad lease before any statement', async () => {
      const before = counter.count();
      const claimLike = { kind: 'cleanup_claim', resource: 's', holder: 'h', token: 1, expiresAt: 1 };
      await expect(store.renewLeases([claimLike as never])).rejects.toBeInstanceOf(InvalidArgumentError);
      await expect(store.renewLeases('no' as never)).rejects.toBeInstanceOf(InvalidArgumentError);
      await expect(store.renewLeases([{ kind: 'semaphore' } as never])).rejects.toBeInstanceOf(InvalidArgumentError);
      await expect(store.renewLeases([], { ttlMs: -1 })).rejects.toBeInstanceOf(InvalidArgumentError);
      expect(counter.count()).toBe(before);
    });

    it('two heartbeats whose path grants cross two workspaces renew concurrently, 25 rounds, no deadlock', async () => {
      const [ws1, ws2] = [
        await store.org.createWorkspace({ companyId: company, name: unique('x1') }),
        await store.org.createWorkspace({ companyId: company, name: unique('x2') }),
      ];
      const grant = async (on: Store, ws: string, holder: string) => {
        const r = await on.paths.tryAcquirePaths({ workspaceId: ws, holder, paths: [holder], ttlMs: 60_000 });
        if (r.status !== 'acquired') throw new Error('busy');
        return r.lease;
      };
      const [a, b] = [await fx.open(url), await fx.open(url)];
      try {
        // A lists ws1 first, B ws2 first: renewed in the caller's order, each would hold one
        // workspace's key and wait for the other's.
        let aLeases: readonly Lease[] = [await grant(a, ws1.id, 'a'), await grant(a, ws2.id, 'a')];
        let bLeases: readonly Lease[] = [await grant(b, ws2.id, 'b'), await grant(b, ws1.id, 'b')];
        for (let round = 0; round < 25; round++) {
          const [ra, rb] = await Promise.all([a.renewLeases(aLeases), b.renewLeases(bLeases)]);
          expect([ra.lost, rb.lost]).toEqual([[], []]);
          aLeases = ra.renewed;
          bLeases = rb.renewed;
        }
        expect(a.stats().retries.deadlock ?? 0).toBe(0);
        expect(b.stats().retries.deadlock ?? 0).toBe(0);
      } finally {
        await a.close();
        await b.close();
      }
    });
  });
}
