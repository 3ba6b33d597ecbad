/**
 * `taskfence ui` over HTTP: the CLI's dashboard process (dist/cli.js) against a live store, on
 * both dialects. Read-only by default; operator actions only with --allow-actions and the printed
 * token; each action and its audit row commit together; no password in any response or log.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import { request } from 'node:http';
import type { Store } from '../../src/index.js';
import { readAuditTrail } from '../../src/inspect/audit.js';
import type { DialectFixture } from '../support/fixtures.js';
import { seedOpsWorld, type OpsWorld } from '../support/ops-world.js';
import { tbl } from '../support/schema.js';
import { CLI } from './cli.suite.js';
import type { UrlWithSecret } from './inspect.suite.js';

/** A `taskfence ui` child process: its URL, token (with --allow-actions) and everything it printed. */
export interface UiProcess {
  readonly url: string;
  readonly token: string | null;
  output(): string;
  stop(): Promise<number | null>;
}

/** Starts `taskfence ui --db <url> --port 0 [...extra]` and waits for its start line. */
export async function startUi(dbUrl: string, extra: readonly string[] = []): Promise<UiProcess> {
  const child: ChildProcess = spawn(process.execPath, [CLI, 'ui', '--db', dbUrl, '--port', '0', ...extra], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, TASKFENCE_DATABASE_URL: undefined },
  });
  let out = '';
  child.stdout!.setEncoding('utf8').on('data', (d: string) => (out += d));
  child.stderr!.setEncoding('utf8').on('data', (d: string) => (out += d));
  const exited = new Promise<number | null>((resolve) => child.on('close', resolve));
  const started = await new Promise<RegExpExecArray>((resolve, reject) => {
    const timer = setInterval(() => {
      const match = / at (http:\/\/127\.0\.0\.1:\d+\/) \((read-only|operator actions on)\)/.exec(out);
      if (match && (match[2] === 'read-only' || /action token (\S+)/.test(out))) {
        clearInterval(timer);
        resolve(match);
      }
    }, 50);
    void exited.then((code) => {
      clearInterval(timer);
      reject(new Error(`taskfence ui exited with ${code}: ${out}`));
    });
  });
  return {
    url: started[1]!,
    token: /action token (\S+)/.exec(out)?.[1] ?? null,
    output: () => out,
    stop: async () => {
      child.kill('SIGTERM');
      return exited;
    },
  };
}

