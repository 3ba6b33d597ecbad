import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { postgresFixture } from '../support/dialects.js';
import { useUrlSchema } from '../support/schema.js';

/*
 * Consumers of one inbox run in parallel on PostgreSQL (FOR UPDATE SKIP LOCKED): a claim in
 * flight does not make another consumer wait; it takes the next messages. Exactly-once delivery
 * under 8 consumers is raced in the run-scoping suite.
 */

const fx = postgresFixture();
afterAll(() => fx.cleanup());

describe('parallel inbox consumers', () => {
  it('a consumer skips the messages another in-flight claim holds instead of waiting for it', async () => {
    const url = await fx.freshUrl();
    const store = await fx.open(url);
    await store.migrate();
    for (let i = 0; i < 10; i++)
      await store.messages.sendMessage({
        allowUnknownRecipient: true,
        from: 'w',
        to: 'inbox',
        kind: 'k',
        payload: { i },
      });
    const admin = new pg.Client({ connectionString: url });
    await admin.connect();
    await useUrlSchema(admin, url);
    try {
      // Another consumer mid-claim: it holds the five oldest messages and has not committed.
      await admin.query('begin');
      const held = await admin.query(
        "select id from messages where to_handle = 'inbox' and status = 'pending' order by created_at, id limit 5 for update",
      );
      const delivering = store.messages.deliverPendingMessages('inbox', { limit: 100 });
      // Either the delivery returns, or it is seen waiting on a lock (a failure), whichever comes first.
      let blocked = false;
      const done = delivering.then(() => true);
      while (!(await Promise.race([done, new Promise<false>((resolve) => setTimeout(() => resolve(false), 20))]))) {
        const { rows } = await admin.query(
          "select count(*)::int as n from pg_stat_activity where application_name = 'taskfence' and wait_event_type = 'Lock' and datname = current_database()",
        );
        if (rows[0].n > 0) {
          blocked = true;
          break;
        }
      }
      await admin.query('rollback');
      const got = await delivering;
      expect(blocked, 'the delivery waited for the other claim').toBe(false);
      const heldIds = new Set(held.rows.map((r) => r.id));
      expect(got).toHaveLength(5);
      expect(got.every((m) => !heldIds.has(m.id))).toBe(true);
      // The held ones are still pending and go to the next call.
      expect((await store.messages.deliverPendingMessages('inbox')).map((m) => m.id).sort()).toEqual(
        [...heldIds].sort(),
      );
    } finally {
      await admin.end();
    }
  });
});

describe('the inbox functions (schema 0108, PostgreSQL)', () => {
  it('before 0108 a receive and a delivery fail with SCHEMA_OUT_OF_DATE and hand out nothing; a send works; migrated, they hand out', async () => {
    const store = await fx.freshStore({ to: 107 });
    const run = await store.runs.startCoordinatorRun({ targetKey: 'worktree:inbox-0108' });
    const inbox = run.coordinatorHandle;
    await store.messages.sendMessages([1, 2].map((n) => ({ from: 'w', to: inbox, kind: 'k', payload: { n } })));
    const stale = { code: 'SCHEMA_OUT_OF_DATE', currentVersion: 107 };
    await expect(store.messages.receiveMessages(inbox, { limit: 1 })).rejects.toMatchObject(stale);
    await expect(store.messages.deliverPendingMessages(inbox, { limit: 1 })).rejects.toMatchObject(stale);
    expect(await store.messages.countPendingMessages(inbox)).toBe(2);
    await store.migrate();
    const [received] = await store.messages.receiveMessages(inbox, { limit: 1 });
    // Its first hand-out: the refused calls leased nothing.
    expect([received?.payload, received?.attempt]).toEqual([{ n: 1 }, 1]);
    expect((await store.messages.ackMessages(inbox, [received!.receipt])).acked).toEqual([received!.receipt]);
    expect((await store.messages.deliverPendingMessages(inbox, { limit: 1 })).map((m) => m.payload)).toEqual([
      { n: 2 },
    ]);
  });
});
