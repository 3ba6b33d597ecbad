/**
 * Contender operations for the path-lease suite (run in child processes by the race helper).
 * Times are `process.hrtime.bigint()` (CLOCK_MONOTONIC on Linux: one clock shared by every
 * process on the host), sent as decimal strings.
 */
import type { PathLeaseConflict, Store } from '../../src/index.js';
import type { ContenderTools } from '../support/contender.js';
import { defineOperations } from '../support/operations.js';

const now = () => process.hrtime.bigint().toString();
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Paths the random rounds choose from: nested, sibling and prefix-named (`src` vs `srcx`) paths. */
export const RACE_UNIVERSE = [
  'src',
  'src/a',
  'src/a/x.ts',
  'src/b',
  'src/b/y.ts',
  'srcx/q.ts',
  'docs',
  'docs/readme.md',
  'lib/z.ts',
  'lib/w.ts',
  'test/t1.ts',
  'test/t2.ts',
] as const;

/** A small seeded PRNG (mulberry32), so each contender's choices are reproducible from the seed. */
function prng(seed: number) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export type RaceEvent =
  | {
      readonly type: 'grant';
      readonly holder: string;
      readonly keys: string[];
      readonly grantNs: string;
      readonly releaseNs: string;
      readonly via: 'try' | 'wait' | 'lock';
      /** The grant's fencing token (path grants; a lock's token is of another counter). */
      readonly token?: number;
    }
  | {
      readonly type: 'conflict';
      readonly holder: string;
      readonly keys: string[];
      readonly conflicts: PathLeaseConflict[];
    }
  | {
      readonly type: 'timeout';
      readonly holder: string;
      readonly keys: string[];
      readonly blockers: PathLeaseConflict[];
    };

export interface RaceArgs {
  readonly workspaceId: string;
  readonly rounds: number;
  readonly seed: number;
  readonly ttlMs: number;
  readonly holdMaxMs: number;
}

/**
 * `rounds` times: pick 1–3 random paths (now and then the whole workspace), take them with
 * `tryAcquirePaths` (or, every fourth round, a short blocking `acquirePaths`), hold them a few
 * ms, release. Logs each grant with its hold interval: from just after the grant returned to
 * just before the release is issued.
 */
export async function raceRounds(store: Store, args: RaceArgs, tools: ContenderTools): Promise<RaceEvent[]> {
  const random = prng(args.seed * 1000 + tools.index);
  const holder = `c${tools.index}`;
  const events: RaceEvent[] = [];
  for (let round = 0; round < args.rounds; round++) {
    const paths =
      random() < 0.04
        ? ['.']
        : Array.from(
            { length: 1 + Math.floor(random() * 3) },
            () => RACE_UNIVERSE[Math.floor(random() * RACE_UNIVERSE.length)]!,
          );
    const request = { workspaceId: args.workspaceId, holder, paths, ttlMs: args.ttlMs };
    let keys: string[];
    let token: number | null | undefined;
    let via: 'try' | 'wait';
    if (round % 4 === 3) {
      via = 'wait';
      try {
        const leases = await store.paths.acquirePaths(request, { timeoutMs: 150, maxPollMs: 20 });
        keys = leases.map((l) => l.key);
        token = leases.lease.token;
      } catch (error) {
        const e = error as { code?: string; keys: string[]; blockers: PathLeaseConflict[] };
        if (e.code !== 'PATH_LEASE_TIMEOUT') throw error;
        events.push({ type: 'timeout', holder, keys: [...e.keys], blockers: [...e.blockers] });
        continue;
      }
    } else {
      via = 'try';
      const result = await store.paths.tryAcquirePaths(request);
      if (!result.acquired) {
        events.push({ type: 'conflict', holder, keys: paths, conflicts: [...result.conflicts] });
        continue;
      }
      keys = result.leases.map((l) => l.key);
      token = result.lease.token;
    }
    const grantNs = now();
    await sleep(1 + Math.floor(random() * args.holdMaxMs));
    const releaseNs = now();
    await store.paths.releasePaths({ workspaceId: args.workspaceId, holder });
    events.push({ type: 'grant', holder, keys, grantNs, releaseNs, via, ...(token == null ? {} : { token }) });
  }
  return events;
}

/**
 * One workspace, one exclusion rule: even contenders take the workspace's exclusive lock
 * (`claimWorkspaceLock`, what `dispatchRun` takes), the others random path sets
 * (`tryAcquirePaths`), `rounds` times each, holding a few ms and releasing by grant. Path holders
 * pause 5–25 ms between rounds, so the workspace is often empty and the lock is often granted. A lock is
 * logged as a hold of the whole workspace (`""`), so the path history checker judges both.
 */
