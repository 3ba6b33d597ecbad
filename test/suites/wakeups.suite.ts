import pg from 'pg';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { Store } from '../../src/index.js';
import type { DialectFixture } from '../support/fixtures.js';

/** Effectively never: with it, only a notification can wake a waiter (a missing one fails the test by its timeout). */
const NEVER = 10 * 365 * 24 * 3600_000 - 1;
const WAIT = { timeout: 30_000 };

/**
 * Wake-ups (SPEC §5 blocking acquisition, inbox consumers): a waiter wakes when the lease it waits
 * for is released or a message arrives — through LISTEN/NOTIFY on PostgreSQL, the commit hook and
 * the file's data version on SQLite — and a waiter whose notification is lost still wakes after the
 * fallback interval.
 */
export function defineWakeupSuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  let url: string;
  let companyId: string;
  let setup: Store;
  beforeAll(async () => {
    fx = makeFixture();
    url = await fx.freshUrl();
    setup = await fx.open(url);
    await setup.migrate();
    companyId = (await setup.org.createCompany({ name: 'Wake' })).id;
  });
  afterAll(() => fx.cleanup());

  it('a blocked acquirePaths wakes when another connection releases the lease, without polling', WAIT, async () => {
    const waiterStore = await fx.open(url, { wakeFallbackMs: NEVER });
    const other = await fx.open(url);
    const ws = await setup.org.createWorkspace({ companyId, name: 'paths' });
    await other.paths.tryAcquirePaths({ workspaceId: ws.id, holder: 'holder', paths: ['src'], ttlMs: 600_000 });
    const waiting = waiterStore.paths.acquirePaths(
      { workspaceId: ws.id, holder: 'waiter', paths: ['src/a.ts'], ttlMs: 60_000 },
      { timeoutMs: 600_000 },
    );
    await new Promise((resolve) => setTimeout(resolve, 200));
    await other.paths.releasePaths({ workspaceId: ws.id, holder: 'holder' });
    const leases = await waiting;
    expect(leases.map((l) => l.holder)).toEqual(['waiter']);
  });

  it('a blocked acquirePaths wakes when the same store releases the lease', WAIT, async () => {
    const store = await fx.open(url, { wakeFallbackMs: NEVER });
    const ws = await setup.org.createWorkspace({ companyId, name: 'same' });
    await store.paths.tryAcquirePaths({ workspaceId: ws.id, holder: 'holder', paths: ['docs'], ttlMs: 600_000 });
    const waiting = store.paths.acquirePaths(
      { workspaceId: ws.id, holder: 'waiter', paths: ['docs'], ttlMs: 60_000 },
      { timeoutMs: 600_000 },
    );
    await new Promise((resolve) => setTimeout(resolve, 100));
    await store.paths.releasePaths({ workspaceId: ws.id, holder: 'holder' });
    expect((await waiting).map((l) => l.key)).toEqual(['docs']);
  });

  it('waitForMessages returns the message another connection sends, and [] at its timeout', WAIT, async () => {
    const consumer = await fx.open(url, { wakeFallbackMs: NEVER });
    const sender = await fx.open(url);
    const waiting = consumer.messages.waitForMessages('inbox-wake', { timeoutMs: 600_000 });
    await new Promise((resolve) => setTimeout(resolve, 200));
    const sent = await sender.messages.sendMessage({
      allowUnknownRecipient: true,
      from: 'worker',
      to: 'inbox-wake',
      kind: 'done',
      payload: { ok: true },
    });
    expect((await waiting).map((m) => m.id)).toEqual([sent.id]);
    expect(await consumer.messages.waitForMessages('inbox-empty', { timeoutMs: 50 })).toEqual([]);
  });

  it('a waiter whose notifications are lost still wakes after the fallback interval', WAIT, async () => {
    const consumer = await fx.open(url, { wakeNotifications: false, wakeFallbackMs: 150 });
    const sender = await fx.open(url, { wakeNotifications: false });
    const waiting = consumer.messages.waitForMessages('inbox-lost', { timeoutMs: 600_000 });
    await new Promise((resolve) => setTimeout(resolve, 100));
    const sent = await sender.messages.sendMessage({
      allowUnknownRecipient: true,
      from: 'worker',
      to: 'inbox-lost',
      kind: 'done',
    });
    expect((await waiting).map((m) => m.id)).toEqual([sent.id]);
  });

  if (makeFixture().kind === 'postgres') {
    it(
      'the listening connection reconnects after its backend is terminated, and waiters wake again',
      WAIT,
      async () => {
        const consumer = await fx.open(url, { wakeFallbackMs: NEVER });
        const sender = await fx.open(url);
        const first = consumer.messages.waitForMessages('inbox-reconnect', { timeoutMs: 600_000 });
        await new Promise((resolve) => setTimeout(resolve, 200));
        await sender.messages.sendMessage({
          allowUnknownRecipient: true,
          from: 'w',
          to: 'inbox-reconnect',
          kind: 'one',
        });
        expect(await first).toHaveLength(1);
        const admin = new pg.Client({ connectionString: url });
        await admin.connect();
        try {
          const { rows } = await admin.query(
            "select pg_terminate_backend(pid) as done from pg_stat_activity where application_name = 'taskfence-listen' and datname = current_database()",
          );
          expect(rows.some((r) => r.done)).toBe(true);
        } finally {
          await admin.end();
        }
        const second = consumer.messages.waitForMessages('inbox-reconnect', { timeoutMs: 600_000 });
        await new Promise((resolve) => setTimeout(resolve, 500));
        await sender.messages.sendMessage({
          allowUnknownRecipient: true,
          from: 'w',
          to: 'inbox-reconnect',
          kind: 'two',
        });
        expect((await second).map((m) => m.kind)).toEqual(['two']);
      },
    );
  }
}
