/**
 * `taskfence inspect` through the real CLI (dist/cli.js in a child process) against a live store:
 * the sections and their JSON keys, the terminal text, `inspect task <id>`, exit codes, and that
 * the password in the URL never reaches the output. Run `npm run build` first.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { existsSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import type { Store } from '../../src/index.js';
import { explainTask, inspectStore } from '../../src/inspect/index.js';
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
    expect(Object.keys(snapshot)).toEqual(['runs', 'dispatches', 'locks', 'paths', 'ownership', 'inbox']);
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
    expect(snapshot.paths.workspaces.items[0]).toMatchObject({ live: 3, expired: 0 });

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

    // inbox: the run's inbox holds two pending messages.
    expect(snapshot.inbox.inboxes.items).toEqual([
      expect.objectContaining({ handle: world.coordinatorHandle, depth: 2 }),
    ]);
    expect(snapshot.inbox.pendingTotal).toBe(await store.messages.countPendingMessages(world.coordinatorHandle));
  });

  it('the text fits a 100-column terminal, shows the tree and the stale run, and never prints the password', async () => {
    const result = await runCli(['inspect', '--db', url], { env: { COLUMNS: '100' } });
    expect(result.code, result.err).toBe(0);
    const lines = result.out.trimEnd().split('\n');
    for (const line of lines) expect([...line].length, line).toBeLessThanOrEqual(100);
    for (const heading of ['RUNS:', 'DISPATCHES:', 'LOCKS:', 'PATHS:', 'OWNERSHIP:', 'INBOX:'])
      expect(
        lines.some((l) => l.startsWith(heading)),
        heading,
      ).toBe(true);
    expect(result.out).toMatch(/STALE/);
    expect(result.out).toMatch(/\n {4}├─ docs\n {4}│ {2}└─ README\.md {2}\S+-agent-a \(task \S+\) in \d+ min/);
    expect(result.out).toMatch(/\n {4}└─ src\n {7}├─ auth {2}\S+-agent-a/);
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
    expect(explanation.task).toMatchObject({ id: world.gatedTaskId, status: 'ready' });
    expect(explanation.gates).toEqual([expect.objectContaining({ id: world.gateId, status: 'open' })]);
    expect(explanation.reasons[0]).toMatch(new RegExp(`^Gate ${world.gateId} is open: "Release on Friday\\?"`));

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
}