export async function mixedRounds(store: Store, args: RaceArgs, tools: ContenderTools): Promise<RaceEvent[]> {
  const random = prng(args.seed * 1000 + tools.index);
  const holder = `c${tools.index}`;
  const locker = tools.index % 2 === 0;
  const events: RaceEvent[] = [];
  for (let round = 0; round < args.rounds; round++) {
    if (locker) {
      const claim = await store.locks.claimWorkspaceLock(args.workspaceId, {
        holder,
        runId: `${holder}-${round}`,
        ttlMs: args.ttlMs,
      });
      if (claim.status === 'busy') {
        const { holder: by, expiresAt, token, pathKey } = claim.heldBy;
        events.push({
          type: 'conflict',
          holder,
          keys: ['.'],
          conflicts: [{ key: pathKey ?? '', holder: by, expiresAt, token }],
        });
        await sleep(1 + Math.floor(random() * 3));
        continue;
      }
      const grantNs = now();
      await sleep(1 + Math.floor(random() * args.holdMaxMs));
      const releaseNs = now();
      await store.locks.releaseWorkspaceLock(claim.lease);
      events.push({ type: 'grant', holder, keys: [''], grantNs, releaseNs, via: 'lock' });
      await sleep(5 + Math.floor(random() * 20));
      continue;
    }
    const paths = Array.from(
      { length: 1 + Math.floor(random() * 3) },
      () => RACE_UNIVERSE[Math.floor(random() * RACE_UNIVERSE.length)]!,
    );
    const result = await store.paths.tryAcquirePaths({
      workspaceId: args.workspaceId,
      holder,
      paths,
      ttlMs: args.ttlMs,
    });
    if (result.status === 'busy') {
      events.push({ type: 'conflict', holder, keys: paths, conflicts: [...result.heldBy.conflicts] });
      await sleep(5 + Math.floor(random() * 20));
      continue;
    }
    const grantNs = now();
    await sleep(1 + Math.floor(random() * args.holdMaxMs));
    const releaseNs = now();
    await store.paths.releasePaths(result.lease);
    events.push({ type: 'grant', holder, keys: [...result.lease.keys], grantNs, releaseNs, via: 'try' });
    await sleep(5 + Math.floor(random() * 20));
  }
  return events;
}

/** `tryAcquirePaths`, stamped with the time just after it returned. */
export async function hold(
  store: Store,
  args: { workspaceId: string; holder: string; paths: string[]; ttlMs: number; taskId?: string },
) {
  const result = await store.paths.tryAcquirePaths(args);
  return { result, grantNs: now() };
}

/** `releasePaths`, stamped with the time just before it was issued. */
export async function release(store: Store, args: { workspaceId: string; holder: string; paths?: string[] }) {
  const releaseNs = now();
  const result = await store.paths.releasePaths(args);
  return { released: result.released, releaseNs };
}

/**
 * Checks that `paths` are blocked right now (`tryAcquirePaths`), signals "blocked", then waits
 * for them with `acquirePaths`; returns the leases with the time just after the grant.
 */
export async function waitAfterBlocked(
  store: Store,
  args: { workspaceId: string; holder: string; paths: string[]; ttlMs: number; timeoutMs: number },
  tools: ContenderTools,
) {
  const first = await store.paths.tryAcquirePaths(args);
  tools.signal('blocked');
  const leases = await store.paths.acquirePaths(args, { timeoutMs: args.timeoutMs });
  return { first, keys: leases.map((l) => l.key), grantNs: now() };
}

/** Blocking acquire, a short hold, release: one whole critical section. */
export async function acquireHoldRelease(
  store: Store,
  args: { workspaceId: string; holder: string; paths: string[]; ttlMs: number; timeoutMs: number },
  tools: ContenderTools,
) {
  tools.signal('waiting');
  const leases = await store.paths.acquirePaths(args, { timeoutMs: args.timeoutMs });
  const grantNs = now();
  await sleep(5);
  const releaseNs = now();
  await store.paths.releasePaths({ workspaceId: args.workspaceId, holder: args.holder });
  return { keys: leases.map((l) => l.key), grantNs, releaseNs };
}

/** Blocking acquire with a timeout; the error (if any) goes back to the parent. */
export async function acquire(
  store: Store,
  args: { workspaceId: string; holder: string; paths: string[]; ttlMs: number; timeoutMs: number },
) {
  const leases = await store.paths.acquirePaths(args, { timeoutMs: args.timeoutMs });
  return { keys: leases.map((l) => l.key), grantNs: now() };
}

/** Claims a task, signals "claimed", and then hangs, holding its leases until it is killed. */
export async function claimAndHang(
  store: Store,
  args: { taskId: string; holder: string; ttlMs: number },
  tools: ContenderTools,
) {
  const result = await store.paths.claimTask(args.taskId, args.holder, { ttlMs: args.ttlMs });
  if (!result.claimed) throw new Error(`claim failed: ${JSON.stringify(result.conflicts)}`);
  tools.signal('claimed');
  await new Promise(() => {});
}

/**
 * One attempt on a workspace no grant has touched yet: `claimTask` of the contender's own task
 * when it has one, else `tryAcquirePaths` of the same paths. Returns whether it was granted.
 */
export async function firstGrant(
  store: Store,
  args: { taskId: string | null; workspaceId: string; holder: string; paths: string[]; ttlMs: number },
) {
  if (args.taskId !== null) {
    const claim = await store.paths.claimTask(args.taskId, args.holder, { ttlMs: args.ttlMs });
    return { granted: claim.claimed, token: claim.claimed ? claim.lease.token : null };
  }
  const result = await store.paths.tryAcquirePaths(args);
  return { granted: result.acquired, token: result.acquired ? result.lease.token : null };
}

/** The operations this module's contenders run (see test/support/operations.ts). */
export const ops = defineOperations(import.meta.url, {
  raceRounds,
  mixedRounds,
  hold,
  release,
  waitAfterBlocked,
  acquireHoldRelease,
  acquire,
  claimAndHang,
  firstGrant,
});
