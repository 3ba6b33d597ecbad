import { fork } from 'node:child_process';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openStore, TaskfenceError, type Store, type TaskfenceEvent } from '../../src/index.js';
import { postgresFixture } from '../support/dialects.js';
import { FaultProxy } from '../support/tcp-proxy.js';
import { useUrlSchema } from '../support/schema.js';
import { compiledPath } from '../support/compiled.js';

/*
 * The PostgreSQL fault tier (SPEC §8, failure model): faults are injected for real — backends
 * terminated, connections cut before and right after COMMIT by a TCP proxy, a network gone
 * silent, a database refusing connections, lock and statement timeouts — and every outcome must
 * be a success, a typed error whose transaction left nothing behind, or COMMIT_OUTCOME_UNKNOWN,
 * with retries under the same ids converging to exactly one row.
 */

const FAULT_LOOP = new URL('../support/fault-loop.ts', import.meta.url).href;
/** How long backends are terminated in the service-loop test; `npm run soak:faults` raises it to a minute. */
const TERMINATION_PHASE_MS = Number(process.env.FAULT_SOAK_MS ?? 12_000);

const fx = postgresFixture();
afterAll(() => fx.cleanup());

async function admin<T>(url: string, fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    await useUrlSchema(client, url);
    return await fn(client);
  } finally {
    await client.end();
  }
}

function databaseOf(url: string): string {
  return new URL(url).pathname.slice(1);
}

async function codeOf(promise: Promise<unknown>): Promise<string> {
  try {
    await promise;
    return 'ok';
  } catch (error) {
    if (error instanceof TaskfenceError) return error.code;
    throw error;
  }
}

/**
 * A read as the README tells callers to make one after a fault: retried on DATABASE_UNAVAILABLE
 * (a pooled connection the proxy cut may only be found dead when it is used).
 */
async function retryRead<T>(read: () => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await read();
    } catch (error) {
      if (!(error instanceof TaskfenceError) || error.code !== 'DATABASE_UNAVAILABLE' || attempt >= 5) throw error;
    }
  }
}

async function seed(store: Store) {
  const company = await store.org.createCompany({ id: 'c1', name: 'Acme' });
  const workspace = await store.org.createWorkspace({ id: 'w1', companyId: company.id, name: 'main' });
  return { companyId: company.id, workspaceId: workspace.id };
}

describe('a service looping every area while its backends are terminated every 150 ms', () => {
  it(`survives, sees only typed errors, leaves no transaction open, converges, and its next calls succeed (${TERMINATION_PHASE_MS} ms)`, async () => {
    const url = await fx.freshUrl();
    const migrator = await fx.open(url);
    await migrator.migrate();
    const child = fork(compiledPath(FAULT_LOOP), [], {
      execArgv: [],
      env: { ...process.env, FAULT_URL: url },
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    });
    const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
    const messages: { type: string; report?: any; message?: string }[] = [];
    const next = (type: string) =>
      new Promise<any>((resolve, reject) => {
        const check = () => {
          const found = messages.find((m) => m.type === type || m.type === 'fatal');
          if (found)
            return found.type === 'fatal' ? reject(new Error(`fault loop failed: ${found.message}`)) : resolve(found);
          setTimeout(check, 20);
        };
        check();
        void exited.then((code) =>
          reject(new Error(`the fault loop process exited (code ${code}) before "${type}": it crashed`)),
        );
      });
    child.on('message', (m: any) => messages.push(m));
    await next('ready');

    let terminated = 0;
    let stillOpenInTransaction = 0;
    await admin(url, async (c) => {
      const until = Date.now() + TERMINATION_PHASE_MS;
      while (Date.now() < until) {
        const { rows } = await c.query(
          "select pg_terminate_backend(pid) as done from pg_stat_activity where datname = $1 and application_name = 'taskfence' and pid <> pg_backend_pid()",
          [databaseOf(url)],
        );
        terminated += rows.filter((r) => r.done).length;
        await new Promise((resolve) => setTimeout(resolve, 150));
      }
      child.send({ type: 'stop' });
      const { report } = await next('report');
      // The child is still connected: nothing of it may sit idle inside a transaction.
      const { rows } = await c.query(
        "select count(*)::int as n from pg_stat_activity where datname = $1 and application_name = 'taskfence' and state like 'idle in transaction%'",
        [databaseOf(url)],
      );
      stillOpenInTransaction = rows[0].n;
      child.send({ type: 'exit' });
      expect(await exited).toBe(0);

      expect(report.untyped).toEqual([]);
      expect(report.finalRound).toEqual([]);
      expect(report.iterations).toBeGreaterThan(0);
      for (const code of Object.keys(report.failures)) {
        expect([
          'DATABASE_UNAVAILABLE',
          'COMMIT_OUTCOME_UNKNOWN',
          'STALE_WORKSPACE_LOCK',
          'GATE_ALREADY_RESOLVED',
          'STALE_OWNERSHIP',
          'OWNERSHIP_CHANGED',
          'COORDINATOR_RUN_NOT_RUNNING',
        ]).toContain(code);
      }
      // Every create that was retried under its id exists exactly once.
      const tasks = await c.query('select id from tasks where id = any($1)', [report.ids.tasks]);
      expect(tasks.rows.length).toBe(new Set(report.ids.tasks).size);
      const runs = await c.query('select id, status from coordinator_runs where id = any($1)', [report.ids.runs]);
      expect(runs.rows.length).toBe(new Set(report.ids.runs).size);
      expect(runs.rows.every((r) => r.status === 'completed')).toBe(true);
      const envs = await c.query('select id from task_environments where id = any($1)', [report.ids.environments]);
      expect(envs.rows.length).toBe(new Set(report.ids.environments).size);
      console.log(
        `[faults] ${report.iterations} rounds, ${terminated} backends terminated, failures seen by the caller: ${JSON.stringify(report.failures)}`,
      );
    });
    expect(terminated).toBeGreaterThan(0);
    expect(stillOpenInTransaction).toBe(0);
  });
});

