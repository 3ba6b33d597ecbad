/**
 * `taskfence inspect` through the real CLI (dist/cli.js in a child process) against a live store:
 * the sections and their JSON keys, the terminal text, `inspect task <id>`, exit codes, and that
 * the password in the URL never reaches the output. Run `npm run build` first.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { existsSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import type { Store } from '../../src/index.js';
import { explainTask, inspectStore, runTimeline } from '../../src/inspect/index.js';
import type { DialectFixture } from '../support/fixtures.js';
import { seedOpsWorld, type OpsWorld } from '../support/ops-world.js';
import { holdWriteLock } from '../support/hold-write-lock.js';
import { CLI, expectOneLine, runCli } from './cli.suite.js';

/** The URL with a password in it (PostgreSQL), to prove it is never printed; SQLite URLs have none. */
export type UrlWithSecret = (url: string) => { url: string; secret: string | null };

export function defineInspectSuite(makeFixture: () => DialectFixture, withSecret: UrlWithSecret) {
  let fx: DialectFixture;
  let store: Store;
  let world: OpsWorld;
  let url: string;
  let secret: string | null;

  beforeAll(async () => {
    if (!existsSync(CLI)) throw new Error(`${CLI} is missing: run \`npm run build\` first`);
    fx = makeFixture();
    store = await fx.freshStore();
    const ns = `w${randomBytes(3).toString('hex')}`;
    world = await seedOpsWorld(store, ns, (offsetMs) =>
      fx.open(store.location.url, { clock: { now: () => Date.now() - offsetMs } }),
    );
    ({ url, secret } = withSecret(store.location.url));
  });
  afterAll(() => fx.cleanup());

  it('--json prints one object whose keys are the sections, each agreeing with the repositories', async () => {
    const result = await runCli(['inspect', '--db', url, '--json', '--stale-after', '5m']);
    expect(result.code, result.err).toBe(0);
    expect(result.out.trimEnd().split('\n')).toHaveLength(1);
    const snapshot = JSON.parse(result.out);
    expect(Object.keys(snapshot)).toEqual([
      'runs',
      'dispatches',
      'locks',
      'paths',
      'semaphores',
      'inbox',
      'ownership',
      'readyQueue',
    ]);
    for (const section of Object.values<{ at: number }>(snapshot)) expect(section.at).toBe(snapshot.runs.at);

    // runs: the live run is fresh, the silent one stale; task counts by status.
    expect(snapshot.runs.staleAfterMs).toBe(300_000);
    const running = new Map(snapshot.runs.running.items.map((r: any) => [r.id, r]));
    expect(running.get(world.runId)).toMatchObject({ stale: false, targetKey: expect.stringMatching(/^worktree:/) });
    expect((running.get(world.runId) as any).tasks).toEqual(
      Object.fromEntries(
        Object.entries(
          (await store.tasks.listTasks({ runId: world.runId })).reduce<Record<string, number>>(
            (acc, t) => ({ ...acc, [t.status]: (acc[t.status] ?? 0) + 1 }),
            {},
          ),
        ),
      ),
    );
    expect(running.get(world.staleRunId)).toMatchObject({ stale: true });
    expect((running.get(world.staleRunId) as any).heartbeatAgeMs).toBeGreaterThanOrEqual(600_000);

    // dispatches: the active one, per terminal, with the task lease it runs under.
    const lease = await store.locks.getTaskLease(world.dispatchedTaskId);
    expect(snapshot.dispatches.active.items).toEqual([
      expect.objectContaining({
        id: world.dispatchId,
        terminalHandle: world.terminalHandle,
        taskId: world.dispatchedTaskId,
        coordinatorRunId: world.runId,
        lease: expect.objectContaining({ holder: lease!.holder, token: lease!.token, expiresAt: lease!.expiresAt }),
      }),
    ]);

    // locks: holder, token and time left of the workspace lock and the task lease.
    const lock = await store.locks.getWorkspaceLock(world.workspaceId);
    expect(snapshot.locks.workspaces.items).toEqual([
      expect.objectContaining({
        workspaceId: world.workspaceId,
        holder: lock!.holder,
        runId: world.runId,
        token: world.workspaceLockToken,
        expiresAt: lock!.expiresAt,
        expired: false,
      }),
    ]);
    const ws = snapshot.locks.workspaces.items[0];
    expect(ws.leftMs).toBe(ws.expiresAt - snapshot.locks.at);
    expect(snapshot.locks.tasks.items).toEqual([
      expect.objectContaining({ taskId: world.dispatchedTaskId, token: world.taskLeaseToken }),
    ]);

    // paths: a tree, each lease at its node.
    expect(snapshot.paths.workspaces.items).toHaveLength(1);
    const tree = snapshot.paths.workspaces.items[0].tree;
    const node = (path: string) => {
      let at = tree;
      for (const segment of path.split('/')) at = at.children.find((c: any) => c.name === segment);
      return at;
    };
    expect(tree.children.map((c: any) => c.name)).toEqual(['docs', 'src']);
    expect(node('src').leases).toEqual([]);
    expect(node('src/auth').leases).toEqual([
      expect.objectContaining({ holder: expect.stringMatching(/-agent-a$/), taskId: world.dispatchedTaskId }),
    ]);
    expect(node('src/ui/button.ts').leases).toEqual([
      expect.objectContaining({ holder: expect.stringMatching(/-agent-b$/), taskId: null }),
    ]);
    expect(node('docs/README.md').leases).toHaveLength(1);
    expect(snapshot.paths.workspaces.items[0]).toMatchObject({
      workspaceId: world.pathsWorkspaceId,
      live: 3,
      expired: 0,
    });

    // ownership: the environment at generation 1, no cleanup.
    expect(snapshot.ownership.resources.items).toEqual([
      expect.objectContaining({
        kind: 'environment',
        id: world.environmentId,
        ownerTaskId: world.dispatchedTaskId,
        generation: 1,
        cleanup: 'none',
      }),
    ]);

    // semaphores: two live slots of three (the limit acquire was called with), soonest to free first, the latest token.
    expect(snapshot.semaphores.semaphores).toEqual({
      total: 1,
      items: [
        expect.objectContaining({
          name: world.semaphore,
          held: 2,
          limit: 3,
          expired: 0,
          token: 2,
          slots: [
            expect.objectContaining({ holder: expect.stringMatching(/-build-1$/), token: 1 }),
            expect.objectContaining({ holder: expect.stringMatching(/-build-2$/), token: 2 }),
          ],
        }),
      ],
    });
    const slot = snapshot.semaphores.semaphores.items[0].slots[0];
    expect(slot.leftMs).toBe(slot.expiresAt - snapshot.semaphores.at);
    expect(slot.leftMs).toBeGreaterThan(500_000);

    // inbox: the run's inbox holds two pending messages; the worker's one redelivered and one dead.
    expect(snapshot.inbox.inboxes.items).toEqual([
      expect.objectContaining({ handle: world.coordinatorHandle, depth: 2, inFlight: 0, redelivered: 0, dead: 0 }),
      expect.objectContaining({ handle: world.workerInbox, depth: 1, inFlight: 1, redelivered: 1, dead: 1 }),
    ]);
    expect(snapshot.inbox.pendingTotal).toBe(
      (await store.messages.countPendingMessages(world.coordinatorHandle)) +
        (await store.messages.countPendingMessages(world.workerInbox)),
    );
    expect(snapshot.inbox).toMatchObject({ redeliveredTotal: 1, deadTotal: 1 });
    const dead = await store.messages.listDeadMessages(world.workerInbox);
    expect(snapshot.inbox.dead.items).toEqual([
      expect.objectContaining({
        id: world.deadMessageId,
        handle: world.workerInbox,
        attempts: dead[0]!.attempts,
        deadAt: dead[0]!.deadAt,
        lastError: 'compiler crashed',
      }),
    ]);

    // readyQueue: no task is ready (one dispatched, one behind its gate), none waits on a dependency.
    expect(snapshot.readyQueue).toMatchObject({
      dependenciesTracked: true,
      ready: { total: 0, items: [] },
      blockedByDependency: { total: 0, items: [] },
      blockedByGate: {
        total: 1,
        items: [
          expect.objectContaining({
            id: world.gatedTaskId,
            status: 'blocked',
            gates: [expect.objectContaining({ id: world.gateId, question: 'Release on Friday?' })],
          }),
        ],
      },
    });
  });

  it('the text fits a 100-column terminal, shows the tree and the stale run, and never prints the password', async () => {
    const result = await runCli(['inspect', '--db', url], { env: { COLUMNS: '100' } });
    expect(result.code, result.err).toBe(0);
    const lines = result.out.trimEnd().split('\n');
    for (const line of lines) expect([...line].length, line).toBeLessThanOrEqual(100);
    for (const heading of [
      'RUNS:',
      'DISPATCHES:',
      'LOCKS:',
      'PATHS:',
      'SEMAPHORES:',
      'INBOX:',
      'OWNERSHIP:',
      'READY QUEUE:',
    ])
      expect(
        lines.some((l) => l.startsWith(heading)),
        heading,
      ).toBe(true);
    expect(result.out).toMatch(/STALE/);
    expect(result.out).toMatch(/\n {4}├─ docs\n {4}│ {2}└─ README\.md {2}\S+-agent-a \(task \S+\) in \d+ min/);
    expect(result.out).toMatch(/\n {4}└─ src\n {7}├─ auth {2}\S+-agent-a/);
    expect(result.out).toMatch(/\nINBOX: 3 pending messages in 2 inboxes, 1 redelivered, 1 dead\n/);
    expect(result.out).toMatch(/\nSEMAPHORES: 1 with slots\n {2}name +held \/ limit +token/);
    expect(result.out).toMatch(new RegExp(`\\n  ${world.semaphore} +2 / 3 +2 `));
    expect(result.out).toMatch(/\nREADY QUEUE: 0 ready, 0 blocked by a dependency, 1 blocked by a gate\n/);
    if (secret !== null) {
      expect(result.out + result.err).not.toContain(secret);
      expect(result.out).toMatch(/:\*\*\*@/);
    }
    const narrow = await runCli(['inspect', '--db', url], { env: { COLUMNS: '60' } });
    for (const line of narrow.out.trimEnd().split('\n')) expect([...line].length, line).toBeLessThanOrEqual(60);
  });

  it('inspect task <id> explains the task: its run, gates, dispatches and leases', async () => {
    const gated = await runCli(['inspect', 'task', world.gatedTaskId, '--db', url, '--json']);
    expect(gated.code, gated.err).toBe(0);
    const explanation = JSON.parse(gated.out);
    expect(explanation.task).toMatchObject({ id: world.gatedTaskId, status: 'blocked' });
    expect(explanation.gates).toEqual([expect.objectContaining({ id: world.gateId, status: 'open' })]);
    expect(explanation.reasons[0]).toMatch(new RegExp(`^Gate ${world.gateId} is open: "Release on Friday\\?"`));
    // Behind its gate it is not "ready for the next dispatch", whatever its status says.
    expect(explanation.reasons.join('\n')).not.toMatch(/the next dispatch of its run picks it up/);

    const dispatched = await runCli(['inspect', 'task', world.dispatchedTaskId, '--db', url], {
      env: { COLUMNS: '300' },
    });
    expect(dispatched.code, dispatched.err).toBe(0);
    expect(dispatched.out).toContain(`Dispatched to terminal ${world.terminalHandle} (dispatch ${world.dispatchId})`);
    expect(dispatched.out).toMatch(new RegExp(`Its task lease is held by \\S+ \\(token ${world.taskLeaseToken}\\)`));
    expect(dispatched.out).toMatch(
      new RegExp(
        `Workspace ${world.workspaceId} is locked by \\S+ \\(run ${world.runId}\\), token ${world.workspaceLockToken}`,
      ),
    );
    expect(dispatched.out).toMatch(/It holds 2 path leases \(docs\/README\.md, src\/auth\)/);
    expect(dispatched.out).toMatch(new RegExp(`environment ${world.environmentId} {2}generation 1, active`));

    const missing = await runCli(['inspect', 'task', 'no-such-task', '--db', url]);
    expect(missing.code).toBe(1);
    expectOneLine(missing);
    expect(missing.err).toMatch(/No task with id "no-such-task"/);
  });

  it('reads without writing: it answers while another connection holds the write lock (SQLite) and a row lock, and sees only committed state', async () => {
    // A reader store of its own, on a read-write connection: a write transaction would wait for
    // the held write lock (SQLite BEGIN IMMEDIATE) and give up after writeDeadlineMs.
    const reader = await fx.open(store.location.url, { writeDeadlineMs: 2_000 });
    const committed = (await store.locks.getWorkspaceLock(world.workspaceId))!.holder;
    const lock = await holdWriteLock(store, (trx) =>
      trx
        .updateTable('workspace_locks')
        .set({ holder: 'uncommitted-holder' })
        .where('workspace_id', '=', world.workspaceId)
        .execute(),
    );
    try {
      const snapshot = await inspectStore(reader);
      expect(snapshot.locks.workspaces.items.map((l) => l.holder)).toEqual([committed]);
      const explanation = await explainTask(reader, world.dispatchedTaskId);
      expect(explanation.leases.workspaces.map((l) => l.holder)).toEqual([committed]);
    } finally {
      await lock.release();
    }
  });

  it('readyQueue: a task waits while a dependency is not done, and is ready once every one is', async () => {
    const deps = await fx.freshStore();
    const ns = `d${randomBytes(3).toString('hex')}`;
    const company = await deps.org.createCompany({ id: `${ns}-co`, name: 'Acme' });
    const task = (id: string, status: 'ready' | 'todo', dependsOn: string[] = []) =>
      deps.tasks.createTask({
        id: `${ns}-${id}`,
        companyId: company.id,
        title: id,
        status,
        requiresFilesystem: false,
        dependsOn,
      });
    const build = await task('build', 'ready');
    const test = await task('test', 'todo');
    // ship waits on build (ready) and test (todo); docs on build. Both are stored blocked.
    const ship = await task('ship', 'ready', [build.id, test.id]);
    const docs = await task('docs', 'ready', [build.id]);
    const q = (await inspectStore(deps)).readyQueue;
    expect(q.dependenciesTracked).toBe(true);
    expect(q.ready.items.map((t) => t.id)).toEqual([build.id]);
    expect(q.blockedByDependency.total).toBe(2);
    expect(q.blockedByDependency.items).toEqual(
      expect.arrayContaining([
        expect.objectContaining({
          id: ship.id,
          status: 'blocked',
          openDependencies: 2,
          waitingOn: [
            { id: build.id, status: 'ready' },
            { id: test.id, status: 'todo' },
          ],
        }),
        expect.objectContaining({ id: docs.id, openDependencies: 1, waitingOn: [{ id: build.id, status: 'ready' }] }),
      ]),
    );
    const why = await explainTask(deps, ship.id);
    expect(why.dependencies).toEqual([
      { id: build.id, status: 'ready' },
      { id: test.id, status: 'todo' },
    ]);
    expect(why.reasons[0]).toBe(`It waits on 2 dependencies not done: ${build.id} (ready), ${test.id} (todo).`);

    // build and test done (dispatched and completed): ship and docs are ready, oldest first.
    await deps.tasks.transitionTask(test.id, { from: 'todo', to: 'ready' });
    for (const t of [build, test]) {
      const dispatch = await deps.dispatches.createDispatch({ taskId: t.id, terminalHandle: `${ns}-terminal` });
      await deps.dispatches.completeDispatch(dispatch.id);
    }
    const done = (await inspectStore(deps)).readyQueue;
    expect(done.blockedByDependency).toEqual({ total: 0, items: [] });
    expect(done.ready.items.map((t) => t.id)).toEqual([ship.id, docs.id]);

    const text = await runCli(['inspect', '--db', deps.location.url], { env: { COLUMNS: '200' } });
    expect(text.code, text.err).toBe(0);
    expect(text.out).toMatch(/\nREADY QUEUE: 2 ready, 0 blocked by a dependency, 0 blocked by a gate\n/);
  });

  it("runTimeline returns the dependency edges of the run's tasks, for the task graph", async () => {
    const deps = await fx.freshStore();
    const ns = `g${randomBytes(3).toString('hex')}`;
    const company = await deps.org.createCompany({ id: `${ns}-co`, name: 'Acme' });
    const run = await deps.runs.startCoordinatorRun({ targetKey: `worktree:${ns}` });
    const task = (id: string, dependsOn: string[] = [], parentId?: string) =>
      deps.tasks.createTask({
        id: `${ns}-${id}`,
        companyId: company.id,
        title: id,
        status: 'ready',
        requiresFilesystem: false,
        targetKey: `worktree:${ns}`,
        dependsOn,
        ...(parentId === undefined ? {} : { parentId }),
      });
    const build = await task('build');
    const test = await task('test', [build.id]);
    // A subtask is no dependency edge: only task_dependencies are.
    const ship = await task('ship', [build.id, test.id], build.id);
    const timeline = await runTimeline(deps, run.id);
    expect(timeline.tasks.map((t) => t.id)).toEqual([build.id, test.id, ship.id]);
    expect(timeline.dependencies).toEqual([
      { taskId: test.id, dependsOnId: build.id },
      { taskId: ship.id, dependsOnId: build.id },
      { taskId: ship.id, dependsOnId: test.id },
    ]);
  });

  it('exit codes: 2 for usage errors, 1 with one line for a database behind this code', async () => {
    for (const args of [
      ['inspect', '--db', url, '--nope'],
      ['inspect', 'task'],
      ['inspect', '--db', url, '--stale-after', 'soon'],
      ['inspect', '--db', url, '--limit', '0'],
    ]) {
      const result = await runCli(args);
      expect(result.code, args.join(' ')).toBe(2);
      expectOneLine(result);
    }
    const behind = await fx.freshStore({ to: 8 });
    const result = await runCli(['inspect', '--db', behind.location.url]);
    expect(result.code).toBe(1);
    expectOneLine(result);
    expect(result.err).toMatch(/schema version 0008, this taskfence needs \d+\. Run `taskfence migrate`/);
    expect((await runCli(['inspect', '--help'])).out).toMatch(/inspect task <id>/);
  });

  it('shows a semaphore against the limit of its latest grant', async () => {
    const store = await fx.freshStore();
    const name = 'limits';
    const grant = async (holder: string, limit: number) => {
      const r = await store.semaphores.acquire(name, { holder, limit, ttlMs: 600_000 });
      if (r.status !== 'acquired') throw new Error('expected a grant');
    };
    await grant('a', 2);
    let view = (await inspectStore(store)).semaphores.semaphores.items[0];
    expect(view).toMatchObject({ name, held: 1, limit: 2 });
    // A grant under another limit: the latest wins. A busy call changes nothing.
    await grant('b', 5);
    expect(await store.semaphores.acquire(name, { holder: 'c', limit: 1, ttlMs: 1000 })).toMatchObject({
      status: 'busy',
    });
    view = (await inspectStore(store)).semaphores.semaphores.items[0];
    expect(view).toMatchObject({ name, held: 2, limit: 5 });
    const json = await runCli(['inspect', '--db', store.location.url, '--json']);
    expect(json.code, json.err).toBe(0);
    expect(JSON.parse(json.out).semaphores.semaphores.items[0]).toMatchObject({ name, held: 2, limit: 5 });
    const text = await runCli(['inspect', '--db', store.location.url], { env: { COLUMNS: '100' } });
    expect(text.out).toMatch(/\n {2}limits +2 \/ 5 +2 /);
  });
}
