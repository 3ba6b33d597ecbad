/**
 * Counting semaphores (issue 21) on one dialect: the lease protocol on one process with a clock
 * the tests move, then `contenders` processes racing one semaphore (never more than `limit`
 * slots in use, abandoned slots reclaimed after expiry) and the wake-up of a waiter on release.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from 'kysely';
import { LeaseLostError, SemaphoreTimeoutError, type Clock, type Store } from '../../src/index.js';
import type { DialectFixture } from '../support/fixtures.js';
import { Contenders, SOAK_ROUNDS, SOAK_TIMEOUT } from '../support/race.js';
import { tbl } from '../support/schema.js';
import { ops as OPS } from './semaphores.ops.js';

class ManualClock implements Clock {
  constructor(public t = 5_000_000) {}
  now(): number {
    return this.t;
  }
}

export function defineSemaphoreSuite(makeFixture: () => DialectFixture, contenderCount: number) {
  let fx: DialectFixture;
  let store: Store;
  let clock: ManualClock;
  beforeAll(async () => {
    fx = makeFixture();
    clock = new ManualClock();
    store = await fx.freshStore({ clock });
  });
  afterAll(() => fx.cleanup());

  let n = 0;
  const fresh = () => `sem-${++n}`;

  describe('the lease protocol on a semaphore', () => {
    it('grants up to limit slots with rising tokens, then reports busy with the holders', async () => {
      const name = fresh();
      const grants = [];
      for (const holder of ['a', 'b', 'c']) {
        const r = await store.semaphores.acquire(name, { holder, limit: 3, ttlMs: 1000 + grants.length });
        if (r.status !== 'acquired') throw new Error('expected a grant');
        grants.push(r.lease);
      }
      expect(grants.map((l) => l.token)).toEqual([1, 2, 3]);
      expect(grants[0]).toEqual({
        kind: 'semaphore',
        resource: name,
        holder: 'a',
        token: 1,
        expiresAt: clock.t + 1000,
        limit: 3,
      });
      const busy = await store.semaphores.acquire(name, { holder: 'd', limit: 3, ttlMs: 1000 });
      expect(busy).toEqual({
        status: 'busy',
        heldBy: {
          holder: 'a',
          expiresAt: clock.t + 1000,
          limit: 3,
          count: 3,
          holders: [
            { holder: 'a', token: 1, expiresAt: clock.t + 1000 },
            { holder: 'b', token: 2, expiresAt: clock.t + 1001 },
            { holder: 'c', token: 3, expiresAt: clock.t + 1002 },
          ],
        },
      });
      await store.semaphores.release(grants[1]!);
      const next = await store.semaphores.acquire(name, { holder: 'd', limit: 3, ttlMs: 1000 });
      expect(next).toMatchObject({ status: 'acquired', lease: { holder: 'd', token: 4 } });
      expect((await store.semaphores.listHolders(name)).map((h) => h.holder)).toEqual(['a', 'd', 'c']);
    });

    it('a repeat release is a no-op; a never-granted token throws; a released or expired slot cannot be renewed', async () => {
      const name = fresh();
      const r = await store.semaphores.acquire(name, { holder: 'a', limit: 1, ttlMs: 1000 });
      if (r.status !== 'acquired') throw new Error('expected a grant');
      clock.t += 500;
      const renewed = await store.semaphores.renew(r.lease, { ttlMs: 1000 });
      expect(renewed).toEqual({ ...r.lease, expiresAt: clock.t + 1000 });
      await store.semaphores.release(renewed);
      await store.semaphores.release(renewed);
      await expect(store.semaphores.renew(renewed, { ttlMs: 1000 })).rejects.toMatchObject({
        code: 'SEMAPHORE_LEASE_LOST',
        reason: 'released',
      });
      await expect(store.semaphores.release({ ...renewed, token: 99 })).rejects.toMatchObject({
        code: 'SEMAPHORE_LEASE_LOST',
        kind: 'semaphore',
        reason: 'never_granted',
      });
      const again = await store.semaphores.acquire(name, { holder: 'b', limit: 1, ttlMs: 1000 });
      if (again.status !== 'acquired') throw new Error('expected a grant');
      clock.t += 1000;
      const error = await store.semaphores.renew(again.lease, { ttlMs: 1000 }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(LeaseLostError);
      expect(error).toMatchObject({ reason: 'expired' });
    });

    it('reclaims an expired slot for the next caller (the crashed holder never released)', async () => {
      const name = fresh();
      const crashed = await store.semaphores.acquire(name, { holder: 'crashed', limit: 1, ttlMs: 1000 });
      expect(crashed.status).toBe('acquired');
      clock.t += 999;
      expect(await store.semaphores.acquire(name, { holder: 'next', limit: 1, ttlMs: 1000 })).toMatchObject({
        status: 'busy',
      });
      clock.t += 1;
      expect(await store.semaphores.acquire(name, { holder: 'next', limit: 1, ttlMs: 1000 })).toMatchObject({
        status: 'acquired',
        lease: { token: 2 },
      });
      // Its slot was reclaimed and the name granted after it lapsed: superseded (the release rule).
      if (crashed.status === 'acquired')
        await expect(store.semaphores.release(crashed.lease)).rejects.toMatchObject({
          code: 'SEMAPHORE_LEASE_LOST',
          reason: 'superseded',
        });
      expect((await store.semaphores.listHolders(name)).map((h) => h.holder)).toEqual(['next']);
    });

    it('acquireWait gives up with the timeout shape every blocking wait shares, naming the holders', async () => {
      const name = fresh();
      await store.semaphores.acquire(name, { holder: 'a', limit: 1, ttlMs: 60_000 });
      const error = await store.semaphores
        .acquireWait(name, { holder: 'w', limit: 1, ttlMs: 1000 }, { timeoutMs: 50, maxPollMs: 10 })
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(SemaphoreTimeoutError);
      expect(error).toMatchObject({
        code: 'SEMAPHORE_TIMEOUT',
        kind: 'semaphore',
        resource: name,
        holder: 'w',
        timeoutMs: 50,
        blockers: [{ holder: 'a', token: 1 }],
      });
    });

    it('validates before any statement', async () => {
      await expect(store.semaphores.acquire('', { holder: 'a', limit: 1 })).rejects.toMatchObject({
        code: 'INVALID_ARGUMENT',
      });
      await expect(store.semaphores.acquire('x', { holder: 'a', limit: 0 })).rejects.toMatchObject({
        code: 'INVALID_ARGUMENT',
      });
      await expect(store.semaphores.acquire('x', { holder: 'a', limit: 1, ttlMs: -1 })).rejects.toMatchObject({
        code: 'INVALID_ARGUMENT',
      });
      await expect(
        store.semaphores.release({ kind: 'task_lease', resource: 'x', holder: 'a', token: 1, expiresAt: 0 } as never),
      ).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
      expect(await store.db.selectFrom('semaphores').selectAll().where('name', '=', 'x').execute()).toEqual([]);
    });

    it('works inside a host transaction as tx.semaphores, rolled back with it', async () => {
      const name = fresh();
      await expect(
        store.transaction(async (tx) => {
          const r = await tx.semaphores.acquire(name, { holder: 'a', limit: 1, ttlMs: 1000 });
          expect(r.status).toBe('acquired');
          throw new Error('host rollback');
        }),
      ).rejects.toThrow('host rollback');
      expect(await store.semaphores.listHolders(name)).toEqual([]);
    });
  });

  describe(`${contenderCount} processes racing one semaphore`, () => {
    let contenders: Contenders<typeof OPS>;
    let url: string;
    let raceStore: Store;
    beforeAll(async () => {
      url = await fx.freshUrl();
      raceStore = await fx.open(url);
      await raceStore.migrate();
      await sql`create table ${tbl(raceStore.db, 'sem_inside')} (name text not null, token bigint not null, holder text not null, primary key (name, token))`.execute(
        raceStore.db,
      );
      contenders = await Contenders.start(contenderCount, { url, ops: OPS, storeOptions: { poolSize: 2 } });
    }, 600_000);
    afterAll(() => contenders?.close(), 120_000);

    it(
      'never lets more than limit holders in at once; abandoned slots are reclaimed after expiry',
      async () => {
        const limit = 3;
        const outcomes = await contenders.race('useSlots', (i) => ({
          name: 'race',
          limit,
          rounds: SOAK_ROUNDS ?? 12,
          abandon: i < limit,
          holdMs: 3,
        }));
        const values = outcomes.map((o) => {
          if (!o.ok) throw new Error(`contender ${o.index}: ${o.error.message}`);
          return o.value;
        });
        const maxSeen = Math.max(...values.map((v) => v.maxSeen));
        expect(maxSeen).toBeLessThanOrEqual(limit);
        // And the race was one: slots were used side by side, and the semaphore turned callers away.
        expect(maxSeen, 'most slots seen in use at once').toBeGreaterThanOrEqual(2);
        expect(
          values.reduce((sum, v) => sum + v.busy, 0),
          'busy answers',
        ).toBeGreaterThan(0);
        // Every abandoned slot was reclaimed: the others got in after them.
        expect(values.filter((_, i) => i >= limit).every((v) => v.acquired > 0)).toBe(true);
        const tokens = await raceStore.db
          .selectFrom('semaphores')
          .select('token')
          .where('name', '=', 'race')
          .executeTakeFirstOrThrow();
        expect(Number(tokens.token)).toBe(values.reduce((sum, v) => sum + v.acquired, 0));
        expect((await raceStore.semaphores.listHolders('race')).length).toBeLessThanOrEqual(limit);
        if (SOAK_ROUNDS) {
          const acquired = values.reduce((sum, v) => sum + v.acquired, 0);
          console.log(`[lease soak: semaphore] ${acquired} grants, max ${maxSeen} of ${limit} at once`);
        }
      },
      SOAK_TIMEOUT ?? 300_000,
    );

    it('a release wakes a waiter at once (its fallback poll is ten minutes)', async () => {
      const held = await raceStore.semaphores.acquire('wake', { holder: 'holder', limit: 1, ttlMs: 600_000 });
      if (held.status !== 'acquired') throw new Error('expected a grant');
      const waiting = contenders.start(0, 'waitForSlot', { name: 'wake', limit: 1 });
      await contenders.waitForSignal(0, 'waiting:wake');
      // Let the waiter find the semaphore full and go to sleep on the wake-up.
      await new Promise((resolve) => setTimeout(resolve, 300));
      await raceStore.semaphores.release(held.lease);
      const outcome = await waiting;
      if (!outcome.ok) throw new Error(outcome.error.message);
      expect(outcome.value).toBe(held.lease.token + 1);
    }, 120_000);
  });
}