/** One HTTP request; `host` overrides the Host header. */
export function http(
  url: string,
  options: { method?: string; body?: unknown; token?: string; host?: string } = {},
): Promise<{ status: number; text: string; json(): any }> {
  return new Promise((resolve, reject) => {
    const body = options.body === undefined ? undefined : JSON.stringify(options.body);
    const req = request(
      url,
      {
        method: options.method ?? 'GET',
        headers: {
          ...(body === undefined ? {} : { 'content-type': 'application/json' }),
          ...(options.token === undefined ? {} : { authorization: `Bearer ${options.token}` }),
          ...(options.host === undefined ? {} : { host: options.host }),
        },
      },
      (res) => {
        let text = '';
        res.setEncoding('utf8').on('data', (d: string) => (text += d));
        res.on('end', () => resolve({ status: res.statusCode!, text, json: () => JSON.parse(text) }));
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

/** The first `snapshot` event of /api/events. */
function firstEvent(url: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = request(new URL('api/events', url), (res) => {
      let text = '';
      res.setEncoding('utf8').on('data', (d: string) => {
        text += d;
        if (/event: snapshot\ndata: .*\n\n/.test(text)) {
          req.destroy();
          resolve(text);
        }
      });
    });
    req.on('error', reject);
    req.end();
  });
}

export function defineUiSuite(makeFixture: () => DialectFixture, withSecret: UrlWithSecret) {
  let fx: DialectFixture;
  let store: Store;
  let world: OpsWorld;
  let url: string;
  let secret: string | null;
  const running: UiProcess[] = [];

  beforeAll(async () => {
    if (!existsSync(CLI)) throw new Error(`${CLI} is missing: run \`npm run build\` first`);
    fx = makeFixture();
    store = await fx.freshStore();
    world = await seedOpsWorld(store, `u${randomBytes(3).toString('hex')}`, (offsetMs) =>
      fx.open(store.location.url, { clock: { now: () => Date.now() - offsetMs } }),
    );
    ({ url, secret } = withSecret(store.location.url));
  });
  afterAll(async () => {
    await Promise.all(running.map((ui) => ui.stop()));
    await fx.cleanup();
  });

  it('read-only by default: the views answer, every action is refused and nothing changes', async () => {
    const ui = await startUi(url);
    running.push(ui);
    expect(ui.token).toBeNull();
    expect((await http(new URL('api/config', ui.url).href)).json()).toMatchObject({ actions: false });
    const page = await http(ui.url);
    expect(page.status).toBe(200);
    expect(page.text).toContain('<script type="module" src="app.mjs">');
    const frame = (await http(new URL('api/snapshot', ui.url).href)).json();
    expect(Object.keys(frame.snapshot)).toEqual([
      'runs',
      'dispatches',
      'locks',
      'paths',
      'semaphores',
      'inbox',
      'ownership',
      'readyQueue',
    ]);
    const refused = await http(new URL('api/actions/release-workspace-lock', ui.url).href, {
      method: 'POST',
      body: { workspaceId: world.workspaceId, token: world.workspaceLockToken },
      token: 'anything',
    });
    expect(refused.status).toBe(403);
    expect(refused.json().error.code).toBe('ACTIONS_DISABLED');
    expect(await store.locks.getWorkspaceLock(world.workspaceId)).toMatchObject({ token: world.workspaceLockToken });
    // A page of another name (DNS rebinding) gets nothing.
    expect((await http(new URL('api/snapshot', ui.url).href, { host: 'attacker.example:80' })).status).toBe(421);
  });

  it('no password in any page, response, event or log line', async () => {
    const ui = await startUi(url, ['--allow-actions']);
    running.push(ui);
    const timeline = await http(new URL(`api/runs/${world.runId}`, ui.url).href);
    expect(timeline.status).toBe(200);
    expect(timeline.json().dispatches).toEqual([expect.objectContaining({ id: world.dispatchId, status: 'active' })]);
    const bodies = [
      ...(await Promise.all(
        ['', 'app.mjs', 'style.css', 'api/config', 'api/snapshot', 'api/audit', `api/tasks/${world.gatedTaskId}`].map(
          async (path) => (await http(new URL(path, ui.url).href)).text,
        ),
      )),
      timeline.text,
      await firstEvent(ui.url),
      (await http(new URL('api/actions/fail-run', ui.url).href, { method: 'POST', body: {}, token: 'wrong' })).text,
    ];
    expect(bodies.every((b) => b.length > 0)).toBe(true);
    if (secret !== null) {
      for (const body of bodies) expect(body).not.toContain(secret);
      expect(ui.output()).not.toContain(secret);
      expect(ui.output()).toMatch(/:\*\*\*@/);
    }
  });

  it('with --allow-actions and the token, a forced release goes through the fenced call and is in the audit trail; a stale token or a missing audit table changes nothing', async () => {
    const ui = await startUi(url, ['--allow-actions']);
    running.push(ui);
    const action = (name: string, body: unknown, token = ui.token!) =>
      http(new URL(`api/actions/${name}`, ui.url).href, { method: 'POST', body, token });

    expect((await action('release-task-lease', { taskId: world.dispatchedTaskId, token: 1 }, 'wrong')).status).toBe(
      401,
    );
    // A token the page showed before someone re-claimed: the repository's fence refuses it, nothing is recorded.
    const stale = await action('release-task-lease', {
      taskId: world.dispatchedTaskId,
      token: world.taskLeaseToken + 1,
    });
    expect(stale.status).toBe(409);
    expect(stale.json().error.code).toBe('STALE_TASK_LEASE');
    expect(await readAuditTrail(store, { subjectKind: 'task_lease' })).toEqual([]);

    const released = await action('release-task-lease', {
      taskId: world.dispatchedTaskId,
      token: world.taskLeaseToken,
    });
    expect(released.status, released.text).toBe(200);
    expect(await store.locks.getTaskLease(world.dispatchedTaskId)).toBeNull();
    expect(await readAuditTrail(store, { subjectKind: 'task_lease', subjectId: world.dispatchedTaskId })).toEqual([
      expect.objectContaining({
        id: released.json().auditId,
        actor: 'operator',
        action: 'operator.release-task-lease',
        token: world.taskLeaseToken,
        detail: expect.objectContaining({ via: 'taskfence ui', holder: world.runId }),
      }),
    ]);
    // The holder's own token is dead now: renew refuses it, and the next claim gets a higher one.
    await expect(
      store.locks.renewTaskLease(world.dispatchedTaskId, { token: world.taskLeaseToken, ttlMs: 1_000 }),
    ).rejects.toMatchObject({ code: 'STALE_TASK_LEASE' });

    // The audit row and the act commit together: with the table gone, the release rolls back.
    await sql`alter table ${tbl(store.db, 'audit_events')} rename to audit_events_away`.execute(store.db);
    try {
      const failed = await action('release-workspace-lock', {
        workspaceId: world.workspaceId,
        token: world.workspaceLockToken,
      });
      expect(failed.status).toBe(500);
      expect(await store.locks.getWorkspaceLock(world.workspaceId)).toMatchObject({
        token: world.workspaceLockToken,
      });
    } finally {
      await sql`alter table ${tbl(store.db, 'audit_events_away')} rename to audit_events`.execute(store.db);
    }

    const failRun = await action('fail-run', { runId: world.staleRunId });
    expect(failRun.status, failRun.text).toBe(200);
    expect(await store.runs.getCoordinatorRun(world.staleRunId)).toMatchObject({ status: 'failed' });
    expect((await readAuditTrail(store, { subjectId: world.staleRunId }))[0]).toMatchObject({
      action: 'operator.fail-run',
      subjectKind: 'coordinator_run',
    });
    // The lease protocol's release rule: a repeat stop with the status the run has is a no-op success.
    const repeat = await action('fail-run', { runId: world.staleRunId });
    expect(repeat.status, repeat.text).toBe(200);
    expect(await store.runs.getCoordinatorRun(world.staleRunId)).toMatchObject({ status: 'failed' });
    expect((await action('fail-run', { runId: '' })).status).toBe(400);

    // A dead message requeued: the repository's call and its audit row; a second time it is not dead (404).
    const requeued = await action('requeue-message', { handle: world.workerInbox, messageId: world.deadMessageId });
    expect(requeued.status, requeued.text).toBe(200);
    expect(await store.messages.listDeadMessages(world.workerInbox)).toEqual([]);
    expect(await readAuditTrail(store, { subjectKind: 'message', subjectId: world.deadMessageId })).toEqual([
      expect.objectContaining({
        id: requeued.json().auditId,
        action: 'operator.requeue-message',
        detail: expect.objectContaining({ handle: world.workerInbox, lastError: 'compiler crashed' }),
      }),
    ]);
    const again = await action('requeue-message', { handle: world.workerInbox, messageId: world.deadMessageId });
    expect(again.status).toBe(404);
    expect(await readAuditTrail(store, { subjectKind: 'message' })).toHaveLength(1);
    expect(await ui.stop()).toBe(0);
  });
}