describe('connections cut by a proxy', () => {
  let proxy: FaultProxy;
  let url: string;
  beforeAll(async () => {
    const direct = await fx.freshUrl();
    const u = new URL(direct);
    proxy = await FaultProxy.start({ host: u.hostname, port: Number(u.port || 5432) });
    url = proxy.urlThrough(direct);
    const store = await fx.open(direct);
    await store.migrate();
  });
  afterAll(() => proxy.close());

  it('reports COMMIT_OUTCOME_UNKNOWN when the connection dies after COMMIT reached the server, and a retry with the same id returns the committed row', async () => {
    const store = await fx.open(url, { writeDeadlineMs: 10_000 });
    const { companyId } = await seed(store);

    proxy.cutAfterNextCommit();
    expect(
      await codeOf(store.tasks.createTask({ id: 't-commit', companyId, title: 'A', requiresFilesystem: false })),
    ).toBe('COMMIT_OUTCOME_UNKNOWN');
    const task = await store.tasks.createTask({ id: 't-commit', companyId, title: 'A', requiresFilesystem: false });
    expect(task.id).toBe('t-commit');
    expect((await store.tasks.listTasks()).filter((t) => t.id === 't-commit')).toHaveLength(1);

    proxy.cutAfterNextCommit();
    expect(await codeOf(store.runs.startCoordinatorRun({ id: 'r-commit', targetKey: 'worktree:commit' }))).toBe(
      'COMMIT_OUTCOME_UNKNOWN',
    );
    const run = await store.runs.startCoordinatorRun({ id: 'r-commit', targetKey: 'worktree:commit' });
    expect(run).toMatchObject({ id: 'r-commit', status: 'running', targetKey: 'worktree:commit' });

    proxy.cutAfterNextCommit();
    expect(await codeOf(store.org.createCompany({ id: 'c-commit', name: 'Once' }))).toBe('COMMIT_OUTCOME_UNKNOWN');
    expect(await store.org.createCompany({ id: 'c-commit', name: 'Once' })).toMatchObject({
      id: 'c-commit',
      name: 'Once',
    });
    expect(await codeOf(store.org.createCompany({ id: 'c-commit', name: 'Other' }))).toBe('ALREADY_EXISTS');

    // A claim whose COMMIT is its own round trip: read the holder and token back, as the README
    // says. (An unkeyed claimWorkspaceLock resolves such a cut itself: see below.)
    proxy.cutAfterNextCommit();
    expect(await codeOf(store.locks.claimTaskLease(task.id, { holder: 'me', ttlMs: 60_000 }))).toBe(
      'COMMIT_OUTCOME_UNKNOWN',
    );
    expect(await store.locks.getTaskLease(task.id)).toMatchObject({ holder: 'me' });
    expect(proxy.commitCuts).toBe(4);
  });

  it("reports COMMIT_OUTCOME_UNKNOWN for a COMMIT that carried the call's statements (completeDispatch, keyed or not, dispatchNext and dispatchNextBatch), which committed", async () => {
    const store = await fx.open(url, { writeDeadlineMs: 10_000 });
    const companyId = (await store.org.createCompany({ name: 'Commit with' })).id;
    const targetKey = 'worktree:commit-with';
    const run = await store.runs.startCoordinatorRun({ targetKey });
    const create = (title: string, dependsOn: string[] = []) =>
      store.tasks.createTask({ companyId, title, targetKey, requiresFilesystem: false, status: 'ready', dependsOn });
    const first = await create('first');
    const second = await create('second', [first.id]);
    expect(second.status).toBe('blocked');
    const dispatch = await store.dispatches.dispatchNext({ runId: run.id, terminalHandle: 'term-commit-with' });
    expect(dispatch?.taskId).toBe(first.id);
    // The dependents' lock and move travel in COMMIT's round trip: cut once it reached the server.
    proxy.cutAfterNextCommit();
    const cuts = proxy.commitCuts;
    expect(await codeOf(store.dispatches.completeDispatch(dispatch!.id, { lease: dispatch!.lease! }))).toBe(
      'COMMIT_OUTCOME_UNKNOWN',
    );
    expect((await store.tasks.getTask(first.id))?.status).toBe('done');
    expect((await store.tasks.getTask(second.id))?.status).toBe('ready');
    expect((await store.dispatches.getDispatch(dispatch!.id))?.status).toBe('completed');

    // The same with an idempotency key: the keyed path sends the dependents' lock and move with its
    // COMMIT (commitWith), and its retry with the key replays the completion.
    const third = await create('third', [second.id]);
    const next = await store.dispatches.dispatchNext({ runId: run.id, terminalHandle: 'term-commit-with-2' });
    expect(next?.taskId).toBe(second.id);
    proxy.cutAfterNextCommit();
    const keyed = { lease: next!.lease!, idempotencyKey: 'complete-second' };
    expect(await codeOf(store.dispatches.completeDispatch(next!.id, keyed))).toBe('COMMIT_OUTCOME_UNKNOWN');
    expect((await store.tasks.getTask(third.id))?.status).toBe('ready');
    expect((await store.dispatches.completeDispatch(next!.id, keyed)).task.status).toBe('done');

    // And dispatchNext, whose BEGIN, claim and COMMIT are one round trip: the claim committed.
    proxy.cutAfterNextCommit();
    expect(await codeOf(store.dispatches.dispatchNext({ runId: run.id, terminalHandle: 'term-commit-with-3' }))).toBe(
      'COMMIT_OUTCOME_UNKNOWN',
    );
    expect((await store.tasks.getTask(third.id))?.status).toBe('dispatched');

    // And dispatchNextBatch, one round trip too: both claims committed.
    const batchTasks = [await create('fourth'), await create('fifth')];
    proxy.cutAfterNextCommit();
    expect(
      await codeOf(
        store.dispatches.dispatchNextBatch({
          runId: run.id,
          terminalHandles: ['term-commit-with-4', 'term-commit-with-5'],
        }),
      ),
    ).toBe('COMMIT_OUTCOME_UNKNOWN');
    for (const t of batchTasks) expect((await store.tasks.getTask(t.id))?.status).toBe('dispatched');
    expect(proxy.commitCuts).toBe(cuts + 4);
  });

  it('resolves a release or an ack sent in one round trip whose connection was cut once COMMIT reached the server: the call succeeds, its effect in place once', async () => {
    const store = await fx.open(url, { writeDeadlineMs: 10_000 });
    const companyId = (await store.org.createCompany({ name: 'One trip' })).id;
    const workspaceId = (await store.org.createWorkspace({ companyId, name: 'one-trip' })).id;
    const task = await store.tasks.createTask({ companyId, title: 'leased', requiresFilesystem: false });
    const cuts = proxy.commitCuts;

    // Each call below is BEGIN, its one statement and COMMIT in one query (the budget test counts
    // 1 round trip), cut after the server committed it: the store releases (or acks) again, which
    // finds the effect in place, and the caller sees a success, never COMMIT_OUTCOME_UNKNOWN.
    const lock = await store.locks.claimWorkspaceLock(workspaceId, { holder: 'me', runId: 'r-one', ttlMs: 60_000 });
    if (lock.status !== 'acquired') throw new Error('the lock was busy');
    proxy.cutAfterNextCommit();
    await store.locks.releaseWorkspaceLock(lock.lease);
    expect(await store.locks.getWorkspaceLock(workspaceId)).toBeNull();

    const lease = await store.locks.claimTaskLease(task.id, { holder: 'me', ttlMs: 60_000 });
    if (lease.status !== 'acquired') throw new Error('the task lease was busy');
    proxy.cutAfterNextCommit();
    await store.locks.releaseTaskLease(lease.lease);
    expect(await store.locks.getTaskLease(task.id)).toBeNull();

    const slot = await store.semaphores.acquire('one-trip', { holder: 'me', limit: 1, ttlMs: 60_000 });
    if (slot.status !== 'acquired') throw new Error('the semaphore was full');
    proxy.cutAfterNextCommit();
    await store.semaphores.release(slot.lease);
    expect(await store.semaphores.listHolders('one-trip')).toEqual([]);

    const grant = await store.paths.tryAcquirePaths({ workspaceId, holder: 'me', paths: ['src'], ttlMs: 60_000 });
    if (grant.status !== 'acquired') throw new Error('the paths were busy');
    proxy.cutAfterNextCommit();
    // Resolved by releasing again, it reports what a repeat release reports: nothing left to release.
    expect(await store.paths.releasePaths(grant.lease)).toEqual({ released: [] });
    expect((await store.paths.tryAcquirePaths({ workspaceId, holder: 'other', paths: ['src'], ttlMs: 1 })).status).toBe(
      'acquired',
    );

    const run = await store.runs.startCoordinatorRun({ targetKey: 'worktree:one-trip' });
    await store.messages.sendMessage({ from: 'w', to: run.coordinatorHandle, kind: 'k', payload: {} });
    const [message] = await store.messages.receiveMessages(run.coordinatorHandle, { visibilityMs: 60_000 });
    proxy.cutAfterNextCommit();
    expect(await store.messages.ackMessages(run.coordinatorHandle, [message!.receipt])).toEqual({
      acked: [message!.receipt],
      refused: [],
    });
    expect(await store.messages.countPendingMessages(run.coordinatorHandle)).toBe(0);
    expect(proxy.commitCuts).toBe(cuts + 5);
  });

  it('resolves a claimWorkspaceLock sent in one round trip whose connection was cut, before or after the server committed it: acquired once, never COMMIT_OUTCOME_UNKNOWN', async () => {
    const store = await fx.open(url, { writeDeadlineMs: 10_000 });
    const companyId = (await store.org.createCompany({ name: 'One-trip claim' })).id;
    const workspaceId = (await store.org.createWorkspace({ companyId, name: 'one-trip-claim' })).id;
    const cuts = proxy.commitCuts;

    // Cut once the server committed the grant: the store runs the claim again, which finds this
    // call's own grant (holder, run, time and expiry) and answers it, token 1, not busy.
    proxy.cutAfterNextCommit();
    const first = await store.locks.claimWorkspaceLock(workspaceId, { holder: 'me', runId: 'r-1', ttlMs: 60_000 });
    expect(proxy.commitCuts).toBe(cuts + 1);
    expect(first).toMatchObject({ status: 'acquired', lease: { holder: 'me', runId: 'r-1', token: 1 } });
    expect(await store.locks.getWorkspaceLock(workspaceId)).toMatchObject({ holder: 'me', token: 1 });
    if (first.status !== 'acquired') throw new Error('the lock was busy');
    await store.locks.releaseWorkspaceLock(first.lease);

    // Cut before the server saw it: the run again grants it, once (token 2).
    const before = proxy.cutsBefore;
    proxy.cutBeforeNext('taskfence_claim_workspace_lock_v1(');
    const second = await store.locks.claimWorkspaceLock(workspaceId, { holder: 'me', runId: 'r-2', ttlMs: 60_000 });
    expect(proxy.cutsBefore).toBe(before + 1);
    expect(second).toMatchObject({ status: 'acquired', lease: { holder: 'me', runId: 'r-2', token: 2 } });

    // Another holder's claim cut after COMMIT, while the lock is held: busy, held by 'me'.
    proxy.cutAfterNextCommit();
    const busy = await store.locks.claimWorkspaceLock(workspaceId, { holder: 'you', runId: 'r-3', ttlMs: 60_000 });
    expect(busy).toMatchObject({ status: 'busy', heldBy: { holder: 'me', runId: 'r-2', token: 2 } });
    expect(proxy.commitCuts).toBe(cuts + 2);
  });

  it('retries a transaction whose connection died before COMMIT on a fresh connection: the call succeeds once', async () => {
    const store = await fx.open(url, { writeDeadlineMs: 10_000 });
    const companyId = (await store.org.createCompany({ name: 'Retry' })).id;
    proxy.cutBeforeNext('insert into "tasks"', 2);
    const task = await store.tasks.createTask({ companyId, title: 'survives two cuts', requiresFilesystem: false });
    const rows = await store.tasks.listTasks();
    expect(rows.filter((t) => t.id === task.id)).toHaveLength(1);
    proxy.cutBeforeNext('insert into "coordinator_runs"');
    const run = await store.runs.startCoordinatorRun({ targetKey: 'worktree:cut-before' });
    expect((await store.runs.listCoordinatorRuns()).filter((r) => r.targetKey === 'worktree:cut-before')).toEqual([
      expect.objectContaining({ id: run.id }),
    ]);
  });

  it('under random cuts of every connection, each call succeeds, fails typed with nothing written, or is COMMIT_OUTCOME_UNKNOWN; retries converge to one row per id', async () => {
    const store = await fx.open(url, { writeDeadlineMs: 300 });
    const companyId = (await store.org.createCompany({ name: 'Cuts' })).id;
    const outcomes: Record<string, number> = {};
    // Every connection is cut after a random gap: 20 ms plus an exponentially distributed wait
    // (mean 40 ms). Most gaps are short enough to cut calls mid-flight; because the tail is
    // unbounded, a loaded machine where one call (with its reconnect) takes 150 ms still sees
    // about one gap in 25 long enough for it, so the test makes progress instead of livelocking
    // as it could with gaps capped at 50 ms.
    let cutter: NodeJS.Timeout | undefined;
    const cutLater = () => {
      cutter = setTimeout(
        () => {
          proxy.cutAll();
          cutLater();
        },
        20 - Math.log(1 - Math.random()) * 40,
      );
    };
    cutLater();
    // At least 40 ids, and on until the cuts have reached the caller 5 times (most cuts are met by
    // the store's own retry before COMMIT and never surface): a quiet machine needs a few hundred
    // ids, a loaded one fewer. 3,000 ids without 5 typed failures fails the test.
    const surfaced = () => (outcomes.DATABASE_UNAVAILABLE ?? 0) + (outcomes.COMMIT_OUTCOME_UNKNOWN ?? 0);
    const ids: string[] = [];
    try {
      for (let i = 0; i < 3_000 && (i < 40 || surfaced() < 5); i++) {
        const id = `cut-${i}`;
        ids.push(id);
        for (;;) {
          const code = await codeOf(store.tasks.createTask({ id, companyId, title: id, requiresFilesystem: false }));
          outcomes[code] = (outcomes[code] ?? 0) + 1;
          if (code === 'ok') break;
          expect(['DATABASE_UNAVAILABLE', 'COMMIT_OUTCOME_UNKNOWN']).toContain(code);
        }
      }
    } finally {
      clearTimeout(cutter);
    }
    const stored = (await retryRead(() => store.tasks.listTasks())).filter((t) => t.id.startsWith('cut-'));
    expect(stored.map((t) => t.id).sort()).toEqual([...ids].sort());
    expect(outcomes.ok).toBe(ids.length);
    // The cuts really met calls: the store retried some itself, and some reached the caller typed.
    expect(store.stats().retries.connection_lost ?? 0).toBeGreaterThan(0);
    expect(surfaced()).toBeGreaterThanOrEqual(5);
    console.log(
      `[faults] random cuts: ${ids.length} ids, ${JSON.stringify(outcomes)}, retried inside: ${store.stats().retries.connection_lost}`,
    );
  }, 360_000); // well under a minute on a quiet machine; several times that on a loaded 2-core runner
});

