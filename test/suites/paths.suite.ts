import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CompiledQuery, sql, type Insertable } from 'kysely';
import {
  InvalidArgumentError,
  InvalidWritePathError,
  NotFoundError,
  PathClaimRefusedError,
  PathLeaseLostError,
  PathLeaseTimeoutError,
  LeaseWaitTimeoutError,
  type Store,
} from '../../src/index.js';
import { buildPathConflictQuery } from '../../src/repositories/paths/statements.js';
import type { PathLeasesTable } from '../../src/schema/database.js';
import type { DialectFixture } from '../support/fixtures.js';
import { Contenders, ContenderExitedError, SOAK_ROUNDS, SOAK_TIMEOUT, type Outcome } from '../support/race.js';
import type { RaceEvent } from './paths.ops.js';
import { ops as OPS } from './paths.ops.js';

const LONG_TTL = 600_000;

// ---------------------------------------------------------------------------------------------
// History checker (Jepsen-style, for the randomized race)
// ---------------------------------------------------------------------------------------------

/** One granted lease set and the interval it was certainly held: grant returned → release issued. */
export interface Hold {
  readonly holder: string;
  readonly keys: readonly string[];
  readonly start: bigint;
  readonly end: bigint;
  /** The grant's fencing token, when the history recorded it. */
  readonly token?: number;
}

/** Independent of the code under test: whole-segment prefix containment, `""` = everything. */
function segmentsOverlap(a: string, b: string): boolean {
  const sa = a === '' ? [] : a.split('/');
  const sb = b === '' ? [] : b.split('/');
  for (let i = 0; i < Math.min(sa.length, sb.length); i++) if (sa[i] !== sb[i]) return false;
  return true;
}

function setsOverlap(a: readonly string[], b: readonly string[]): boolean {
  return a.some((x) => b.some((y) => segmentsOverlap(x, y)));
}

export interface HistoryReport {
  /** Pairs of overlapping sets held by different holders at the same time: must be empty. */
  readonly violations: [Hold, Hold][];
  /** Pairs of disjoint sets held by different holders at the same time. */
  readonly parallelDisjoint: number;
  /** Conflicts naming a (holder, key) that holder was never granted, or not overlapping the request. */
  readonly bogusConflicts: RaceEvent[];
  readonly grants: number;
  readonly refusals: number;
  /**
   * Fencing-token faults among holds that recorded a token: a token granted twice, or two holds of
   * overlapping sets, one ended before the other began, where the later one's token is not higher.
   */
  readonly tokenViolations: string[];
}

/**
 * Checks a race history. Two holds overlap in time when each began before the other ended
 * (strictly; equal stamps are not an overlap). Sweep over holds sorted by start.
 */
export function checkHistory(events: readonly RaceEvent[]): HistoryReport {
  const holds: Hold[] = events
    .filter((e): e is Extract<RaceEvent, { type: 'grant' }> => e.type === 'grant')
    .map((e) => ({
      holder: e.holder,
      keys: e.keys,
      start: BigInt(e.grantNs),
      end: BigInt(e.releaseNs),
      ...(e.token === undefined ? {} : { token: e.token }),
    }))
    .sort((a, b) => (a.start < b.start ? -1 : a.start > b.start ? 1 : 0));
  const violations: [Hold, Hold][] = [];
  let parallelDisjoint = 0;
  for (let i = 0; i < holds.length; i++) {
    const a = holds[i]!;
    for (let j = i + 1; j < holds.length && holds[j]!.start < a.end; j++) {
      const b = holds[j]!;
      if (a.holder === b.holder || setsOverlap(a.keys, b.keys)) violations.push([a, b]);
      else parallelDisjoint++;
    }
  }
  const granted = new Set(holds.flatMap((h) => h.keys.map((k) => `${h.holder}\u0000${k}`)));
  const bogusConflicts = events.filter((e) => {
    if (e.type === 'grant') return false;
    const requested = e.keys.map((p) => (p === '.' ? '' : p));
    const named = e.type === 'conflict' ? e.conflicts : e.blockers;
    return (
      named.length === 0 ||
      named.some(
        (c) => c.holder === e.holder || !granted.has(`${c.holder}\u0000${c.key}`) || !setsOverlap([c.key], requested),
      )
    );
  });
  return {
    violations,
    parallelDisjoint,
    bogusConflicts,
    grants: holds.length,
    refusals: events.length - holds.length,
    tokenViolations: checkTokens(holds),
  };
}

/** See `HistoryReport.tokenViolations`. Quadratic in the conflicting pairs only. */
function checkTokens(holds: readonly Hold[]): string[] {
  const tokened = holds.filter((h) => h.token !== undefined);
  const faults: string[] = [];
  const seen = new Map<number, Hold>();
  for (const h of tokened) {
    const twin = seen.get(h.token!);
    if (twin) faults.push(`token ${h.token} granted to ${twin.holder} and ${h.holder}`);
    seen.set(h.token!, h);
  }
  for (let i = 0; i < tokened.length; i++) {
    const a = tokened[i]!;
    for (let j = i + 1; j < tokened.length; j++) {
      const b = tokened[j]!;
      if (a.end <= b.start && setsOverlap(a.keys, b.keys) && b.token! <= a.token!) {
        faults.push(`${b.holder}'s token ${b.token} after ${a.holder}'s ${a.token} on overlapping keys`);
      }
    }
  }
  return faults;
}

function ok<T>(outcome: Outcome<T>): T {
  if (!outcome.ok)
    throw new Error(`contender ${outcome.index} failed: ${outcome.error.name}: ${outcome.error.message}`);
  return outcome.value;
}

// ---------------------------------------------------------------------------------------------

