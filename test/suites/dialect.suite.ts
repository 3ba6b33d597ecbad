import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from 'kysely';
import fc from 'fast-check';
import { elements, prepared } from '../../src/query/prepared.js';
import type { DialectFixture } from '../support/fixtures.js';
import { holdWriteLock } from '../support/hold-write-lock.js';
import { Contenders } from '../support/race.js';
import { ops as OPS } from './dialect.ops.js';
import { tbl } from '../support/schema.js';

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
      const url = store.location.url;
      const contenders = await Contenders.start(6, { url, ops: OPS });
      try {
        for (let round = 0; round < 3; round++) {
          const outcomes = await contenders.race('incrementCounter', () => ({ times: 25 }));
          for (const o of outcomes) expect(o, JSON.stringify(o)).toMatchObject({ ok: true });
        }
      } finally {
        await contenders.close();
      }
      const row = await store.db
        .selectFrom('companies')
        .select('created_at')
        .where('id', '=', 'counter')
        .executeTakeFirstOrThrow();
      expect(Number(row.created_at)).toBe(6 * 25 * 3);
    });

    it('retry a write stuck behind a writer that holds the lock past busy_timeout, instead of surfacing SQLITE_BUSY', async () => {
      const holder = await fx.freshStore();
      const waiter = await fx.open(holder.location.url, { busyTimeoutMs: 50 });
      const lock = await holdWriteLock(holder, (trx) =>
        trx.insertInto('companies').values({ id: 'first', name: 'holder', created_at: 1 }).execute(),
      );
      const retriesBefore = waiter.dialect.stats.retries;
      const sending = waiter.messages.sendMessage({
        allowUnknownRecipient: true,
        from: 'w',
        to: 'c',
        kind: 'k',
        payload: null,
      });
      const creating = waiter.org.createCompany({ id: 'second', name: 'waiter' });
      await new Promise((resolve) => setTimeout(resolve, 300)); // several busy timeouts
      await lock.release();
      await expect(sending).resolves.toMatchObject({ to: 'c' });
      await expect(creating).resolves.toMatchObject({ id: 'second' });
      if (fx.kind === 'sqlite') expect(waiter.dialect.stats.retries).toBeGreaterThan(retriesBefore);
      expect((await holder.db.selectFrom('companies').select('id').orderBy('id').execute()).map((r) => r.id)).toEqual([
        'first',
        'second',
      ]);
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
      const classify = async (fn: () => Promise<unknown>) =>
        store.dialect.classifyError(
          await fn().then(
            () => null,
            (e: unknown) => e,
          ),
        );
      expect(
        await classify(() =>
          store.db.insertInto('companies').values({ id: 'c', name: 'again', created_at: 1 }).execute(),
        ),
      ).toBe('unique_violation');
      expect(
        await classify(() =>
          store.db
            .insertInto('workspaces')
            .values({ id: 'w', company_id: 'missing', name: 'w', root_path: null, created_at: 1 })
            .execute(),
        ),
      ).toBe('foreign_key_violation');
      expect(
        await classify(() =>
          sql`insert into ${tbl(store.db, 'coordinator_runs')} (id, coordinator_handle, status, started_at) values ('r', 'h', 'bogus', 1)`.execute(
            store.db,
          ),
        ),
      ).toBe('check_violation');
      expect(store.dialect.classifyError(new Error('something else'))).toBe('unknown');
    });
  });

  describe('prepared queries', () => {
    const byIds = prepared((db, p: { company: string; ids: readonly string[] }, n: number) =>
      db
        .selectFrom('workspaces')
        .select(['id', 'name'])
        .where('company_id', '=', p.company)
        .where('id', 'in', elements(p.ids, n))
        .orderBy('id'),
    );
    const rename = prepared((db, p: { id: string; name: string }) =>
      db.updateTable('workspaces').set({ name: p.name }).where('id', '=', p.id),
    );

    it('return what the same query built by Kysely returns, for any values and list lengths', async () => {
      const store = await fx.freshStore();
      await store.org.createCompany({ id: 'c', name: 'c' });
      const ids = ['a', 'b', 'c', "d'quote", 'e é', 'f'];
      for (const id of ids) await store.org.createWorkspace({ id, companyId: 'c', name: `ws ${id}` });
      await fc.assert(
        fc.asyncProperty(
          fc.uniqueArray(fc.oneof(fc.constantFrom(...ids), fc.string()), { minLength: 1, maxLength: 5 }),
          fc.constantFrom('c', 'other'),
          async (wanted, company) => {
            const built = await store.db
              .selectFrom('workspaces')
              .select(['id', 'name'])
              .where('company_id', '=', company)
              .where('id', 'in', wanted)
              .orderBy('id')
              .execute();
            expect(await byIds.execute(store.db, { company, ids: wanted }, wanted.length)).toEqual(built);
            // The same inside a write transaction (on SQLite, the direct path on the held connection).
            expect(
              await store.dialect.writeTransaction((trx) =>
                byIds.execute(trx, { company, ids: wanted }, wanted.length),
              ),
            ).toEqual(built);
          },
        ),
        { numRuns: 60 },
      );
    });

    it('bind each call its own values, also for writes, and report affected rows', async () => {
      const store = await fx.freshStore();
      await store.org.createCompany({ id: 'c', name: 'c' });
      await store.org.createWorkspace({ id: 'w1', companyId: 'c', name: 'one' });
      await store.org.createWorkspace({ id: 'w2', companyId: 'c', name: 'two' });
      const renamed = await store.dialect.writeTransaction(async (trx) => [
        await rename.run(trx, { id: 'w1', name: 'first' }),
        await rename.run(trx, { id: 'w2', name: 'second' }),
        await rename.run(trx, { id: 'missing', name: 'x' }),
      ]);
      expect(renamed.map((r) => Number(r.numAffectedRows))).toEqual([1, 1, 0]);
      expect(await byIds.execute(store.db, { company: 'c', ids: ['w1', 'w2'] }, 2)).toEqual([
        { id: 'w1', name: 'first' },
        { id: 'w2', name: 'second' },
      ]);
    });

    it('refuse a missing parameter, a list given as a value, and a list of another length than the shape', async () => {
      const store = await fx.freshStore();
      await expect(byIds.execute(store.db, { company: 'c' } as never, 1)).rejects.toThrow(
        'parameter "ids" was not given',
      );
      await expect(rename.run(store.db, { id: ['a'] as never, name: 'x' })).rejects.toThrow('"id" is a list');
      await expect(byIds.execute(store.db, { company: 'c', ids: ['a', 'b'] }, 3)).rejects.toThrow(
        'must be a list of 3',
      );
    });

    it('report every statement to onQuery exactly once, inside and outside transactions', async () => {
      const seed = await fx.freshStore();
      const logged: string[] = [];
      const store = await fx.open(seed.location.url, { onQuery: (q) => logged.push(q.sql) });
      await store.db
        .selectFrom('companies')
        .select(sql<number>`4201`.as('outside'))
        .execute();
      await store.dialect.writeTransaction(async (trx) => {
        await trx
          .selectFrom('companies')
          .select(sql<number>`4202`.as('built'))
          .execute();
        await byIds.execute(trx, { company: 'c', ids: ['marker-4203'] }, 1);
      });
      await store.close();
      const count = (marker: string) => logged.filter((q) => q.includes(marker)).length;
      expect([count('4201'), count('4202'), count('"workspaces"')]).toEqual([1, 1, 1]);
    });
  });
}
