/**
 * The dashboard in a real browser: Debian's Chromium (playwright-core, `executablePath:
 * '/usr/bin/chromium'`) loads `taskfence ui` (the built CLI, a process of its own) against a live
 * store on both dialects while a small workload runs in this process. It checks that a task lease
 * appears, counts down and disappears on release; that a dead message can be requeued with
 * `--allow-actions` (and the token) and not without; that the action is in the audit trail; that
 * the URL's password is on no page and in no response; and it takes the README's screenshot
 * (docs/images/dashboard.png from the PostgreSQL run, when UPDATE_SCREENSHOT=1).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { existsSync, mkdirSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { chromium, type Browser, type Page } from 'playwright-core';
import type { Store } from '../../src/index.js';
import { readAuditTrail } from '../../src/inspect/audit.js';
import type { DialectFixture } from '../support/fixtures.js';
import { postgresFixture, sqliteFixture } from '../support/dialects.js';
import { seedOpsWorld, type OpsWorld } from '../support/ops-world.js';
import { CLI } from '../suites/cli.suite.js';
import { startUi, type UiProcess } from '../suites/ui.suite.js';

const CHROMIUM = '/usr/bin/chromium';

/** The URL with a password (PostgreSQL: the test server ignores it), to prove it is never shown. */
function withSecret(url: string): { url: string; secret: string | null } {
  if (!url.startsWith('postgres')) return { url, secret: null };
  const parsed = new URL(url);
  if (parsed.password === '') parsed.password = `pw-${randomBytes(6).toString('hex')}`;
  return { url: parsed.toString(), secret: decodeURIComponent(parsed.password) };
}

/** Work going on while the page is watched: semaphore slots taken and given back, messages sent, received and acked, heartbeats. */
function startWorkload(store: Store, world: OpsWorld, ns: string) {
  let stopped = false;
  const errors: unknown[] = [];
  const inbox = `${ns}-workload`;
  const loop = (async () => {
    for (let i = 0; !stopped; i++) {
      try {
        const slot = await store.semaphores.acquire(`${ns}-workload`, {
          holder: `${ns}-worker-${i % 3}`,
          limit: 2,
          ttlMs: 30_000,
        });
        await store.messages.sendMessage({
          from: world.terminalHandle,
          to: inbox,
          kind: 'progress',
          payload: { i },
          allowUnknownRecipient: true,
        });
        const received = await store.messages.receiveMessages(inbox, { limit: 10 });
        await store.messages.ackMessages(
          inbox,
          received.map((m) => m.receipt),
        );
        await store.runs.heartbeatCoordinatorRun(world.runId);
        if (slot.status === 'acquired' && i % 2 === 0) await store.semaphores.release(slot.lease);
      } catch (error) {
        errors.push(error);
      }
      await sleep(150);
    }
  })();
  return {
    async stop(): Promise<{ errors: unknown[] }> {
      stopped = true;
      await loop;
      return { errors };
    },
  };
}

/** Every response body the page received (the event stream excluded: it never ends). */
function recordResponses(page: Page): string[] {
  const bodies: string[] = [];
  page.on('response', (response) => {
    if (response.url().endsWith('/api/events')) return;
    void response.text().then(
      (text) => bodies.push(text),
      () => {},
    );
  });
  return bodies;
}

/** The seconds a countdown cell shows (`in 1 min 5 s` → 65). */
function secondsShown(text: string): number {
  const m = /^in (?:(\d+) min )?(\d+) s$/.exec(text.trim());
  if (!m) throw new Error(`not a countdown: ${JSON.stringify(text)}`);
  return Number(m[1] ?? 0) * 60 + Number(m[2]);
}

const dialects: [string, () => DialectFixture][] = [
  ['sqlite', sqliteFixture],
  ['postgres', postgresFixture],
];