export function definePathLeaseSuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  let url: string;
  let store: Store;
  let companyId: string;
  let wsCounter = 0;

  // One database for the whole file (every test works in workspaces of its own): migrating is slow on a busy machine.
  beforeAll(async () => {
    fx = makeFixture();
    url = await fx.freshUrl();
    store = await fx.open(url);
    await store.migrate();
    companyId = (await store.org.createCompany({ name: 'acme' })).id;
  });
  afterAll(() => fx.cleanup());

  /** Lease rows written directly (a grown workspace, not what is measured), 500 a statement, then ANALYZE. */
  async function insertLeasesAndAnalyze(rows: Insertable<PathLeasesTable>[]) {
    for (let i = 0; i < rows.length; i += 500)
      await store.db
        .insertInto('path_leases')
        .values(rows.slice(i, i + 500))
        .execute();
    await sql`analyze`.execute(store.db);
  }

  async function workspace(on: Store = store, company = companyId): Promise<string> {
    return (await on.org.createWorkspace({ companyId: company, name: `ws-${++wsCounter}` })).id;
  }

  const req = (workspaceId: string, holder: string, paths: string[], ttlMs = LONG_TTL) => ({
    workspaceId,
    holder,
    paths,
    ttlMs,
  });

  describe('tryAcquirePaths', () => {
    it('grants free paths and reports the holder and key that block an overlapping request', async () => {
      const ws = await workspace();
      const a = await store.paths.tryAcquirePaths(req(ws, 'h1', ['src/lib', 'docs/readme.md']));
      expect(a.acquired).toBe(true);
      if (!a.acquired) return;
      expect(a.leases.map((l) => l.key)).toEqual(['docs/readme.md', 'src/lib']);
      expect(a.leases.every((l) => l.holder === 'h1' && l.workspaceId === ws && l.taskId === null)).toBe(true);

      // descendant, ancestor, same key, whole workspace
      for (const [paths, key] of [
        [['src/lib/a.ts'], 'src/lib'],
        [['src'], 'src/lib'],
        [['docs/readme.md'], 'docs/readme.md'],
        [['.'], 'docs/readme.md'],
        [['*.md'], 'docs/readme.md'],
      ] as const) {
        const r = await store.paths.tryAcquirePaths(req(ws, 'h2', [...paths]));
        expect(r, JSON.stringify(paths)).toMatchObject({ acquired: false });
        if (r.acquired) continue;
        expect(
          r.conflicts.some((c) => c.key === key && c.holder === 'h1'),
          JSON.stringify(r.conflicts),
        ).toBe(true);
      }
      // prefix-named siblings and other paths are free
      const b = await store.paths.tryAcquirePaths(req(ws, 'h2', ['src/libx', 'sr', 'docs/other.md', 'src/lib-b']));
      expect(b.acquired).toBe(true);
    });

    it('is all or nothing: one blocked key means none of the set is leased', async () => {
      const ws = await workspace();
      await store.paths.tryAcquirePaths(req(ws, 'h1', ['b']));
      const r = await store.paths.tryAcquirePaths(req(ws, 'h2', ['a', 'b/x', 'c']));
      const conflict = { key: 'b', holder: 'h1', expiresAt: expect.any(Number), token: expect.any(Number) };
      expect(r).toEqual({
        status: 'busy',
        heldBy: { holder: 'h1', expiresAt: expect.any(Number), conflicts: [conflict] },
        acquired: false,
        conflicts: [conflict],
      });
      expect(await store.paths.listPathLeases({ workspaceId: ws, holder: 'h2' })).toEqual([]);
      expect((await store.paths.tryAcquirePaths(req(ws, 'h3', ['a', 'c']))).acquired).toBe(true);
    });

    it('grants each acquisition its own rising token; the same holder name does not share a grant', async () => {
      const ws = await workspace();
      const first = await store.paths.tryAcquirePaths(req(ws, 'h1', ['src'], 1_000));
      expect(first).toMatchObject({
        status: 'acquired',
        lease: { kind: 'path_lease', resource: ws, workspaceId: ws, holder: 'h1', keys: ['src'], taskId: null },
      });
      if (first.status !== 'acquired') return;
      expect(first.leases.map((l) => l.token)).toEqual([first.lease.token]);
      // A second process using the same holder name is blocked like anyone else.
      const twin = await store.paths.tryAcquirePaths(req(ws, 'h1', ['src/a.ts'], 90_000));
      expect(twin).toMatchObject({
        status: 'busy',
        heldBy: { holder: 'h1', conflicts: [{ key: 'src', token: first.lease.token }] },
      });
      const other = await store.paths.tryAcquirePaths(req(ws, 'h1', ['docs']));
      if (other.status !== 'acquired') throw new Error('docs should be free');
      expect(other.lease.token).toBeGreaterThan(first.lease.token);
      // Renew and release act on one grant only, whatever the holder name.
      const renewed = await store.paths.renewPaths(first.lease, { ttlMs: 90_000 });
      expect(renewed).toMatchObject({ token: first.lease.token, keys: ['src'] });
      expect((await store.paths.listPathLeases({ workspaceId: ws })).map((l) => [l.key, l.expiresAt])).toEqual([
        ['docs', other.lease.expiresAt],
        ['src', renewed.expiresAt],
      ]);
      expect(await store.paths.releasePaths(other.lease)).toEqual({ released: ['docs'] });
      expect(await store.paths.releasePaths(other.lease)).toEqual({ released: [] }); // a repeat is a no-op
      expect((await store.paths.listPathLeases({ workspaceId: ws })).map((l) => l.key)).toEqual(['src']);
      await expect(store.paths.renewPaths(other.lease)).rejects.toMatchObject({
        code: 'PATH_LEASE_LOST',
        kind: 'path_lease',
        reason: 'released',
      });
      const forged = { ...first.lease, token: other.lease.token + 100 };
      await expect(store.paths.releasePaths(forged)).rejects.toMatchObject({ reason: 'never_granted' });
      await expect(store.paths.renewPaths(forged)).rejects.toBeInstanceOf(PathLeaseLostError);
      await expect(store.paths.renewPaths({ ...first.lease, holder: 'h2' })).rejects.toBeInstanceOf(PathLeaseLostError);
      expect((await store.paths.tryAcquirePaths(req(ws, 'h2', ['src/b']))).acquired).toBe(false);
    });

    it('reports an unknown workspace as NotFoundError', async () => {
      await expect(store.paths.tryAcquirePaths(req('no-such-workspace', 'h1', ['a']))).rejects.toBeInstanceOf(
        NotFoundError,
      );
    });

    it('scopes leases to their workspace', async () => {
      const ws1 = await workspace();
      const ws2 = await workspace();
      await store.paths.tryAcquirePaths(req(ws1, 'h1', ['.']));
      expect((await store.paths.tryAcquirePaths(req(ws2, 'h2', ['.']))).acquired).toBe(true);
      expect((await store.paths.tryAcquirePaths(req(ws1, 'h2', ['anything']))).acquired).toBe(false);
    });

    it('treats paths with LIKE wildcards and Unicode names literally', async () => {
      const ws = await workspace();
      await store.paths.tryAcquirePaths(req(ws, 'h1', ['100%/a_b', 'données/é.md']));
      expect(
        (await store.paths.tryAcquirePaths(req(ws, 'h2', ['100x/a_b', '100%/aXb', 'donnees', 'données/e.md'])))
          .acquired,
      ).toBe(true);
      expect((await store.paths.tryAcquirePaths(req(ws, 'h2', ['100%']))).acquired).toBe(false);
      expect((await store.paths.tryAcquirePaths(req(ws, 'h2', ['données/e\u0301.md']))).acquired).toBe(false);
    });

    it('rejects bad paths and bad arguments before touching the database', async () => {
      const ws = await workspace();
      for (const bad of ['../x', '/etc', 'a/../../b', 'a\u0000b', '..\\x']) {
        await expect(store.paths.tryAcquirePaths(req(ws, 'h1', ['ok', bad]))).rejects.toBeInstanceOf(
          InvalidWritePathError,
        );
      }
      await expect(store.paths.tryAcquirePaths(req(ws, '', ['a']))).rejects.toBeInstanceOf(InvalidArgumentError);
      await expect(store.paths.tryAcquirePaths(req(ws, 'h1', ['a'], 0))).rejects.toBeInstanceOf(InvalidArgumentError);
      expect(await store.paths.listPathLeases({ workspaceId: ws })).toEqual([]);
    });
  });

  describe('expiry, renewal and release', () => {
    it('never lets an expired lease block, and refuses to renew one', async () => {
      let t = 1_000_000;
      const clocked = await fx.open(url, { clock: { now: () => t } });
      const ws = await workspace(clocked);
      const held = await clocked.paths.tryAcquirePaths(req(ws, 'h1', ['src', 'docs'], 1_000));
      if (held.status !== 'acquired') throw new Error('free paths');
      t += 999;
      expect((await clocked.paths.tryAcquirePaths(req(ws, 'h2', ['src/a']))).acquired).toBe(false);
      const renewed = await clocked.paths.renewPaths({ workspaceId: ws, holder: 'h1', ttlMs: 1_000, paths: ['docs'] });
      expect(renewed.renewed.map((l) => [l.key, l.expiresAt])).toEqual([['docs', t + 1_000]]);
      expect(renewed.lost).toEqual([]);
      t += 1; // src expires now (expires_at = now is expired)
      const taken = await clocked.paths.tryAcquirePaths(req(ws, 'h2', ['src/a'], 1_000));
      expect(taken.acquired).toBe(true);
      expect((await clocked.paths.tryAcquirePaths(req(ws, 'h2', ['docs/x']))).acquired).toBe(false);
      await expect(clocked.paths.renewPaths(held.lease)).rejects.toMatchObject({ reason: 'expired' });
      const late = await clocked.paths.renewPaths({
        workspaceId: ws,
        holder: 'h1',
        ttlMs: 1_000,
        paths: ['src', 'docs'],
      });
      expect(late.lost).toEqual(['src']);
      expect(late.renewed.map((l) => l.key)).toEqual(['docs']);
      t += 10_000;
      expect((await clocked.paths.tryAcquirePaths(req(ws, 'h3', ['.']))).acquired).toBe(true);
      expect(await clocked.paths.pruneExpiredPaths(ws)).toBe(3);
      expect((await clocked.paths.listPathLeases({ workspaceId: ws })).map((l) => [l.key, l.holder])).toEqual([
        ['', 'h3'],
      ]);
    });

    it('releases the given paths and what lies below them, or everything the holder has', async () => {
      const ws = await workspace();
      await store.paths.tryAcquirePaths(req(ws, 'h1', ['src/a', 'src/b/c', 'srcx', 'docs']));
      await store.paths.tryAcquirePaths(req(ws, 'h2', ['lib']));
      expect(await store.paths.releasePaths({ workspaceId: ws, holder: 'h1', paths: ['src'] })).toEqual({
        released: ['src/a', 'src/b/c'],
      });
      expect((await store.paths.tryAcquirePaths(req(ws, 'h3', ['src']))).acquired).toBe(true);
      expect(await store.paths.releasePaths({ workspaceId: ws, holder: 'h1', paths: ['nothing/here'] })).toEqual({
        released: [],
      });
      expect(await store.paths.releasePaths({ workspaceId: ws, holder: 'h1' })).toEqual({ released: ['docs', 'srcx'] });
      expect((await store.paths.listPathLeases({ workspaceId: ws })).map((l) => l.holder).sort()).toEqual(['h2', 'h3']);
    });
  });

  describe('claimTask and submitTaskResult', () => {
    async function task(workspaceId: string | null, writes: string[] | null | undefined) {
      return store.tasks.createTask({
        companyId,
        title: 't',
        requiresFilesystem: true,
        workspaceId,
        status: 'ready',
        writes,
      });
    }

    it('leases the whole workspace for a task whose write set is omitted, which conflicts with every lease there', async () => {
      const ws = await workspace();
      const legacy = await task(ws, undefined);
      const other = await task(ws, ['src/a.ts']);
      const claim = await store.paths.claimTask(legacy.id, 'h1');
      expect(claim).toMatchObject({ claimed: true, mode: 'whole-workspace' });
      if (claim.claimed) expect(claim.leases.map((l) => [l.key, l.taskId])).toEqual([['', legacy.id]]);
      expect((await store.tasks.requireTask(legacy.id)).status).toBe('in_progress');
      expect(await store.paths.claimTask(other.id, 'h2')).toMatchObject({
        status: 'busy',
        claimed: false,
        mode: 'paths',
        heldBy: { holder: 'h1' },
        conflicts: [{ key: '', holder: 'h1', expiresAt: expect.any(Number) }],
      });
      expect((await store.tasks.requireTask(other.id)).status).toBe('ready');
      expect((await store.paths.tryAcquirePaths(req(ws, 'h3', ['docs']))).acquired).toBe(false);

      // and the other way round: a legacy task cannot claim while any path is leased
      const ws2 = await workspace();
      const pathsTask = await task(ws2, ['lib/x.ts']);
      const legacy2 = await task(ws2, null);
      expect((await store.paths.claimTask(pathsTask.id, 'h1')).claimed).toBe(true);
      expect(await store.paths.claimTask(legacy2.id, 'h2')).toMatchObject({
        claimed: false,
        conflicts: [{ key: 'lib/x.ts', holder: 'h1' }],
      });
    });

    it('a result ends the task’s active dispatch in the same transaction and readies its dependents', async () => {
      const ws = await workspace();
      const targetKey = `worktree:paths-result-${Math.random().toString(16).slice(2)}`;
      await store.runs.startCoordinatorRun({ targetKey });
      const base = {
        companyId,
        title: 't',
        requiresFilesystem: true,
        workspaceId: ws,
        targetKey,
        status: 'ready' as const,
      };
      const t = await store.tasks.createTask({ ...base, writes: ['src/r.ts'] });
      const next = await store.tasks.createTask({ ...base, writes: ['src/s.ts'], dependsOn: [t.id] });
      expect(next.status).toBe('blocked');
      const d = await store.dispatches.createDispatch({ taskId: t.id, terminalHandle: `term-${t.id}` });
      const claim = await store.paths.claimTask(t.id, 'h1');
      if (claim.status !== 'acquired') throw new Error(`claim busy: ${JSON.stringify(claim.heldBy)}`);
      await store.paths.submitTaskResult(t.id, claim.lease, { status: 'done' });
      // Mutant "submit-leaves-dispatch" (no afterTaskFinished in submitTaskResult) fails here.
      expect((await store.dispatches.getDispatch(d.id))?.status).toBe('completed');
      expect((await store.tasks.requireTask(t.id)).status).toBe('done');
      expect((await store.tasks.requireTask(next.id)).status).toBe('ready');
      expect(await store.dispatches.getActiveDispatchForTerminal(d.terminalHandle)).toBeFalsy();
    });

    it('runs tasks with disjoint write sets in parallel and serializes overlapping ones', async () => {
      const ws = await workspace();
      const t1 = await task(ws, ['src/a/**/*.ts']);
      const t2 = await task(ws, ['src/b.ts', 'docs/']);
      const t3 = await task(ws, ['src']);
      expect(await store.paths.claimTask(t1.id, 'h1')).toMatchObject({
        claimed: true,
        mode: 'paths',
        leases: [{ key: 'src/a' }],
      });
      expect(await store.paths.claimTask(t2.id, 'h2')).toMatchObject({
        claimed: true,
        leases: [{ key: 'docs' }, { key: 'src/b.ts' }],
      });
      const blocked = await store.paths.claimTask(t3.id, 'h3');
      expect(blocked.claimed).toBe(false);
      if (!blocked.claimed) expect(blocked.conflicts.map((c) => c.holder).sort()).toEqual(['h1', 'h2']);
      expect(await store.paths.submitTaskResult(t1.id, 'h1', { status: 'done' })).toEqual({
        status: 'done',
        released: ['src/a'],
      });
      expect(await store.paths.submitTaskResult(t2.id, 'h2', { status: 'failed' })).toEqual({
        status: 'failed',
        released: ['docs', 'src/b.ts'],
      });
      expect((await store.tasks.requireTask(t1.id)).status).toBe('done');
      expect((await store.tasks.requireTask(t2.id)).status).toBe('failed');
      expect((await store.paths.claimTask(t3.id, 'h3')).claimed).toBe(true);
    });

    it('leases nothing for a dynamic ([]) task; its holder acquires as it goes and submitting releases those leases too', async () => {
      const ws = await workspace();
      const dynamic = await task(ws, []);
      const claim = await store.paths.claimTask(dynamic.id, 'h1');
      expect(claim).toMatchObject({
        status: 'acquired',
        claimed: true,
        mode: 'dynamic',
        leases: [],
        lease: { keys: [], taskId: dynamic.id },
      });
      expect(await store.paths.listPathLeases({ workspaceId: ws })).toEqual([]);
      const got = await store.paths.acquirePaths(
        { ...req(ws, 'h1', ['lib', 'src/x.ts']), taskId: dynamic.id },
        { timeoutMs: 1_000 },
      );
      expect(got.map((l) => l.key)).toEqual(['lib', 'src/x.ts']);
      expect(got.lease).toMatchObject({ keys: ['lib', 'src/x.ts'], taskId: dynamic.id });
      await store.paths.tryAcquirePaths(req(ws, 'h1', ['unrelated'])); // not tagged with the task
      expect((await store.paths.tryAcquirePaths(req(ws, 'h2', ['lib/y']))).acquired).toBe(false);
      const outcome = await store.paths.submitTaskResult(dynamic.id, 'h1', { status: 'done' });
      expect(outcome).toEqual({ status: 'done', released: ['lib', 'src/x.ts'] });
      expect((await store.paths.listPathLeases({ workspaceId: ws })).map((l) => l.key)).toEqual(['unrelated']);
      expect((await store.paths.tryAcquirePaths(req(ws, 'h2', ['lib/y']))).acquired).toBe(true);
    });

    it('acquirePaths gives up with the timeout shape every blocking wait shares, naming the holders', async () => {
      const ws = await workspace();
      await store.paths.tryAcquirePaths(req(ws, 'sitter', ['docs']));
      const error = await store.paths
        .acquirePaths(req(ws, 'w', ['docs/a.md']), { timeoutMs: 50, maxPollMs: 10 })
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(PathLeaseTimeoutError);
      expect(error).toBeInstanceOf(LeaseWaitTimeoutError);
      expect(error).toMatchObject({
        code: 'PATH_LEASE_TIMEOUT',
        kind: 'path_lease',
        resource: ws,
        holder: 'w',
        timeoutMs: 50,
        blockers: [{ key: 'docs', holder: 'sitter' }],
      });
    });

    it('takes the claim grant as proof: a stale claim of the same holder name is superseded, and the lease is fenced', async () => {
      let t = 5_000_000;
      const clocked = await fx.open(url, { clock: { now: () => t } });
      const ws = await workspace(clocked);
      const job = await task(ws, ['src']);
      const first = await clocked.paths.claimTask(job.id, 'agent', { ttlMs: 1_000 });
      if (first.status !== 'acquired') throw new Error('free workspace');
      expect(first.lease).toMatchObject({ kind: 'path_lease', keys: ['src'], taskId: job.id, holder: 'agent' });
      t += 2_000; // the first process stalls; its lease lapses; a second process of the same name claims again
      const second = await clocked.paths.claimTask(job.id, 'agent', { ttlMs: 1_000 });
      if (second.status !== 'acquired') throw new Error('the lapsed claim must not block');
      expect(second.lease.token).toBeGreaterThan(first.lease.token);
      await expect(clocked.paths.submitTaskResult(job.id, first.lease, { status: 'done' })).rejects.toMatchObject({
        code: 'PATH_LEASE_LOST',
        reason: 'superseded',
      });
      await expect(clocked.transaction((tx) => tx.assertLease(first.lease))).rejects.toBeInstanceOf(PathLeaseLostError);
      await clocked.transaction((tx) => tx.assertLease(second.lease));
      expect((await clocked.tasks.requireTask(job.id)).status).toBe('in_progress');
      expect(await clocked.paths.submitTaskResult(job.id, second.lease, { status: 'done' })).toEqual({
        status: 'done',
        released: ['src'],
      });
      // A dynamic claim leases no keys; its grant is live while it is the task's current claim.
      const dynamic = await task(ws, []);
      const claim = await clocked.paths.claimTask(dynamic.id, 'agent');
      if (claim.status !== 'acquired') throw new Error('dynamic claims lease nothing');
      await clocked.transaction((tx) => tx.assertLease(claim.lease));
      expect(await clocked.paths.renewPaths(claim.lease, { ttlMs: 5 })).toMatchObject({ expiresAt: t + 5 });
      await expect(
        clocked.paths.submitTaskResult(dynamic.id, { ...claim.lease, token: 999_999 }, { status: 'done' }),
      ).rejects.toMatchObject({ reason: 'never_granted' });
      await expect(
        clocked.paths.submitTaskResult(dynamic.id, { kind: 'path_lease' } as never, { status: 'done' }),
      ).rejects.toBeInstanceOf(InvalidArgumentError);
    });

    it('one exclusion rule: the workspace lock blocks tryAcquirePaths and claimTask, and path leases block the lock and dispatchRun', async () => {
      const ws = await workspace();
      const lock = await store.locks.claimWorkspaceLock(ws, { holder: 'run-1', runId: 'run-1' });
      if (lock.status !== 'acquired') throw new Error('free workspace');
      const blockedPaths = await store.paths.tryAcquirePaths(req(ws, 'h1', ['src/a.ts']));
      expect(blockedPaths).toMatchObject({
        status: 'busy',
        heldBy: {
          holder: 'run-1',
          conflicts: [{ key: '', holder: 'run-1', kind: 'workspace_lock', token: lock.lease.token }],
        },
      });
      const job = await task(ws, ['docs']);
      expect(await store.paths.claimTask(job.id, 'h1')).toMatchObject({ status: 'busy', heldBy: { holder: 'run-1' } });
      expect((await store.tasks.requireTask(job.id)).status).toBe('ready');
      await store.locks.releaseWorkspaceLock(lock.lease);

      const claim = await store.paths.claimTask(job.id, 'h1');
      if (claim.status !== 'acquired') throw new Error('the lock was released');
      expect(await store.locks.claimWorkspaceLock(ws, { holder: 'run-2', runId: 'run-2' })).toMatchObject({
        status: 'busy',
        heldBy: { holder: 'h1', runId: null, pathKey: 'docs', token: claim.lease.token },
      });
      const agent = await store.org.createAgent({ companyId, name: 'dev', role: 'engineer', workspaceId: ws });
      const coding = await store.tasks.createTask({
        companyId,
        title: 'whole-workspace run',
        assigneeAgentId: agent.id,
        requiresFilesystem: true,
        status: 'ready',
      });
      const dispatch = await store.scheduler.dispatchRun({
        taskId: coding.id,
        agentId: agent.id,
        runId: 'run-3',
        mode: 'heartbeat',
      });
      expect(dispatch).toMatchObject({ outcome: 'cancelled', reason: 'workspace_busy', heldBy: { pathKey: 'docs' } });
      expect(await store.locks.getTaskLease(coding.id)).toBeNull(); // given back
      await store.paths.submitTaskResult(job.id, claim.lease, { status: 'done' });
      const retry = await store.scheduler.dispatchRun({
        taskId: coding.id,
        agentId: agent.id,
        runId: 'run-4',
        mode: 'heartbeat',
      });
      expect(retry).toMatchObject({ outcome: 'dispatched', lockMode: 'exclusive' });
    });

    it('refuses a submission from another holder, a finished task, a task without workspace, and bad stored paths', async () => {
      const ws = await workspace();
      const t = await task(ws, ['a']);
      await store.paths.claimTask(t.id, 'h1');
      await expect(store.paths.submitTaskResult(t.id, 'h2', { status: 'done' })).rejects.toMatchObject({
        code: 'PATH_CLAIM_REFUSED',
        reason: 'held_by_other_holder',
        holder: 'h2',
      });
      expect((await store.paths.listPathLeases({ workspaceId: ws })).length).toBe(1);
      await store.paths.submitTaskResult(t.id, 'h1', { status: 'done' });
      await expect(store.paths.claimTask(t.id, 'h1')).rejects.toMatchObject({ reason: 'task_finished' });
      await expect(store.paths.submitTaskResult(t.id, 'h1', { status: 'done' })).rejects.toBeInstanceOf(
        PathClaimRefusedError,
      );

      const homeless = await task(null, ['a']);
      await expect(store.paths.claimTask(homeless.id, 'h1')).rejects.toMatchObject({ reason: 'task_has_no_workspace' });
      await expect(store.paths.claimTask('no-such-task', 'h1')).rejects.toBeInstanceOf(NotFoundError);

      // createTask refuses a bad path outright; a row written by older code can still hold one, and claimTask refuses it too.
      await expect(task(ws, ['ok', '../outside'])).rejects.toMatchObject({
        code: 'INVALID_WRITE_PATH',
        path: '../outside',
      });
      const escaping = await task(ws, ['ok']);
      await store.db
        .updateTable('tasks')
        .set({ writes: JSON.stringify(['ok', '../outside']) })
        .where('id', '=', escaping.id)
        .execute();
      await expect(store.paths.claimTask(escaping.id, 'h1')).rejects.toMatchObject({
        code: 'INVALID_WRITE_PATH',
        path: '../outside',
      });
      expect((await store.tasks.requireTask(escaping.id)).status).toBe('ready');
      expect(await store.paths.listPathLeases({ workspaceId: ws })).toEqual([]);
    });
  });

  describe('the conflict query', () => {
    it('looks leases up through the primary-key index (workspace_id, lease_key), never by scanning', async () => {
      const busy = await workspace();
      const quiet = await workspace();
      const rows = [];
      for (let i = 0; i < 4_000; i++) {
        rows.push({
          workspace_id: busy,
          lease_key: `/dir${i % 100}/file${i}.ts/`,
          holder: `other${i % 7}`,
          task_id: null,
          acquired_at: 0,
          expires_at: 9e12,
        });
      }
      for (let i = 0; i < 10; i++) {
        rows.push({
          workspace_id: quiet,
          lease_key: `/q${i}/`,
          holder: 'other',
          task_id: null,
          acquired_at: 0,
          expires_at: 9e12,
        });
      }
      await insertLeasesAndAnalyze(rows);
      const now = Date.now();
      // Ancestors by equality plus one range per key, in the busy workspace; and the whole-workspace
      // range in a quiet one. (For the whole-workspace key in a workspace that holds most of the
      // table, PostgreSQL may prefer a sequential scan that LIMIT stops after a few rows.)
      const keyed = buildPathConflictQuery(busy, 'me', ['dir3/file3.ts', 'src/new/a.ts'], now, store.db);
      const whole = buildPathConflictQuery(quiet, 'me', [''], now, store.db);
      if (fx.kind === 'sqlite') {
        for (const q of [keyed, whole]) {
          const plan = (await sql<{ detail: string }>`explain query plan ${q}`.execute(store.db)).rows.map(
            (r) => r.detail,
          );
          const touches = plan.filter((d) => d.includes('path_leases'));
          expect(touches.length, plan.join('\n')).toBeGreaterThan(0);
          for (const d of touches)
            expect(d, plan.join('\n')).toMatch(
              /^SEARCH path_leases USING (COVERING )?INDEX sqlite_autoindex_path_leases_1 \(workspace_id=\? AND lease_key/,
            );
        }
      } else {
        const explain = async (q: typeof keyed) =>
          (await sql<{ 'QUERY PLAN': string }>`explain ${q}`.execute(store.db)).rows
            .map((r) => r['QUERY PLAN'])
            .join('\n');
        const keyedPlan = await explain(keyed);
        expect(keyedPlan).not.toMatch(/Seq Scan/);
        expect(keyedPlan.match(/Index Scan using path_leases_pkey/g)?.length, keyedPlan).toBe(3);
        expect(
          keyedPlan.match(/Index Cond: \(\(workspace_id = '[^']+'::text\) AND \(lease_key/g)?.length,
          keyedPlan,
        ).toBe(3);
        // The whole-workspace range covers the workspace; any index that narrows to it will do.
        const wholePlan = await explain(whole);
        expect(wholePlan).not.toMatch(/Seq Scan/);
        expect(wholePlan, wholePlan).toMatch(/Index Cond: \(+workspace_id = /);
      }
      const found = await store.paths.tryAcquirePaths(req(busy, 'me', ['dir3']));
      expect(found.acquired).toBe(false);
      if (!found.acquired) expect(found.conflicts.length).toBe(16);
      const everything = await store.paths.tryAcquirePaths(req(quiet, 'me', ['.']));
      expect(everything.acquired).toBe(false);
      if (!everything.acquired) expect(everything.conflicts.length).toBe(10);
    });
  });

  describe("a grant's rows", () => {
    it("release, renewal and assertLease find a grant by its token (path_leases_holder_token_idx), not through the holder's other leases", async () => {
      const ws = await workspace();
      // 3,000 live grants of one holder in the workspace (a coordinator leasing for all its tasks).
      const rows = Array.from({ length: 3_000 }, (_, i) => ({
        workspace_id: ws,
        lease_key: `/held/f${i}/`,
        holder: 'coord',
        task_id: null,
        acquired_at: 0,
        expires_at: 9e12,
        token: i + 1,
      }));
      await store.db
        .insertInto('path_lease_tokens')
        .values({ workspace_id: ws, token: 3_000, updated_at: 0 })
        .execute();
      await insertLeasesAndAnalyze(rows);
      const statements: { sql: string; parameters: readonly unknown[] }[] = [];
      const own = await fx.open(url, { onQuery: (q) => statements.push(q) });
      try {
        const grant = await own.paths.tryAcquirePaths(req(ws, 'coord', ['src/x']));
        if (grant.status !== 'acquired') throw new Error('the grant was refused');
        statements.length = 0;
        const renewed = await own.paths.renewPaths(grant.lease, { ttlMs: LONG_TTL });
        await own.transaction(async (tx) => tx.assertLease(renewed));
        expect((await own.paths.releasePaths(renewed)).released).toEqual(['src/x']);
        // Every statement that reads or deletes a grant's rows by its token.
        const byToken = statements.filter(
          (q) => /path_leases"? /.test(q.sql) && /"?token"? = /.test(q.sql) && !/^\s*insert/i.test(q.sql),
        );
        expect(byToken.length, statements.map((q) => q.sql).join('\n')).toBeGreaterThanOrEqual(2);
        const explain = fx.kind === 'postgres' ? 'explain ' : 'explain query plan ';
        for (const q of byToken) {
          // PostgreSQL sends a lone release with BEGIN and COMMIT, its values as literals: explain its own statement.
          const text = /^begin/i.test(q.sql) ? q.sql.split(';').find((part) => part.includes('path_leases'))! : q.sql;
          const plan = JSON.stringify(
            (await own.db.executeQuery(CompiledQuery.raw(explain + text, [...q.parameters]))).rows,
          );
          // Mutant "no schema 0110": each reads the holder's 3,000 leases through path_leases_holder_idx;
          // mutant "0110's index without token": the same through the new index.
          expect(plan, q.sql).toContain('path_leases_holder_token_idx');
          expect(plan, q.sql).toMatch(fx.kind === 'postgres' ? /Index Cond: [^"]*token = / : /holder=\? AND token=\?/);
        }
      } finally {
        await own.close();
      }
    });
  });

  describe('across processes', () => {
    let contenders: Contenders<typeof OPS>;
    let parent: Store;
    let raceCompany: string;

    beforeAll(async () => {
      parent = await fx.open(url);
      raceCompany = (await parent.org.createCompany({ name: 'race' })).id;
      contenders = await Contenders.start(8, { url, ops: OPS, storeOptions: { poolSize: 2 } });
    });
    afterAll(async () => {
      await contenders?.close();
    });

    it('the history checker flags overlapping holds and finds parallel disjoint ones', () => {
      const grant = (holder: string, keys: string[], s: number, e: number, token?: number): RaceEvent => ({
        type: 'grant',
        holder,
        keys,
        grantNs: String(s),
        releaseNs: String(e),
        via: 'try',
        ...(token === undefined ? {} : { token }),
      });
      const bad = checkHistory([
        grant('c0', ['src'], 0, 10),
        grant('c1', ['src/a.ts'], 9, 20),
        grant('c2', ['srcx'], 5, 6),
      ]);
      expect(bad.violations.map(([a, b]) => [a.holder, b.holder])).toEqual([['c0', 'c1']]);
      expect(bad.parallelDisjoint).toBe(1);
      const serial = checkHistory([grant('c0', [''], 0, 10), grant('c1', ['a'], 10, 20), grant('c2', ['b'], 20, 30)]);
      expect(serial).toMatchObject({ violations: [], parallelDisjoint: 0 });
      const bogus = checkHistory([
        grant('c0', ['a'], 0, 10),
        {
          type: 'conflict',
          holder: 'c1',
          keys: ['b'],
          conflicts: [{ key: 'a', holder: 'c0', expiresAt: 0, token: 1 }],
        },
      ]);
      expect(bogus.bogusConflicts.length).toBe(1);
      const tokens = checkHistory([
        grant('c0', ['a'], 0, 10, 2),
        grant('c1', ['a/b'], 10, 20, 2),
        grant('c2', ['a'], 20, 30, 1),
        grant('c3', ['z'], 30, 40, 3),
      ]);
      expect(tokens.tokenViolations).toEqual([
        'token 2 granted to c0 and c1',
        "c1's token 2 after c0's 2 on overlapping keys",
        "c2's token 1 after c0's 2 on overlapping keys",
        "c2's token 1 after c1's 2 on overlapping keys",
      ]);
    });

    it(
      '8 processes racing random overlapping and disjoint path sets never hold overlapping leases at once',
      async () => {
        const ws = await workspace(parent, raceCompany);
        const seed = Date.now() % 100_000;
        const events: RaceEvent[] = [];
        // Two waves, and up to four more while no two disjoint holds have overlapped yet: on a loaded
        // machine the processes may happen to take turns, and the race must have been a race.
        let report = checkHistory(events);
        for (let wave = 0; wave < 6 && (wave < 2 || report.parallelDisjoint === 0); wave++) {
          const outcomes = await contenders.race('raceRounds', () => ({
            workspaceId: ws,
            rounds: SOAK_ROUNDS ? Math.ceil(SOAK_ROUNDS / 2) : 25, // two waves
            seed: seed + wave,
            ttlMs: LONG_TTL,
            holdMaxMs: SOAK_ROUNDS ? 4 : 12 * (wave + 1),
          }));
          for (const o of outcomes) events.push(...ok(o));
          report = checkHistory(events);
        }
        const context = `seed ${seed}: ${report.grants} grants, ${report.refusals} refusals, ${report.parallelDisjoint} parallel disjoint pairs`;
        expect(report.violations, context).toEqual([]);
        expect(report.bogusConflicts, context).toEqual([]);
        expect(report.tokenViolations, context).toEqual([]);
        expect(report.grants, context).toBeGreaterThan(0);
        expect(report.refusals, context).toBeGreaterThan(0);
        expect(report.parallelDisjoint, context).toBeGreaterThan(0);
        if (SOAK_ROUNDS) console.log(`[lease soak: paths] ${context}`);
        expect(await parent.paths.listPathLeases({ workspaceId: ws })).toEqual([]);
      },
      SOAK_TIMEOUT,
    );

    it('8 processes on a workspace no grant has touched (no token row yet): claimTask and tryAcquirePaths grant one', async () => {
      // The workspace's key is what serializes the first grant there: before it, no token row
      // exists to lock, so without the key every contender's check would find the workspace empty.
      const counts: number[] = [];
      for (let round = 0; round < 12; round++) {
        const ws = await workspace(parent, raceCompany);
        const paths = ['src/a', round % 2 === 0 ? 'src' : 'docs'];
        const tasks = await Promise.all(
          [0, 2, 4, 6].map((i) =>
            parent.tasks.createTask({
              companyId: raceCompany,
              workspaceId: ws,
              title: `first-${round}-${i}`,
              requiresFilesystem: true,
              writes: paths,
              status: 'ready',
            }),
          ),
        );
        const outcomes = await contenders.race('firstGrant', (i) => ({
          taskId: i % 2 === 0 ? tasks[i / 2]!.id : null,
          workspaceId: ws,
          holder: `c${i}`,
          paths,
          ttlMs: LONG_TTL,
        }));
        const granted = outcomes.map(ok).filter((o) => o.granted);
        counts.push(granted.length);
        expect(granted.map((g) => g.token)).toEqual([1]);
      }
      expect(counts, counts.join(',')).toEqual(Array(12).fill(1));
    });

    it('one workspace, one exclusion rule: 4 lock holders and 4 path holders never hold at once', async () => {
      const ws = await workspace(parent, raceCompany);
      const seed = Date.now() % 100_000;
      const events: RaceEvent[] = [];
      for (let wave = 0; wave < 2; wave++) {
        const outcomes = await contenders.race('mixedRounds', () => ({
          workspaceId: ws,
          rounds: 25,
          seed: seed + wave,
          ttlMs: LONG_TTL,
          holdMaxMs: 8,
        }));
        for (const o of outcomes) events.push(...ok(o));
      }
      const report = checkHistory(events);
      const holds = events.filter((e) => e.type === 'grant');
      const locks = holds.filter((e) => e.via === 'lock').length;
      const context = `seed ${seed}: ${locks} lock grants, ${holds.length - locks} path grants, ${report.refusals} refusals`;
      expect(report.violations, context).toEqual([]);
      expect(report.bogusConflicts, context).toEqual([]);
      expect(locks, context).toBeGreaterThan(0);
      expect(holds.length - locks, context).toBeGreaterThan(0);
      // That path holders still run in parallel is the previous test's to prove (it has no lock
      // holders to serialize them); here, under load, every path grant can fall beside a lock.
      console.log(`[exclusion race] ${context}, ${report.parallelDisjoint} parallel disjoint pairs`);
    }, 120_000);

    it('a blocked acquirePaths holds nothing while it waits and takes the whole set once the blocker releases', async () => {
      const ws = await workspace(parent, raceCompany);
      expect(ok(await contenders.run(0, 'hold', req(ws, 'h0', ['src/b']))).result.acquired).toBe(true);
      const waiter = contenders.start(1, 'waitAfterBlocked', {
        ...req(ws, 'h1', ['src/a', 'src/b']),
        timeoutMs: 120_000,
      });
      await contenders.waitForSignal(1, 'blocked');
      // The waiter holds no part of its set: src/a can be taken and released by a third process.
      const third = ok(await contenders.run(2, 'hold', req(ws, 'h2', ['src/a'])));
      expect(third.result.acquired).toBe(true);
      const thirdRelease = ok(await contenders.run(2, 'release', { workspaceId: ws, holder: 'h2' }));
      const blockerRelease = ok(
        await contenders.run(0, 'release', {
          workspaceId: ws,
          holder: 'h0',
        }),
      );
      expect(blockerRelease.released).toEqual(['src/b']);
      const woken = ok(await waiter);
      expect(woken.first.acquired).toBe(false);
      expect(woken.keys).toEqual(['src/a', 'src/b']);
      expect(BigInt(woken.grantNs)).toBeGreaterThan(BigInt(blockerRelease.releaseNs));
      expect(BigInt(woken.grantNs)).toBeGreaterThan(BigInt(thirdRelease.releaseNs));
      expect((await parent.paths.listPathLeases({ workspaceId: ws })).map((l) => [l.key, l.holder])).toEqual([
        ['src/a', 'h1'],
        ['src/b', 'h1'],
      ]);
    });

    it('waiters on crossed multi-path sets all get through: no deadlock', async () => {
      const ws = await workspace(parent, raceCompany);
      await parent.paths.tryAcquirePaths(req(ws, 'blocker', ['a', 'b', 'c']));
      const orders = [
        ['a', 'b'],
        ['b', 'a'],
        ['c', 'a'],
        ['b', 'c'],
        ['a', 'b', 'c'],
      ];
      const runs = orders.map((paths, i) =>
        contenders.start(i, 'acquireHoldRelease', {
          ...req(ws, `w${i}`, paths),
          timeoutMs: 120_000,
        }),
      );
      for (let i = 0; i < orders.length; i++) await contenders.waitForSignal(i, 'waiting');
      await parent.paths.releasePaths({ workspaceId: ws, holder: 'blocker' });
      const done = (await Promise.all(runs)).map(ok);
      const report = checkHistory(
        done.map(
          (d, i) =>
            ({
              type: 'grant',
              holder: `w${i}`,
              keys: d.keys,
              grantNs: d.grantNs,
              releaseNs: d.releaseNs,
              via: 'wait',
            }) as const,
        ),
      );
      expect(report.violations).toEqual([]);
      expect(done.map((d) => d.keys)).toEqual(orders.map((o) => [...o].sort()));
    });

    it('a blocked acquirePaths times out naming its blockers when nobody releases, leaving nothing leased', async () => {
      const ws = await workspace(parent, raceCompany);
      await parent.paths.tryAcquirePaths(req(ws, 'sitter', ['docs']));
      const outcome = await contenders.run(3, 'acquire', { ...req(ws, 'h3', ['docs/a.md', 'lib']), timeoutMs: 300 });
      expect(outcome.ok).toBe(false);
      if (outcome.ok) return;
      expect(outcome.error).toMatchObject({
        name: PathLeaseTimeoutError.name,
        code: 'PATH_LEASE_TIMEOUT',
        holder: 'h3',
        timeoutMs: 300,
        blockers: [{ key: 'docs', holder: 'sitter' }],
      });
      expect(outcome.error.message).toContain('sitter');
      expect(await parent.paths.listPathLeases({ workspaceId: ws, holder: 'h3' })).toEqual([]);
    });

    it("a SIGKILLed holder's task leases block until their TTL runs out, then stop blocking", async () => {
      const ws = await workspace(parent, raceCompany);
      const t = await parent.tasks.createTask({
        companyId: raceCompany,
        title: 'doomed',
        requiresFilesystem: true,
        workspaceId: ws,
        writes: ['src'],
        status: 'ready',
      });
      const victim = 7;
      const hung = contenders.start(victim, 'claimAndHang', { taskId: t.id, holder: 'doomed', ttlMs: 1_500 });
      hung.catch(() => {});
      await contenders.waitForSignal(victim, 'claimed');
      await contenders.kill(victim);
      await expect(hung).rejects.toBeInstanceOf(ContenderExitedError);
      // The dead holder never released: its row is still there, with the TTL it was given.
      const [row] = await parent.db.selectFrom('path_leases').selectAll().where('workspace_id', '=', ws).execute();
      expect(row).toMatchObject({ lease_key: '/src/', holder: 'doomed', task_id: t.id });
      const expiresAt = Number(row!.expires_at);
      expect(expiresAt - Number(row!.acquired_at)).toBe(1_500);
      // Looked at from just before and at its expiry (a store on a fixed clock): it blocks, then it does not.
      let probeTime = expiresAt - 1;
      const probe = await fx.open(url, { clock: { now: () => probeTime } });
      expect(await probe.paths.tryAcquirePaths(req(ws, 'probe', ['src/a.ts']))).toMatchObject({
        acquired: false,
        conflicts: [{ key: 'src', holder: 'doomed' }],
      });
      probeTime = expiresAt;
      expect((await probe.paths.tryAcquirePaths(req(ws, 'probe', ['src/a.ts']))).acquired).toBe(true);
      await probe.paths.releasePaths({ workspaceId: ws, holder: 'probe' });
      // And in real time, a waiting process gets the path once the TTL has run out.
      const outcome = await contenders.run(4, 'acquire', {
        ...req(ws, 'next', ['src/a.ts']),
        timeoutMs: 60_000,
      });
      expect(ok(outcome).keys).toEqual(['src/a.ts']);
    });
  });
}
