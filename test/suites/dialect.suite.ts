import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fileURLToPath } from 'node:url';
import { sql } from 'kysely';
import type { Store } from '../../src/index.js';
import type { DialectFixture } from '../support/fixtures.js';
import { holdWriteLock } from '../support/hold-write-lock.js';
import { Contenders } from '../support/race.js';

const OPS = fileURLToPath(new URL('./dialect.ops.ts', import.meta.url));

export function defineDialectSuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  beforeAll(() => {
    fx = makeFixture();
  });
  afterAll(() => fx.cleanup());

  describe('write transactions', () => {
    it('lose no update when six processes read-modify-write one row at once', async () => {
      const store = await fx.freshStore();
      await store.org.createCompany({ id: 'counter', name: 'counter' });
      await store.db.updateTable('companies').set({ created_at: 0 }).where('id', '=', 'counter').execute();
      const url = (store as Store).location.url;
      const contenders = await Contenders.start(6, { url, module: OPS });
      try {
        for (let round = 0; round < 3; round++) {
          const outcomes = await contenders.race('incrementCounter', () => ({ times: 25 }));
          for (const o of outcomes) expect(o, JSON.stringify(o)).toMatchObject({ ok: true });
        }
      } finally {
        await contenders.close();
      }
      const row = await store.db.selectFrom('companies').select('created_at').where('id', '=', 'counter').executeTakeFirstOrThrow();
      expect(Number(row.created_at)).toBe(6 * 25 * 3);
    });

    it('retry a write stuck behind a writer that holds the lock past busy_timeout, instead of surfacing SQLITE_BUSY', async () => {
      const holder = await fx.freshStore();
      const waiter = await fx.open(holder.location.url, { busyTimeoutMs: 50 });
      const lock = await holdWriteLock(holder, (trx) => trx.insertInto('companies').values({ id: 'first', name: 'holder', created_at: 1 }).execute());
      const retriesBefore = waiter.dialect.stats.retries;
      const sending = waiter.messages.sendMessage({ from: 'w', to: 'c', kind: 'k', payload: null });
      const creating = waiter.org.createCompany({ id: 'second', name: 'waiter' });
      await new Promise((resolve) => setTimeout(resolve, 300)); // several busy timeouts
      await lock.release();
      await expect(sending).resolves.toMatchObject({ to: 'c' });
      await expect(creating).resolves.toMatchObject({ id: 'second' });
      if (fx.kind === 'sqlite') expect(waiter.dialect.stats.retries).toBeGreaterThan(retriesBefore);
      expect((await holder.db.selectFrom('companies').select('id').orderBy('id').execute()).map((r) => r.id)).toEqual(['first', 'second']);
    });

    it('roll back everything when the function throws', async () => {
      const store = await fx.freshStore();
      await expect(
        store.dialect.writeTransaction(async (trx) => {
          await trx.insertInto('companies').values({ id: 'rolled-back', name: 'x', created_at: 1 }).execute();
          throw new Error('boom');
        }),
      ).rejects.toThrow('boom');
      expect(await store.db.selectFrom('companies').select('id').execute()).toEqual([]);
    });
  });

  describe('error classification', () => {
    it('classifies unique, foreign-key and check violations the same way on both dialects', async () => {
      const store = await fx.freshStore();
      await store.org.createCompany({ id: 'c', name: 'c' });
      const classify = async (fn: () => Promise<unknown>) => store.dialect.classifyError(await fn().then(() => null, (e: unknown) => e));
      expect(await classify(() => store.db.insertInto('companies').values({ id: 'c', name: 'again', created_at: 1 }).execute())).toBe('unique_violation');
      expect(await classify(() => store.db.insertInto('workspaces').values({ id: 'w', company_id: 'missing', name: 'w', root_path: null, created_at: 1 }).execute())).toBe('foreign_key_violation');
      expect(await classify(() => sql`insert into coordinator_runs (id, coordinator_handle, status, started_at) values ('r', 'h', 'bogus', 1)`.execute(store.db))).toBe('check_violation');
      expect(store.dialect.classifyError(new Error('something else'))).toBe('unknown');
    });
  });
}