describe.each(dialects)('dashboard in Chromium on %s', (dialect, makeFixture) => {
  let fx: DialectFixture;
  let store: Store;
  let world: OpsWorld;
  let ns: string;
  let url: string;
  let secret: string | null;
  let browser: Browser;
  const running: UiProcess[] = [];

  beforeAll(async () => {
    if (!existsSync(CLI)) throw new Error(`${CLI} is missing: run \`npm run build\` first`);
    if (!existsSync(CHROMIUM)) throw new Error(`${CHROMIUM} is missing: apt-get install -y chromium`);
    fx = makeFixture();
    store = await fx.freshStore();
    ns = `b${randomBytes(3).toString('hex')}`;
    world = await seedOpsWorld(store, ns, (offsetMs) =>
      fx.open(store.location.url, { clock: { now: () => Date.now() - offsetMs } }),
    );
    ({ url, secret } = withSecret(store.location.url));
    // Root in CI: Chromium's sandbox needs a user namespace the container may not give.
    browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
  });
  afterAll(async () => {
    await browser?.close();
    await Promise.all(running.map((ui) => ui.stop()));
    await fx?.cleanup();
  });

  it('read-only: a task lease appears, counts down and disappears on release; no requeue without --allow-actions', async () => {
    const workload = startWorkload(store, world, ns);
    const ui = await startUi(url);
    running.push(ui);
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    const bodies = recordResponses(page);
    page.on('dialog', (d) => void d.accept());
    await page.goto(ui.url);
    await page.locator('#live', { hasText: 'live' }).waitFor();
    expect(await page.locator('#mode').textContent()).toBe('read-only');

    // A lease claimed now shows up at the next push, with its token, counting down.
    const task = await store.tasks.createTask({
      id: `${ns}-watched`,
      companyId: world.companyId,
      title: 'Watched task',
      status: 'ready',
      requiresFilesystem: false,
    });
    const claimedAt = Date.now();
    const claim = await store.locks.claimTaskLease(task.id, { holder: `${ns}-watcher`, ttlMs: 40_000 });
    if (claim.status !== 'acquired') throw new Error('the lease was not granted');
    const row = page.locator(`[data-lease="task:${task.id}"]`);
    await row.waitFor({ timeout: 15_000 });
    expect(await row.locator('.token').textContent()).toBe(String(claim.lease.token));
    // The page counts down on its own between pushes: what it shows follows the wall clock
    // within whole seconds, the 250 ms tick and the store-clock offset the page takes from each
    // push (a push delivered late shifts it): ± 3 s, however loaded the machine.
    const read = async () => ({ at: Date.now(), left: secondsShown((await row.locator('td.left').textContent())!) });
    const first = await read();
    expect(first.left).toBeLessThanOrEqual(40);
    expect(Math.abs(first.left - (40 - (first.at - claimedAt) / 1000))).toBeLessThanOrEqual(3);
    await sleep(2_300);
    const later = await read();
    expect(later.left).toBeLessThan(first.left);
    expect(Math.abs(first.left - later.left - (later.at - first.at) / 1000)).toBeLessThanOrEqual(3);

    await store.locks.releaseTaskLease(claim.lease);
    await row.waitFor({ state: 'detached', timeout: 10_000 });

    // The dead message is listed, with no requeue button; a request made anyway is refused.
    const dead = page.locator(`[data-message="${world.deadMessageId}"]`);
    await dead.waitFor();
    expect(await dead.locator('button').count()).toBe(0);
    const refused = await page.evaluate(
      async ({ handle, messageId }) => {
        const res = await fetch('/api/actions/requeue-message', {
          method: 'POST',
          headers: { 'content-type': 'application/json', authorization: 'Bearer guess' },
          body: JSON.stringify({ handle, messageId }),
        });
        return { status: res.status, body: await res.json() };
      },
      { handle: world.workerInbox, messageId: world.deadMessageId },
    );
    expect(refused).toMatchObject({ status: 403, body: { error: { code: 'ACTIONS_DISABLED' } } });
    expect((await store.messages.listDeadMessages(world.workerInbox)).map((m) => m.id)).toEqual([world.deadMessageId]);

    // Semaphores and the ready queue are on the page too.
    await page.locator(`[data-lease^="semaphore:${world.semaphore}:"]`).first().waitFor();
    await page.locator(`[data-queued="gate:${world.gatedTaskId}"]`).waitFor();

    const html = await page.content();
    await page.close();
    expect((await workload.stop()).errors).toEqual([]);
    if (secret !== null) {
      for (const body of [html, ...bodies, ui.output()]) expect(body).not.toContain(secret);
      expect(html).toContain(':***@');
    }
  });

  it('with --allow-actions and the token: requeue a dead message from the page; it is in the audit trail', async () => {
    const workload = startWorkload(store, world, ns);
    const ui = await startUi(url, ['--allow-actions']);
    running.push(ui);
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    const bodies = recordResponses(page);
    page.on('dialog', (d) => void d.accept());
    await page.goto(`${ui.url}#token=${ui.token}`);
    await page.locator('#live', { hasText: 'live' }).waitFor();
    expect(await page.locator('#mode').textContent()).toBe('operator actions on');

    // A lease to show counting down in the screenshot.
    const claim = await store.locks.claimTaskLease(world.gatedTaskId, { holder: `${ns}-reviewer`, ttlMs: 25_000 });
    if (claim.status !== 'acquired') throw new Error('the lease was not granted');
    await page.locator(`[data-lease="task:${world.gatedTaskId}"]`).waitFor();

    // The task graph draws dependencies (task_dependencies), not the parent/subtask tree: a task
    // of the run that waits for the gated one gets an arrow from it.
    const announce = await store.tasks.createTask({
      companyId: world.companyId,
      title: 'Announce the release',
      targetKey: `worktree:${ns}`,
      status: 'ready',
      requiresFilesystem: false,
      dependsOn: [world.gatedTaskId],
    });
    await page.locator(`#runs tr[data-run="${world.runId}"]`).click();
    await page.locator(`#dag [data-task="${announce.id}"][data-status="blocked"]`).waitFor();
    await page.locator(`#dag line[data-edge="${world.gatedTaskId}>${announce.id}"]`).waitFor({ state: 'attached' });
    const x = async (id: string) => Number(await page.locator(`#dag [data-task="${id}"] rect`).getAttribute('x'));
    expect(await x(announce.id)).toBeGreaterThan(await x(world.gatedTaskId));

    const button = page.locator(`[data-message="${world.deadMessageId}"] button[data-action="requeue-message"]`);
    await button.click();
    await page.locator('#message', { hasText: 'requeue-message: done' }).waitFor();
    await page.locator(`[data-message="${world.deadMessageId}"]`).waitFor({ state: 'detached' });
    expect(await store.messages.listDeadMessages(world.workerInbox)).toEqual([]);
    const [event] = await readAuditTrail(store, { subjectKind: 'message', subjectId: world.deadMessageId });
    expect(event).toMatchObject({
      actor: 'operator',
      action: 'operator.requeue-message',
      detail: expect.objectContaining({ via: 'taskfence ui', handle: world.workerInbox }),
    });
    // The page's audit trail shows it at the next push.
    await page.locator(`#audit [data-audit="${event!.id}"][data-action="operator.requeue-message"]`).waitFor();

    // Requeued once: a second requeue (a stale page) is refused and records nothing.
    const again = await page.evaluate(
      async ({ handle, messageId, token }) => {
        const res = await fetch('/api/actions/requeue-message', {
          method: 'POST',
          headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
          body: JSON.stringify({ handle, messageId }),
        });
        return res.status;
      },
      { handle: world.workerInbox, messageId: world.deadMessageId, token: ui.token! },
    );
    expect(again).toBe(404);
    expect(await readAuditTrail(store, { subjectKind: 'message' })).toHaveLength(1);

    await sleep(1_200);
    // The README's picture is rewritten only on request (UPDATE_SCREENSHOT=1 npm run test:browser),
    // so a test run leaves the tree clean; every run still takes one, into .tmp.
    const shots = dialect === 'postgres' && process.env.UPDATE_SCREENSHOT === '1' ? 'docs/images' : '.tmp';
    mkdirSync(shots, { recursive: true });
    await page.screenshot({ path: `${shots}/dashboard${dialect === 'postgres' ? '' : '-sqlite'}.png`, fullPage: true });

    const html = await page.content();
    await page.close();
    expect((await workload.stop()).errors).toEqual([]);
    if (secret !== null) {
      for (const body of [html, ...bodies, ui.output()]) expect(body).not.toContain(secret);
    }
    expect(await ui.stop()).toBe(0);
  });
});