describe('an idle pooled connection whose backend is terminated', () => {
  // pg-pool emits an idle client's fault on the pool and throws it when nobody listens: unhandled,
  // it would crash the process (vitest fails the run on it). A host's pool may have no listener.
  it.each([
    ["taskfence's own pool", false],
    ['a host pool with no error listener of its own', true],
  ])('%s: no crash, a connection.lost event, and the next call succeeds', async (_name, withHostPool) => {
    const url = await fx.freshUrl();
    const host = withHostPool ? new pg.Pool({ connectionString: url, max: 4 }) : undefined;
    const events: TaskfenceEvent[] = [];
    const store = await openStore({ url, ...(host ? { pool: host } : {}), onEvent: (e) => events.push(e) });
    try {
      await store.migrate();
      // Idle clients in the pool: three reads at once need three connections.
      await Promise.all([1, 2, 3].map(() => store.tasks.listTasks()));
      expect(store.stats().pool?.idle).toBeGreaterThan(1);
      await admin(url, (c) =>
        c.query(
          'select pg_terminate_backend(pid) from pg_stat_activity where datname = $1 and pid <> pg_backend_pid()',
          [databaseOf(url)],
        ),
      );
      for (let waited = 0; !events.some((e) => e.type === 'connection.lost'); waited += 20) {
        if (waited > 10_000) throw new Error('no connection.lost event within 10 s');
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      expect(events.find((e) => e.type === 'connection.lost')).toMatchObject({ code: '57P01' });
      expect(store.stats().connectionsLost).toBeGreaterThan(0);
      expect(await retryRead(() => store.tasks.listTasks())).toEqual([]);
    } finally {
      await store.close();
    }
    if (host) {
      // close() takes taskfence's listener off the host's pool, and leaves the pool open.
      expect(host.listenerCount('error')).toBe(0);
      expect((await host.query('select 1 as one')).rows).toEqual([{ one: 1 }]);
      // From here the pool is the host's alone, and a host gives it a listener (see embed.test.ts):
      // its end() resolves before the sockets close, and the fixture's cleanup drops the database.
      host.on('error', () => {});
      await host.end();
    }
  });
});

describe('a network gone silent', () => {
  it('bounds every call: open, write and read fail DATABASE_UNAVAILABLE instead of hanging, and the next call after the network returns succeeds', async () => {
    const direct = await fx.freshUrl();
    await (await fx.open(direct)).migrate();
    const u = new URL(direct);
    const proxy = await FaultProxy.start({ host: u.hostname, port: Number(u.port || 5432) });
    try {
      const url = proxy.urlThrough(direct);
      const options = { connectTimeoutMs: 1_000, statementTimeoutMs: 500, writeDeadlineMs: 1_500 };
      const store = await fx.open(url, options);
      const companyId = (await store.org.createCompany({ name: 'Quiet' })).id;

      proxy.silence();
      expect(await codeOf(store.tasks.createTask({ companyId, title: 'x', requiresFilesystem: false }))).toBe(
        'DATABASE_UNAVAILABLE',
      );
      expect(await codeOf(store.tasks.listTasks())).toBe('DATABASE_UNAVAILABLE');
      expect(await codeOf(openStore({ url, ...options }))).toBe('DATABASE_UNAVAILABLE');

      proxy.restore();
      const task = await store.tasks.createTask({ companyId, title: 'after', requiresFilesystem: false });
      expect((await retryRead(() => store.tasks.listTasks())).map((t) => t.id)).toEqual([task.id]);
    } finally {
      await proxy.close();
    }
  });
});

describe('a database that stops accepting connections', () => {
  it('fails typed while connections are refused, and works again as soon as they are allowed', async () => {
    const url = await fx.freshUrl();
    const store = await fx.open(url, { writeDeadlineMs: 800 });
    await store.migrate();
    const companyId = (await store.org.createCompany({ name: 'Closed' })).id;
    const name = databaseOf(url);
    const adminUrl = new URL(url);
    adminUrl.pathname = '/postgres';
    await admin(adminUrl.toString(), async (c) => {
      await c.query(`alter database ${name} allow_connections false`);
      try {
        await c.query(
          'select pg_terminate_backend(pid) from pg_stat_activity where datname = $1 and pid <> pg_backend_pid()',
          [name],
        );
        expect(
          await codeOf(store.tasks.createTask({ id: 'closed-1', companyId, title: 'x', requiresFilesystem: false })),
        ).toBe('DATABASE_UNAVAILABLE');
        expect(await codeOf(store.tasks.getTask('closed-1'))).toBe('DATABASE_UNAVAILABLE');
      } finally {
        await c.query(`alter database ${name} allow_connections true`);
      }
    });
    expect(await store.tasks.getTask('closed-1')).toBeNull();
    expect(
      (await store.tasks.createTask({ id: 'closed-1', companyId, title: 'x', requiresFilesystem: false })).id,
    ).toBe('closed-1');
  });
});

describe('lock and statement timeouts', () => {
  it('a lock held past lock_timeout is LOCK_TIMEOUT and changes nothing; a statement past statement_timeout is STATEMENT_TIMEOUT', async () => {
    const url = await fx.freshUrl();
    const setup = await fx.open(url);
    await setup.migrate();
    const { companyId, workspaceId } = await seed(setup);
    const run = await setup.runs.startCoordinatorRun({ targetKey: null });
    const claimed = await setup.locks.claimWorkspaceLock(workspaceId, { holder: 'a', runId: run.id, ttlMs: 60_000 });
    expect(claimed.status).toBe('acquired');

    const impatient = await fx.open(url, { lockTimeoutMs: 200, writeDeadlineMs: 2_000 });
    await admin(url, async (c) => {
      await c.query('begin');
      await c.query('select * from workspace_locks where workspace_id = $1 for update', [workspaceId]);
      try {
        const error = await impatient.locks
          .claimWorkspaceLock(workspaceId, { holder: 'b', runId: run.id, ttlMs: 1 })
          .catch((e: unknown) => e);
        expect(error).toMatchObject({ code: 'LOCK_TIMEOUT', driverCode: '55P03', retrySafe: true });
      } finally {
        await c.query('rollback');
      }
    });
    expect(await setup.locks.getWorkspaceLock(workspaceId)).toMatchObject({ holder: 'a' });

    // lock_timeout off, statement_timeout short: waiting on the run-target lock runs into statement_timeout.
    const slow = await fx.open(url, { lockTimeoutMs: 0, statementTimeoutMs: 300, writeDeadlineMs: 2_000 });
    await admin(url, async (c) => {
      await c.query('begin');
      await c.query('select * from tasks for update');
      await c.query('lock table tasks in exclusive mode');
      try {
        const error = await slow.tasks
          .createTask({ id: 'slow-1', companyId, title: 'x', requiresFilesystem: false })
          .catch((e: unknown) => e);
        expect(error).toMatchObject({ code: 'STATEMENT_TIMEOUT', driverCode: '57014' });
      } finally {
        await c.query('rollback');
      }
    });
    expect(await setup.tasks.getTask('slow-1')).toBeNull();
  });
  it("a key taken in BEGIN's round trip (lockKeys) times out as LOCK_TIMEOUT and leaves its connection clean for the next call", async () => {
    const url = await fx.freshUrl();
    const setup = await fx.open(url);
    await setup.migrate();
    const { workspaceId } = await seed(setup);
    // One connection, so the call after the timeout runs on the connection whose BEGIN timed out.
    const impatient = await fx.open(url, { lockTimeoutMs: 200, writeDeadlineMs: 1_000, poolSize: 1 });
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let holding!: () => void;
    const holds = new Promise<void>((resolve) => (holding = resolve));
    // A host transaction holds the workspace's paths key (tx.* takes it with its own statement).
    const host = setup.transaction(async (tx) => {
      await tx.paths.tryAcquirePaths({ workspaceId, holder: 'host', paths: ['docs'], ttlMs: 60_000 });
      holding();
      await held;
    });
    await holds;
    try {
      const error = await impatient.paths
        .tryAcquirePaths({ workspaceId, holder: 'b', paths: ['src'], ttlMs: 60_000 })
        .catch((e: unknown) => e);
      expect(error).toMatchObject({ code: 'LOCK_TIMEOUT', driverCode: '55P03', retrySafe: true });
    } finally {
      release();
      await host;
    }
    // Mutant "no rollback after a failed BEGIN": this call gets 25P02 (the transaction is aborted).
    const next = await impatient.paths.tryAcquirePaths({ workspaceId, holder: 'b', paths: ['src'], ttlMs: 60_000 });
    expect(next.status).toBe('acquired');
    expect(await impatient.semaphores.acquire('after-timeout', { holder: 'b', limit: 1, ttlMs: 60_000 })).toMatchObject(
      {
        status: 'acquired',
      },
    );
  });
});
