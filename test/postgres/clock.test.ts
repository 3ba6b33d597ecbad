import { afterAll, describe, expect, it } from 'vitest';
import type { Store } from '../../src/index.js';
import { postgresFixture } from '../support/dialects.js';

/*
 * Time is the database's (SPEC §8): on PostgreSQL leases, TTLs and heartbeats are judged on the
 * server's clock, so hosts whose clocks disagree by minutes still never grant one lease twice.
 */

const fx = postgresFixture();
afterAll(() => fx.cleanup());

const SKEW_MS = 5 * 60_000;

describe('the database clock', () => {
  it('two stores whose host clocks disagree by ten minutes never hold one workspace lock at once', async () => {
    const url = await fx.freshUrl();
    const setup = await fx.open(url);
    await setup.migrate();
    const company = await setup.org.createCompany({ name: 'Clocks' });
    const ws = await setup.org.createWorkspace({ companyId: company.id, name: 'shared' });
    const run = await setup.runs.startCoordinatorRun({ targetKey: null });
    const behind = await fx.open(url, { hostClock: { now: () => Date.now() - SKEW_MS }, poolSize: 4 });
    const ahead = await fx.open(url, { hostClock: { now: () => Date.now() + SKEW_MS }, poolSize: 4 });
    // Both see (nearly) the server's time, not their own.
    expect(Math.abs(behind.dialect.clock.now() - ahead.dialect.clock.now())).toBeLessThan(2_000);

    const held: { who: string; from: number; to: number }[] = [];
    const staleReleases: string[] = [];
    const until = Date.now() + 3_000;
    const worker = async (store: Store, who: string) => {
      while (Date.now() < until) {
        const claim = await store.locks.claimWorkspaceLock(ws.id, { holder: who, runId: run.id, ttlMs: 1_000 });
        if (claim.status !== 'acquired') {
          await new Promise((resolve) => setTimeout(resolve, Math.random() * 5));
          continue;
        }
        const from = performance.now();
        await new Promise((resolve) => setTimeout(resolve, 15));
        const to = performance.now();
        held.push({ who, from, to });
        await store.locks
          .releaseWorkspaceLock(ws.id, { token: claim.lease.token })
          .catch((e: { code?: string }) => staleReleases.push(`${who}: ${e.code}`));
      }
    };
    await Promise.all([0, 1, 2, 3].flatMap((i) => [worker(behind, `behind-${i}`), worker(ahead, `ahead-${i}`)]));

    expect(staleReleases).toEqual([]);
    held.sort((a, b) => a.from - b.from);
    for (let i = 1; i < held.length; i++) {
      // Each observed holding interval ends before the next one starts.
      expect(held[i]!.from, `${held[i - 1]!.who} and ${held[i]!.who} held the lock at once`).toBeGreaterThanOrEqual(
        held[i - 1]!.to,
      );
    }
    expect(new Set(held.map((h) => h.who.split('-')[0]))).toEqual(new Set(['behind', 'ahead']));
  });

  it("a BEGIN that waited for a lock does not move the store's clock (the round trip's midpoint would be off by half the wait)", async () => {
    const url = await fx.freshUrl();
    const holder = await fx.open(url);
    await holder.migrate();
    const company = await holder.org.createCompany({ name: 'Waits' });
    const ws = await holder.org.createWorkspace({ companyId: company.id, name: 'w' });
    const waiter = await fx.open(url);
    // The server runs on this host: its clock and the host's agree, so the store's should too.
    expect(Math.abs(waiter.dialect.clock.now() - Date.now())).toBeLessThan(250);
    let held!: () => void;
    const holding = new Promise<void>((resolve) => (held = resolve));
    const hold = holder.transaction(async (tx) => {
      await tx.paths.tryAcquirePaths({ workspaceId: ws.id, holder: 'first', paths: ['src'], ttlMs: 60_000 });
      held();
      await new Promise((resolve) => setTimeout(resolve, 2_000));
    });
    await holding;
    const started = Date.now();
    // Takes the workspace's key in BEGIN's round trip: it waits there until the holder commits.
    const claim = await waiter.paths.tryAcquirePaths({
      workspaceId: ws.id,
      holder: 'second',
      paths: ['src'],
      ttlMs: 60_000,
    });
    await hold;
    expect(Date.now() - started).toBeGreaterThan(1_000);
    expect(claim.status).toBe('busy');
    expect(Math.abs(waiter.dialect.clock.now() - Date.now())).toBeLessThan(250);
  });

  it('an explicit clock still overrides the database clock (for tests)', async () => {
    const store = await fx.freshStore({ clock: { now: () => 1_000 } });
    const company = await store.org.createCompany({ name: 'Frozen' });
    expect(company.createdAt).toBe(1_000);
  });
});
