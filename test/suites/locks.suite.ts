/**
 * Workspace lock mode (seed 000, SPEC §4) on one dialect: fenced workspace locks and task leases,
 * the decision table and failure-mode table through the real lookups and `dispatchRun`, the
 * multi-process races, and the v52 backfill fixture.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from 'kysely';
import {
  DEFAULT_DISPATCH_TTL_MS,
  LeaseLostError,
  type Agent,
  type CleanupClaim,
  type Clock,
  type Lease as LeaseGrant,
  type MigrationEvent,
  type Store,
  type Task,
} from '../../src/index.js';
import { backfillRequiresFilesystem } from '../../src/migrations/0052_requires_filesystem.js';
import type { DialectFixture } from '../support/fixtures.js';
import { Contenders } from '../support/race.js';
import type { DispatchSummary } from './locks.ops.js';
import { ops as OPS } from './locks.ops.js';
import { tbl } from '../support/schema.js';

/** A clock the test moves by hand. */
export class ManualClock implements Clock {
  constructor(public t = 1_000_000) {}
  now(): number {
    return this.t;
  }
}

async function countRows(store: Store, table: 'workspace_locks' | 'task_leases'): Promise<number> {
  const row = await store.db
    .selectFrom(table)
    .select((eb) => eb.fn.countAll<number | string>().as('n'))
    .executeTakeFirstOrThrow();
  return Number(row.n);
}

/** One company with a workspace, an agent and a project, for the single-process tests. */
async function seedOrg(store: Store, prefix: string) {
  const company = await store.org.createCompany({ id: `${prefix}-co`, name: 'Acme' });
  const ws = await store.org.createWorkspace({ id: `${prefix}-ws`, companyId: company.id, name: 'main' });
  return { company, ws };
}

export function defineLockSuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  // One database for every single-process test (each works on its own company), on a clock the
  // tests move by hand; creating and migrating databases is the slow part on PostgreSQL.
  let store: Store;
  let clock: ManualClock;
  beforeAll(async () => {
    fx = makeFixture();
    clock = new ManualClock();
    store = await fx.freshStore({ clock });
  });
  afterAll(() => fx.cleanup());

  describe('workspace locks', () => {
    let n = 0;
    let wsId: string;
    async function freshWorkspace() {
      const { ws } = await seedOrg(store, `wl${++n}`);
      wsId = ws.id;
      return ws.id;
    }

    it('grants token 1 to the first claim and reports the holder to a second claimer', async () => {
      const ws = await freshWorkspace();
      const first = await store.locks.claimWorkspaceLock(ws, { holder: 'h1', runId: 'r1', ttlMs: 1000 });
      expect(first).toEqual({
        status: 'acquired',
        lease: expect.objectContaining({ token: 1, expiresAt: clock.t + 1000 }),
      });
      const second = await store.locks.claimWorkspaceLock(ws, { holder: 'h2', runId: 'r2', ttlMs: 1000 });
      expect(second).toEqual({
        status: 'busy',
        heldBy: { holder: 'h1', runId: 'r1', token: 1, expiresAt: clock.t + 1000 },
      });
      expect(await store.locks.getWorkspaceLock(ws)).toEqual({
        holder: 'h1',
        runId: 'r1',
        token: 1,
        expiresAt: clock.t + 1000,
      });
    });

    it('increases the token strictly across claim/release cycles and never deletes the row', async () => {
      const ws = await freshWorkspace();
      const tokens: number[] = [];
      for (let i = 0; i < 5; i++) {
        const claim = await store.locks.claimWorkspaceLock(ws, { holder: `h${i}`, runId: `r${i}`, ttlMs: 1000 });
        if (claim.status !== 'acquired') throw new Error('expected a claim');
        tokens.push(claim.lease.token);
        await store.locks.releaseWorkspaceLock(ws, { token: claim.lease.token });
        expect(await store.locks.getWorkspaceLock(ws)).toBeNull();
      }
      expect(tokens).toEqual([1, 2, 3, 4, 5]);
      const rows = await store.db.selectFrom('workspace_locks').selectAll().where('workspace_id', '=', ws).execute();
      expect(rows).toHaveLength(1);
      expect(rows[0]).toMatchObject({ holder: null, run_id: null, token: 5 });
    });

    it('keeps a lock busy until its expiry instant, then grants it to the next holder with a higher token', async () => {
      const ws = await freshWorkspace();
      const start = clock.t;
      const first = await store.locks.claimWorkspaceLock(ws, { holder: 'crashed', runId: 'r1', ttlMs: 1000 });
      expect(first).toMatchObject({ status: 'acquired', lease: { token: 1 } });
      clock.t = start + 999;
      expect(await store.locks.claimWorkspaceLock(ws, { holder: 'next', runId: 'r2', ttlMs: 1000 })).toMatchObject({
        status: 'busy',
      });
      clock.t = start + 1000; // expires_at <= now: expired
      expect(await store.locks.getWorkspaceLock(ws)).toBeNull();
      const next = await store.locks.claimWorkspaceLock(ws, { holder: 'next', runId: 'r2', ttlMs: 1000 });
      expect(next).toEqual({
        status: 'acquired',
        lease: expect.objectContaining({ token: 2, expiresAt: start + 2000 }),
      });
      // The crashed holder comes back: its token is refused for renew and release.
      await expect(store.locks.renewWorkspaceLock(ws, { token: 1, ttlMs: 1000 })).rejects.toMatchObject({
        code: 'STALE_WORKSPACE_LOCK',
        reason: 'superseded',
        current: { token: 2, holder: 'next' },
      });
      await expect(store.locks.releaseWorkspaceLock(ws, { token: 1 })).rejects.toMatchObject({
        code: 'STALE_WORKSPACE_LOCK',
      });
      expect(await store.locks.getWorkspaceLock(ws)).toMatchObject({ holder: 'next', token: 2 });
    });

    it('renews a live lock and refuses to revive an expired one', async () => {
      const ws = await freshWorkspace();
      const start = clock.t;
      const claim = await store.locks.claimWorkspaceLock(ws, { holder: 'h', runId: 'r', ttlMs: 1000 });
      if (claim.status !== 'acquired') throw new Error('expected a claim');
      clock.t = start + 900;
      expect(await store.locks.renewWorkspaceLock(ws, { token: claim.lease.token, ttlMs: 1000 })).toMatchObject({
        token: 1,
        expiresAt: start + 1900,
      });
      clock.t = start + 1900;
      await expect(store.locks.renewWorkspaceLock(ws, { token: claim.lease.token, ttlMs: 1000 })).rejects.toMatchObject(
        {
          code: 'STALE_WORKSPACE_LOCK',
          reason: 'expired',
        },
      );
      // Nobody claimed since, so the holder may still release (and releasing twice is harmless).
      await store.locks.releaseWorkspaceLock(ws, { token: claim.lease.token });
      await store.locks.releaseWorkspaceLock(ws, { token: claim.lease.token });
      expect(await store.locks.claimWorkspaceLock(ws, { holder: 'h2', runId: 'r2', ttlMs: 1000 })).toMatchObject({
        lease: { token: 2 },
      });
    });

    it('refuses a token that was never granted', async () => {
      const ws = await freshWorkspace();
      await expect(store.locks.releaseWorkspaceLock(ws, { token: 7 })).rejects.toMatchObject({
        code: 'STALE_WORKSPACE_LOCK',
        reason: 'never_granted',
        current: null,
      });
      await store.locks.claimWorkspaceLock(ws, { holder: 'h', runId: 'r', ttlMs: 1000 });
      await expect(store.locks.renewWorkspaceLock(ws, { token: 2, ttlMs: 1000 })).rejects.toMatchObject({
        code: 'STALE_WORKSPACE_LOCK',
        reason: 'never_granted',
      });
    });

    it('reports a missing workspace as NOT_FOUND and bad arguments as INVALID_ARGUMENT', async () => {
      await freshWorkspace();
      await expect(
        store.locks.claimWorkspaceLock('no-such-ws', { holder: 'h', runId: 'r', ttlMs: 1000 }),
      ).rejects.toMatchObject({
        code: 'NOT_FOUND',
        entity: 'workspace',
      });
      await expect(store.locks.claimWorkspaceLock(wsId, { holder: '', runId: 'r', ttlMs: 1000 })).rejects.toMatchObject(
        { code: 'INVALID_ARGUMENT', field: 'holder' },
      );
      await expect(store.locks.claimWorkspaceLock(wsId, { holder: 'h', runId: 'r', ttlMs: 0 })).rejects.toMatchObject({
        code: 'INVALID_ARGUMENT',
        field: 'ttlMs',
      });
      await expect(store.locks.releaseWorkspaceLock(wsId, { token: 1.5 })).rejects.toMatchObject({
        code: 'INVALID_ARGUMENT',
        field: 'token',
      });
      expect(await countRows(store, 'workspace_locks')).toBeGreaterThan(0);
      const stray = await store.db
        .selectFrom('workspace_locks')
        .select('workspace_id')
        .where('workspace_id', '=', 'no-such-ws')
        .execute();
      expect(stray).toEqual([]);
    });
  });

  describe('one lease protocol: claim, renew and release agree across kinds', () => {
    let n = 0;
    /**
     * Every kind's claim, renew and release, as the protocol's table. `succession`: the resource
     * is granted again with the next token (a coordinator run is granted once: its id is the
     * resource, and a new run is a new resource). `lapses`: the lease has a TTL.
     */
    async function kinds() {
      const { ws } = await seedOrg(store, `lp${++n}`);
      const pathsWs = await store.org.createWorkspace({ id: `lp${n}-paths`, companyId: ws.companyId, name: 'paths' });
      const task = await store.tasks.createTask({
        companyId: ws.companyId,
        title: 'protocol',
        requiresFilesystem: false,
      });
      const target = `worktree:lp${n}`;
      // A cleanup claim is a lease on a snapshot; its calls take the claim object, so they are
      // adapted here to take and return its `lease` (the claim of each token is kept by token).
      const owner = await store.tasks.createTask({
        companyId: ws.companyId,
        title: 'owner',
        requiresFilesystem: false,
      });
      await store.ownership.createEnvironment({ ownerTaskId: owner.id, rootPath: `/ws/lp${n}` });
      const [snapshot] = (await store.ownership.admitTaskCleanup(owner.id)).snapshots;
      const claims = new Map<number, CleanupClaim>();
      const claimOf = (lease: LeaseGrant) => {
        const known = claims.get(lease.token) ?? [...claims.values()][0]!;
        return {
          ...known,
          attempt: lease.token,
          expiresAt: lease.expiresAt,
          lease: lease as LeaseGrant<'cleanup_claim'>,
        };
      };
      return [
        {
          name: 'workspace lock',
          code: 'STALE_WORKSPACE_LOCK',
          succession: true,
          lapses: true,
          claim: (holder: string) =>
            store.locks.claimWorkspaceLock(ws.id, { holder, runId: `${holder}-run`, ttlMs: 1000 }),
          renew: (lease: never) => store.locks.renewWorkspaceLock(lease, { ttlMs: 1000 }),
          release: (lease: never) => store.locks.releaseWorkspaceLock(lease),
        },
        {
          name: 'task lease',
          code: 'STALE_TASK_LEASE',
          succession: true,
          lapses: true,
          claim: (holder: string) => store.locks.claimTaskLease(task.id, { holder, ttlMs: 1000 }),
          renew: (lease: never) => store.locks.renewTaskLease(lease, { ttlMs: 1000 }),
          release: (lease: never) => store.locks.releaseTaskLease(lease),
        },
        {
          name: 'semaphore slot',
          code: 'SEMAPHORE_LEASE_LOST',
          succession: true,
          lapses: true,
          claim: (holder: string) => store.semaphores.acquire(`lp${n}-sem`, { holder, limit: 1, ttlMs: 1000 }),
          renew: (lease: never) => store.semaphores.renew(lease, { ttlMs: 1000 }),
          release: (lease: never) => store.semaphores.release(lease),
        },
        {
          name: 'path lease',
          code: 'PATH_LEASE_LOST',
          succession: true,
          lapses: true,
          claim: (holder: string) =>
            store.paths.tryAcquirePaths({ workspaceId: pathsWs.id, holder, paths: ['src'], ttlMs: 1000 }),
          renew: (lease: never) => store.paths.renewPaths(lease, { ttlMs: 1000 }),
          release: (lease: never) => store.paths.releasePaths(lease),
        },
        {
          name: 'coordinator run',
          code: 'COORDINATOR_RUN_NOT_RUNNING',
          succession: false,
          lapses: false,
          claim: (holder: string) =>
            store.runs.tryStartCoordinatorRun({ targetKey: target, coordinatorHandle: `${holder}-${n}` }),
          // A run heartbeats and stops by id; the lease is `coordinatorRunLease(run)`.
          renew: async (lease: { resource: string }) => {
            await store.runs.heartbeatCoordinatorRun(lease.resource);
            return lease;
          },
          release: (lease: { resource: string }) => store.runs.stopCoordinatorRun(lease.resource, 'completed'),
        },
        {
          name: 'cleanup claim',
          code: 'CLEANUP_CLAIM_LOST',
          succession: true,
          lapses: true,
          claim: async (holder: string) => {
            const r = await store.ownership.tryClaimCleanup(snapshot!.id, holder, { ttlMs: 1000 });
            if (r.status === 'busy') return r;
            claims.set(r.claim.attempt, r.claim);
            return { status: 'acquired' as const, lease: r.claim.lease };
          },
          renew: async (lease: LeaseGrant) =>
            (await store.ownership.renewCleanupClaim(claimOf(lease), { ttlMs: 1000 })).lease,
          release: (lease: LeaseGrant) => store.ownership.releaseCleanupClaim(claimOf(lease)),
        },
      ] as const;
    }

    it('a repeat release is a no-op; a token taken over after it lapsed is superseded; a never-granted one throws', async () => {
      for (const kind of await kinds()) {
        const first = await kind.claim('a');
        if (first.status !== 'acquired') throw new Error(`${kind.name}: expected a grant`);
        const lease = first.lease as never;
        expect(await kind.claim('b'), kind.name).toMatchObject({
          status: 'busy',
          heldBy: { holder: expect.stringMatching(/^a/) },
        });
        expect(await kind.renew(lease), kind.name).toMatchObject({ token: first.lease.token });
        await kind.release(lease);
        await kind.release(lease); // the repeat: same token, nobody claimed since
        await expect(kind.renew(lease), kind.name).rejects.toMatchObject({ code: kind.code, reason: 'released' });
        await expect(kind.renew(lease)).rejects.toBeInstanceOf(LeaseLostError);
        if (!kind.succession) continue;
        const second = await kind.claim('b');
        if (second.status !== 'acquired') throw new Error(`${kind.name}: expected a grant`);
        expect(second.lease.token, kind.name).toBe(first.lease.token + 1);
        // Still a repeat while a's lease had not lapsed: nobody can take over a live lease, so
        // b's grant proves that a released it.
        await kind.release(lease);
        const before = clock.t;
        clock.t = first.lease.expiresAt;
        try {
          // a's lease has lapsed and b was granted after a's token: a can no longer tell its own
          // release from a takeover, and is told its lease was superseded.
          await expect(kind.release(lease), kind.name).rejects.toMatchObject({ code: kind.code, reason: 'superseded' });
          await expect(kind.release(lease)).rejects.toBeInstanceOf(LeaseLostError);
        } finally {
          clock.t = before;
        }
        const never = { ...second.lease, token: second.lease.token + 5 } as never;
        await expect(kind.release(never), kind.name).rejects.toMatchObject({
          code: kind.code,
          reason: 'never_granted',
        });
        await kind.release(second.lease as never);
      }
    });

    it('a lease taken over after it lapsed is superseded on release: the semaphore slot reclaimed, the path key taken', async () => {
      for (const kind of (await kinds()).filter((k) => k.succession)) {
        const first = await kind.claim('a');
        if (first.status !== 'acquired') throw new Error(`${kind.name}: expected a grant`);
        clock.t = first.lease.expiresAt + 1;
        const second = await kind.claim('b'); // a takeover of the lapsed lease (a reclaimed slot, a taken key)
        if (second.status !== 'acquired') throw new Error(`${kind.name}: expected a takeover`);
        await expect(kind.release(first.lease as never), kind.name).rejects.toMatchObject({
          code: kind.code,
          reason: 'superseded',
        });
        await kind.release(second.lease as never);
      }
    });

    it('an expired token may still be released while nobody claimed after it, but never renewed', async () => {
      for (const kind of (await kinds()).filter((k) => k.lapses)) {
        const claim = await kind.claim('a');
        if (claim.status !== 'acquired') throw new Error(`${kind.name}: expected a grant`);
        const before = clock.t;
        clock.t = claim.lease.expiresAt;
        try {
          await expect(kind.renew(claim.lease as never), kind.name).rejects.toMatchObject({
            code: kind.code,
            reason: 'expired',
          });
          await kind.release(claim.lease as never);
          await kind.release(claim.lease as never);
        } finally {
          clock.t = before;
        }
      }
    });

    it('refuses a lease of another kind before any statement', async () => {
      const [lock, lease] = await kinds();
      const claim = await lock.claim('a');
      if (claim.status !== 'acquired') throw new Error('expected a grant');
      await expect(lease.release(claim.lease as never)).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
      await lock.release(claim.lease as never);
    });
  });

  describe('task leases', () => {
    let n = 0;
    async function freshTask() {
      const { company } = await seedOrg(store, `tl${++n}`);
      const task = await store.tasks.createTask({
        companyId: company.id,
        title: 'lease me',
        requiresFilesystem: false,
      });
      return task.id;
    }

    it('grants one holder at a time with strictly increasing tokens', async () => {
      const task = await freshTask();
      const a = await store.locks.claimTaskLease(task, { holder: 'a', ttlMs: 1000 });
      expect(a).toEqual({
        status: 'acquired',
        lease: expect.objectContaining({ token: 1, expiresAt: clock.t + 1000 }),
      });
      expect(await store.locks.claimTaskLease(task, { holder: 'b', ttlMs: 1000 })).toEqual({
        status: 'busy',
        heldBy: { holder: 'a', token: 1, expiresAt: clock.t + 1000 },
      });
      await store.locks.releaseTaskLease(task, { token: 1 });
      expect(await store.locks.getTaskLease(task)).toBeNull();
      expect(await store.locks.claimTaskLease(task, { holder: 'b', ttlMs: 1000 })).toMatchObject({
        status: 'acquired',
        lease: { token: 2 },
      });
      const rows = await store.db.selectFrom('task_leases').selectAll().where('task_id', '=', task).execute();
      expect(rows).toEqual([expect.objectContaining({ holder: 'b', token: 2 })]);
    });

    it('lets an expired lease be claimed with a higher token and refuses the old holder', async () => {
      const task = await freshTask();
      const start = clock.t;
      await store.locks.claimTaskLease(task, { holder: 'old', ttlMs: 500 });
      clock.t = start + 499;
      expect(await store.locks.claimTaskLease(task, { holder: 'new', ttlMs: 500 })).toMatchObject({ status: 'busy' });
      expect(await store.locks.renewTaskLease(task, { token: 1, ttlMs: 500 })).toMatchObject({
        token: 1,
        expiresAt: start + 999,
      });
      clock.t = start + 999;
      expect(await store.locks.claimTaskLease(task, { holder: 'new', ttlMs: 500 })).toMatchObject({
        status: 'acquired',
        lease: { token: 2 },
      });
      await expect(store.locks.renewTaskLease(task, { token: 1, ttlMs: 500 })).rejects.toMatchObject({
        code: 'STALE_TASK_LEASE',
        reason: 'superseded',
      });
      await expect(store.locks.releaseTaskLease(task, { token: 1 })).rejects.toMatchObject({
        code: 'STALE_TASK_LEASE',
        current: { token: 2, holder: 'new' },
      });
      expect(await store.locks.getTaskLease(task)).toMatchObject({ holder: 'new', token: 2 });
    });

    it('refuses to renew an expired lease and reports a missing task as NOT_FOUND', async () => {
      const task = await freshTask();
      const start = clock.t;
      await store.locks.claimTaskLease(task, { holder: 'h', ttlMs: 100 });
      clock.t = start + 100;
      await expect(store.locks.renewTaskLease(task, { token: 1, ttlMs: 100 })).rejects.toMatchObject({
        code: 'STALE_TASK_LEASE',
        reason: 'expired',
      });
      await expect(store.locks.claimTaskLease('no-such-task', { holder: 'h', ttlMs: 100 })).rejects.toMatchObject({
        code: 'NOT_FOUND',
        entity: 'task',
      });
    });
  });

  describe('resolveWorkspaceWithLockMode: the decision table through real lookups', () => {
    let company: string;
    let wsTask: string, wsAgent: string, wsPrimary: string, wsOther: string;
    beforeAll(async () => {
      company = (await store.org.createCompany({ name: 'Acme' })).id;
      wsTask = (await store.org.createWorkspace({ companyId: company, name: 'pr-branch' })).id;
      wsAgent = (await store.org.createWorkspace({ companyId: company, name: 'agent-ws' })).id;
      wsPrimary = (await store.org.createWorkspace({ companyId: company, name: 'primary' })).id;
      // The company has a workspace nobody points at: it must never be picked as a fallback.
      wsOther = (await store.org.createWorkspace({ companyId: company, name: 'company-ws' })).id;
    });
    const agentWith = (workspaceId: string | null) =>
      store.org.createAgent({ companyId: company, name: 'a', role: 'CTO', workspaceId });
    const projectWith = (primaryWorkspaceId: string | null) =>
      store.org.createProject({ companyId: company, name: 'p', primaryWorkspaceId });

    it('task.workspaceId set → exclusive on the task workspace (source task)', async () => {
      const agent = await agentWith(wsAgent);
      const project = await projectWith(wsPrimary);
      const task = await store.tasks.createTask({
        companyId: company,
        title: 'review PR',
        workspaceId: wsTask,
        projectId: project.id,
        requiresFilesystem: false,
      });
      const r = await store.scheduler.resolveWorkspaceWithLockMode(task, agent);
      expect(r.lockMode).toBe('exclusive');
      if (r.lockMode === 'exclusive') {
        expect(r.workspace).toMatchObject({ id: wsTask, name: 'pr-branch', companyId: company });
        expect(r.source).toBe('task');
      }
    });

    it('requiresFilesystem = 1 → exclusive on the agent workspace before the project primary', async () => {
      const agent = await agentWith(wsAgent);
      const project = await projectWith(wsPrimary);
      const task = await store.tasks.createTask({
        companyId: company,
        title: 'code',
        projectId: project.id,
        requiresFilesystem: true,
      });
      expect(await store.scheduler.resolveWorkspaceWithLockMode(task, agent)).toMatchObject({
        lockMode: 'exclusive',
        workspace: { id: wsAgent },
        source: 'agent',
      });
    });

    it('requiresFilesystem = 1 and no agent workspace → exclusive on the project primary', async () => {
      const agent = await agentWith(null);
      const project = await projectWith(wsPrimary);
      const task = await store.tasks.createTask({
        companyId: company,
        title: 'code',
        projectId: project.id,
        requiresFilesystem: true,
      });
      expect(await store.scheduler.resolveWorkspaceWithLockMode(task, agent)).toMatchObject({
        lockMode: 'exclusive',
        workspace: { id: wsPrimary },
        source: 'project_primary',
      });
    });

    it('requiresFilesystem = 1 with no workspace anywhere → WorkspaceConfigurationError, no company fallback', async () => {
      const agent = await agentWith(null);
      const project = await projectWith(null);
      const task = await store.tasks.createTask({
        companyId: company,
        title: 'code',
        projectId: project.id,
        requiresFilesystem: true,
      });
      const error = await store.scheduler.resolveWorkspaceWithLockMode(task, agent).catch((e: unknown) => e);
      expect(error).toMatchObject({
        code: 'WORKSPACE_CONFIGURATION',
        taskId: task.id,
        agentId: agent.id,
        projectId: project.id,
        reason: 'no_workspace_bound',
      });
      expect(String((error as Error).message)).not.toContain(wsOther);
    });

    it('everything else → none with a null workspace, although agent and project have workspaces', async () => {
      const agent = await agentWith(wsAgent);
      const project = await projectWith(wsPrimary);
      const task = await store.tasks.createTask({
        companyId: company,
        title: 'strategy memo',
        projectId: project.id,
        requiresFilesystem: false,
      });
      expect(await store.scheduler.resolveWorkspaceWithLockMode(task, agent)).toEqual({
        lockMode: 'none',
        workspace: null,
      });
    });

    it('an explicit workspace that does not exist is a configuration error, not a fallback', async () => {
      const agent = await agentWith(wsAgent);
      const task = await store.tasks.createTask({ companyId: company, title: 'stale', requiresFilesystem: true });
      await expect(
        store.scheduler.resolveWorkspaceWithLockMode({ ...task, workspaceId: 'deleted-ws' }, agent),
      ).rejects.toMatchObject({
        code: 'WORKSPACE_CONFIGURATION',
        reason: 'workspace_missing',
        workspaceId: 'deleted-ws',
        source: 'task',
      });
    });

    it('createTask refuses a missing requiresFilesystem at run time', async () => {
      const input = { companyId: company, title: 'undecided' } as unknown as Parameters<
        Store['tasks']['createTask']
      >[0];
      await expect(store.tasks.createTask(input)).rejects.toMatchObject({
        code: 'INVALID_ARGUMENT',
        field: 'requiresFilesystem',
      });
    });
  });

  describe('dispatchRun: the failure-mode table', () => {
    let company: string;
    let ws: string;
    let n = 0;
    beforeAll(async () => {
      company = (await store.org.createCompany({ name: 'Acme' })).id;
      ws = (await store.org.createWorkspace({ companyId: company, name: 'repo' })).id;
    });
    const runId = () => `run-${++n}`;

    it('cognitive task → dispatched with lockMode none and no lock row, even with a bound agent', async () => {
      const agent = await store.org.createAgent({ companyId: company, name: 'cfo', role: 'CFO', workspaceId: ws });
      const task = await store.tasks.createTask({
        companyId: company,
        title: 'budget',
        assigneeAgentId: agent.id,
        requiresFilesystem: false,
      });
      const before = await countRows(store, 'workspace_locks');
      const r = await store.scheduler.dispatchRun({
        taskId: task.id,
        agentId: agent.id,
        runId: runId(),
        mode: 'heartbeat',
      });
      expect(r).toMatchObject({ outcome: 'dispatched', lockMode: 'none', workspace: null, taskLease: { token: 1 } });
      expect(await countRows(store, 'workspace_locks')).toBe(before);
      expect(await store.locks.getTaskLease(task.id)).toMatchObject({ token: 1 });
    });

    it('coding task + agent workspace bound → exclusive on the agent workspace, lock claimed', async () => {
      const agent = await store.org.createAgent({ companyId: company, name: 'dev', role: 'engineer', workspaceId: ws });
      const task = await store.tasks.createTask({
        companyId: company,
        title: 'fix bug',
        assigneeAgentId: agent.id,
        requiresFilesystem: true,
      });
      const run = runId();
      const r = await store.scheduler.dispatchRun({
        taskId: task.id,
        agentId: agent.id,
        runId: run,
        mode: 'heartbeat',
      });
      expect(r).toMatchObject({ outcome: 'dispatched', lockMode: 'exclusive', workspace: { id: ws }, source: 'agent' });
      expect(await store.locks.getWorkspaceLock(ws)).toMatchObject({ holder: run, runId: run });
      if (r.outcome === 'dispatched' && r.lockMode === 'exclusive')
        await store.locks.releaseWorkspaceLock(ws, { token: r.workspaceLock.token });
    });

    it('coding task + no agent workspace + project primary → exclusive on the project primary, lock claimed', async () => {
      const agent = await store.org.createAgent({ companyId: company, name: 'dev2', role: 'engineer' });
      const project = await store.org.createProject({ companyId: company, name: 'app', primaryWorkspaceId: ws });
      const task = await store.tasks.createTask({
        companyId: company,
        title: 'feature',
        projectId: project.id,
        requiresFilesystem: true,
      });
      const run = runId();
      const r = await store.scheduler.dispatchRun({
        taskId: task.id,
        agentId: agent.id,
        runId: run,
        mode: 'task-runner',
      });
      expect(r).toMatchObject({
        outcome: 'dispatched',
        lockMode: 'exclusive',
        workspace: { id: ws },
        source: 'project_primary',
      });
      expect(await store.locks.getWorkspaceLock(ws)).toMatchObject({ holder: run });
      if (r.outcome === 'dispatched' && r.lockMode === 'exclusive')
        await store.locks.releaseWorkspaceLock(ws, { token: r.workspaceLock.token });
    });

    it('coding task + no workspace anywhere → heartbeat skips (workspace_unresolved) and releases the task lease', async () => {
      const agent = await store.org.createAgent({ companyId: company, name: 'cto', role: 'CTO' });
      const task = await store.tasks.createTask({ companyId: company, title: 'refactor', requiresFilesystem: true });
      const locksBefore = await store.db.selectFrom('workspace_locks').selectAll().execute();
      const r = await store.scheduler.dispatchRun({
        taskId: task.id,
        agentId: agent.id,
        runId: runId(),
        mode: 'heartbeat',
      });
      expect(r).toMatchObject({
        outcome: 'skipped',
        reason: 'workspace_unresolved',
        error: { code: 'WORKSPACE_CONFIGURATION', taskId: task.id, agentId: agent.id },
      });
      // The lease was claimed (token 1) and released: the task is back in the pool.
      expect(
        await store.db.selectFrom('task_leases').select(['holder', 'token']).where('task_id', '=', task.id).execute(),
      ).toEqual([{ holder: null, token: 1 }]);
      expect(await store.db.selectFrom('workspace_locks').selectAll().execute()).toEqual(locksBefore);
      expect(await store.locks.claimTaskLease(task.id, { holder: 'next-beat', ttlMs: 1000 })).toMatchObject({
        status: 'acquired',
        lease: { token: 2 },
      });
    });

    it('coding task + no workspace anywhere → task-runner gets WORKSPACE_UNRESOLVED and the lease is released', async () => {
      const agent = await store.org.createAgent({ companyId: company, name: 'cto2', role: 'CTO' });
      const project = await store.org.createProject({ companyId: company, name: 'no-primary' });
      const task = await store.tasks.createTask({
        companyId: company,
        title: 'migrate',
        projectId: project.id,
        requiresFilesystem: true,
      });
      const run = runId();
      const error = await store.scheduler
        .dispatchRun({ taskId: task.id, agentId: agent.id, runId: run, mode: 'task-runner' })
        .catch((e: unknown) => e);
      expect(error).toMatchObject({
        name: 'WorkspaceUnresolvedError',
        code: 'WORKSPACE_UNRESOLVED',
        taskId: task.id,
        agentId: agent.id,
        projectId: project.id,
        runId: run,
      });
      expect((error as Error).cause).toMatchObject({ code: 'WORKSPACE_CONFIGURATION' });
      expect(await store.locks.getTaskLease(task.id)).toBeNull();
      expect(
        await store.db.selectFrom('task_leases').select('token').where('task_id', '=', task.id).executeTakeFirst(),
      ).toEqual({ token: 1 });
    });

    it('two coding agents racing the same workspace → first claims, second cancelled, and it succeeds on a later beat', async () => {
      const a = await store.org.createAgent({ companyId: company, name: 'a', role: 'engineer', workspaceId: ws });
      const b = await store.org.createAgent({ companyId: company, name: 'b', role: 'engineer', workspaceId: ws });
      const ta = await store.tasks.createTask({ companyId: company, title: 'a', requiresFilesystem: true });
      const tb = await store.tasks.createTask({ companyId: company, title: 'b', requiresFilesystem: true });
      const runA = runId();
      const first = await store.scheduler.dispatchRun({ taskId: ta.id, agentId: a.id, runId: runA, mode: 'heartbeat' });
      const second = await store.scheduler.dispatchRun({
        taskId: tb.id,
        agentId: b.id,
        runId: runId(),
        mode: 'heartbeat',
      });
      expect(first).toMatchObject({ outcome: 'dispatched', lockMode: 'exclusive' });
      expect(second).toMatchObject({
        outcome: 'cancelled',
        reason: 'workspace_busy',
        workspace: { id: ws },
        heldBy: { runId: runA },
      });
      expect(await store.locks.getTaskLease(tb.id)).toBeNull(); // the cancelled run gave its task back
      if (first.outcome !== 'dispatched' || first.lockMode !== 'exclusive') throw new Error('unreachable');
      await store.locks.releaseWorkspaceLock(ws, { token: first.workspaceLock.token });
      const retry = await store.scheduler.dispatchRun({
        taskId: tb.id,
        agentId: b.id,
        runId: runId(),
        mode: 'heartbeat',
      });
      expect(retry).toMatchObject({
        outcome: 'dispatched',
        lockMode: 'exclusive',
        workspaceLock: { token: first.workspaceLock.token + 1 },
      });
    });

    it('a run that crashed holding the workspace blocks the next beat only until its TTL, then the next run gets a higher token', async () => {
      const timed = store;
      const co = (await timed.org.createCompany({ name: 'Acme' })).id;
      const repo = (await timed.org.createWorkspace({ companyId: co, name: 'repo' })).id;
      const dev = await timed.org.createAgent({ companyId: co, name: 'dev', role: 'engineer', workspaceId: repo });
      const crashedTask = await timed.tasks.createTask({ companyId: co, title: 'crashes', requiresFilesystem: true });
      const nextTask = await timed.tasks.createTask({ companyId: co, title: 'next', requiresFilesystem: true });
      const start = clock.t;
      const crashed = await timed.scheduler.dispatchRun({
        taskId: crashedTask.id,
        agentId: dev.id,
        runId: 'crashed',
        mode: 'heartbeat',
      });
      expect(crashed).toMatchObject({
        outcome: 'dispatched',
        lockMode: 'exclusive',
        taskLease: { expiresAt: start + DEFAULT_DISPATCH_TTL_MS },
        workspaceLock: { token: 1, expiresAt: start + DEFAULT_DISPATCH_TTL_MS },
      });
      clock.t = start + DEFAULT_DISPATCH_TTL_MS - 1;
      expect(
        await timed.scheduler.dispatchRun({ taskId: nextTask.id, agentId: dev.id, runId: 'beat-1', mode: 'heartbeat' }),
      ).toMatchObject({
        outcome: 'cancelled',
        heldBy: { runId: 'crashed' },
      });
      clock.t = start + DEFAULT_DISPATCH_TTL_MS;
      expect(
        await timed.scheduler.dispatchRun({
          taskId: nextTask.id,
          agentId: dev.id,
          runId: 'beat-2',
          mode: 'heartbeat',
          ttlMs: 1000,
        }),
      ).toMatchObject({
        outcome: 'dispatched',
        workspaceLock: { token: 2, expiresAt: clock.t + 1000 },
        taskLease: { token: 2 }, // claimed by beat-1 (then released) and now by beat-2
      });
      // The crashed run's task lease has expired too: its task goes back to the pool.
      expect(
        await timed.scheduler.dispatchRun({
          taskId: crashedTask.id,
          agentId: dev.id,
          runId: 'beat-3',
          mode: 'heartbeat',
        }),
      ).toMatchObject({
        outcome: 'cancelled',
        heldBy: { runId: 'beat-2' },
      });
      expect(
        await timed.db.selectFrom('task_leases').select(['task_id', 'holder', 'token']).orderBy('token').execute(),
      ).toEqual(
        expect.arrayContaining([
          { task_id: crashedTask.id, holder: null, token: 2 },
          { task_id: nextTask.id, holder: 'beat-2', token: 2 },
        ]),
      );
    });

    it('a task already leased by another run is skipped without touching the workspace lock', async () => {
      const agent = await store.org.createAgent({ companyId: company, name: 'c', role: 'engineer', workspaceId: ws });
      const task = await store.tasks.createTask({ companyId: company, title: 'taken', requiresFilesystem: true });
      await store.locks.claimTaskLease(task.id, { holder: 'other-run', ttlMs: 60_000 });
      const lockBefore = await store.db
        .selectFrom('workspace_locks')
        .selectAll()
        .where('workspace_id', '=', ws)
        .execute();
      const r = await store.scheduler.dispatchRun({
        taskId: task.id,
        agentId: agent.id,
        runId: runId(),
        mode: 'heartbeat',
      });
      expect(r).toMatchObject({ outcome: 'skipped', reason: 'task_leased', heldBy: { holder: 'other-run' } });
      expect(await store.db.selectFrom('workspace_locks').selectAll().where('workspace_id', '=', ws).execute()).toEqual(
        lockBefore,
      );
    });

    it('rejects an unknown mode and reports a missing agent after giving the lease back', async () => {
      const task = await store.tasks.createTask({ companyId: company, title: 'x', requiresFilesystem: false });
      await expect(
        store.scheduler.dispatchRun({ taskId: task.id, agentId: 'a', runId: runId(), mode: 'cron' as 'heartbeat' }),
      ).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', field: 'mode' });
      await expect(
        store.scheduler.dispatchRun({ taskId: task.id, agentId: 'ghost', runId: runId(), mode: 'heartbeat' }),
      ).rejects.toMatchObject({
        code: 'NOT_FOUND',
        entity: 'agent',
      });
      expect(await store.locks.getTaskLease(task.id)).toBeNull();
    });
  });

  // One database and one set of 8 contender processes for every race below: starting processes
  // is the slow part on a small machine. Each test works on its own company and workspace.
  describe('races between processes', () => {
    let store: Store;
    let contenders: Contenders<typeof OPS>;
    beforeAll(async () => {
      const url = await fx.freshUrl();
      store = await fx.open(url);
      await store.migrate();
      contenders = await Contenders.start(8, { url, ops: OPS, storeOptions: { poolSize: 2 } });
    });
    afterAll(async () => {
      await contenders?.close();
    });
    /** Lock rows on the workspaces of one company. */
    const lockRowsOf = (companyId: string) =>
      store.db
        .selectFrom('workspace_locks as l')
        .innerJoin('workspaces as w', 'w.id', 'l.workspace_id')
        .select(['l.workspace_id', 'l.holder', 'l.run_id', 'l.token'])
        .where('w.company_id', '=', companyId)
        .execute();

    it('8 cognitive runs of one company dispatch at once: all 8 run and no workspace lock row is written', async () => {
      const company = (await store.org.createCompany({ name: 'Thinkers' })).id;
      // Every agent is bound to the one company workspace: the old resolver serialised them all on it.
      const ws = (await store.org.createWorkspace({ companyId: company, name: 'only' })).id;
      const project = await store.org.createProject({ companyId: company, name: 'plan', primaryWorkspaceId: ws });
      const agents: Agent[] = [];
      for (const role of ['CEO', 'CFO', 'CMO', 'COO', 'CTO', 'PM', 'Analyst', 'Writer']) {
        agents.push(await store.org.createAgent({ companyId: company, name: role, role, workspaceId: ws }));
      }
      for (let round = 0; round < 5; round++) {
        const tasks: Task[] = [];
        for (let i = 0; i < 8; i++) {
          tasks.push(
            await store.tasks.createTask({
              companyId: company,
              title: `memo ${round}.${i}`,
              projectId: project.id,
              assigneeAgentId: agents[i]!.id,
              requiresFilesystem: false,
            }),
          );
        }
        const outcomes = await contenders.race('dispatch', (i) => ({
          taskId: tasks[i]!.id,
          agentId: agents[i]!.id,
          runId: `cog-${round}-${i}`,
        }));
        for (const o of outcomes)
          expect(o, JSON.stringify(o)).toMatchObject({
            ok: true,
            value: { outcome: 'dispatched', lockMode: 'none', taskLeaseToken: 1 },
          });
        expect(await lockRowsOf(company)).toEqual([]);
        const leases = await store.db
          .selectFrom('task_leases')
          .select(['task_id', 'holder'])
          .where(
            'task_id',
            'in',
            tasks.map((t) => t.id),
          )
          .orderBy('holder')
          .execute();
        expect(leases.map((l) => l.holder)).toEqual(tasks.map((_, i) => `cog-${round}-${i}`).sort());
      }
      // Mixed: cognitive runs do not even take part in the race for the workspace.
      for (let round = 0; round < 3; round++) {
        const tasks: Task[] = [];
        for (let i = 0; i < 8; i++) {
          tasks.push(
            await store.tasks.createTask({
              companyId: company,
              title: `mixed ${round}.${i}`,
              requiresFilesystem: i % 2 === 0,
            }),
          );
        }
        const outcomes = await contenders.race('dispatch', (i) => ({
          taskId: tasks[i]!.id,
          agentId: agents[i]!.id,
          runId: `mix-${round}-${i}`,
        }));
        const values = outcomes.map((o) => (o.ok ? o.value : o.error));
        for (let i = 1; i < 8; i += 2) expect(values[i]).toMatchObject({ outcome: 'dispatched', lockMode: 'none' });
        const coding = values.filter((_, i) => i % 2 === 0);
        expect(
          coding.filter((v) => (v as DispatchSummary).outcome === 'dispatched'),
          JSON.stringify(values),
        ).toHaveLength(1);
        expect(coding.filter((v) => (v as DispatchSummary).outcome === 'cancelled')).toHaveLength(3);
        const lock = await lockRowsOf(company);
        expect(lock).toEqual([expect.objectContaining({ workspace_id: ws, token: round + 1 })]);
        await store.locks.releaseWorkspaceLock(ws, { token: lock[0]!.token });
      }
    });

    it('8 coding runs on one workspace at once: exactly one claims and 7 are cancelled, 20 rounds', async () => {
      const company = (await store.org.createCompany({ name: 'Coders' })).id;
      const ws = (await store.org.createWorkspace({ companyId: company, name: 'monorepo' })).id;
      const project = await store.org.createProject({ companyId: company, name: 'app', primaryWorkspaceId: ws });
      const bound: Agent[] = [];
      const unbound: Agent[] = [];
      for (let i = 0; i < 8; i++) {
        bound.push(
          await store.org.createAgent({ companyId: company, name: `bound-${i}`, role: 'engineer', workspaceId: ws }),
        );
        unbound.push(await store.org.createAgent({ companyId: company, name: `unbound-${i}`, role: 'engineer' }));
      }
      const sources = ['agent', 'project_primary', 'task'] as const;
      const allTasks: string[] = [];
      for (let round = 0; round < 20; round++) {
        const source = sources[round % 3]!;
        const agents = source === 'agent' ? bound : unbound;
        const tasks: Task[] = [];
        for (let i = 0; i < 8; i++) {
          tasks.push(
            await store.tasks.createTask({
              companyId: company,
              title: `code ${round}.${i}`,
              projectId: source === 'project_primary' ? project.id : null,
              workspaceId: source === 'task' ? ws : null,
              requiresFilesystem: source !== 'task', // an explicit workspace wins without the flag
            }),
          );
        }
        allTasks.push(...tasks.map((t) => t.id));
        const outcomes = await contenders.race('dispatch', (i) => ({
          taskId: tasks[i]!.id,
          agentId: agents[i]!.id,
          runId: `code-${round}-${i}`,
        }));
        for (const o of outcomes) expect(o.ok, JSON.stringify(o)).toBe(true);
        const values = outcomes.map((o) => (o as Extract<typeof o, { ok: true }>).value);
        const winners = values.flatMap((v, i) => (v.outcome === 'dispatched' ? [{ v, i }] : []));
        const cancelled = values.filter((v) => v.outcome === 'cancelled');
        expect(winners, JSON.stringify(values)).toHaveLength(1);
        expect(cancelled).toHaveLength(7);
        const { v: win, i: winner } = winners[0]!;
        const winnerRun = `code-${round}-${winner}`;
        expect(win).toMatchObject({ lockMode: 'exclusive', workspaceId: ws, source, lockToken: round + 1 });
        for (const c of cancelled)
          expect(c).toMatchObject({
            reason: 'workspace_busy',
            workspaceId: ws,
            heldByRunId: winnerRun,
            heldByToken: round + 1,
          });

        // Invariants in SQL: one lock row, held by the winner with this round's token (tokens rise by
        // exactly one per grant); only the winner's task lease is held, the losers' were released.
        expect(await lockRowsOf(company)).toEqual([
          { workspace_id: ws, holder: winnerRun, run_id: winnerRun, token: round + 1 },
        ]);
        const leases = await store.db
          .selectFrom('task_leases')
          .select(['task_id', 'holder', 'token'])
          .where(
            'task_id',
            'in',
            tasks.map((t) => t.id),
          )
          .execute();
        expect(leases).toHaveLength(8);
        expect(leases.filter((l) => l.holder !== null)).toEqual([
          { task_id: tasks[winner]!.id, holder: winnerRun, token: 1 },
        ]);
        expect(leases.every((l) => l.token === 1)).toBe(true);

        // The run finishes: the next round races a free workspace again.
        await store.locks.releaseWorkspaceLock(ws, { token: round + 1 });
        await store.locks.releaseTaskLease(tasks[winner]!.id, { token: 1 });
      }
      const held = await store.db
        .selectFrom('task_leases')
        .select('task_id')
        .where('task_id', 'in', allTasks)
        .where('holder', 'is not', null)
        .execute();
      expect(held).toEqual([]);
    });

    it('claim/renew/release churn from 8 processes grants every token exactly once, in sequence', async () => {
      const company = (await store.org.createCompany({ name: 'Churners' })).id;
      const ws = (await store.org.createWorkspace({ companyId: company, name: 'hot' })).id;
      const task = await store.tasks.createTask({ companyId: company, title: 'hot task', requiresFilesystem: true });
      const outcomes = await contenders.race('churn', () => ({
        workspaceId: ws,
        taskId: task.id,
        iterations: 6,
      }));
      for (const o of outcomes) expect(o.ok, JSON.stringify(o)).toBe(true);
      const results = outcomes.map((o) => (o as Extract<typeof o, { ok: true }>).value);
      const lockTokens = results.flatMap((r) => r.lockTokens).sort((a, b) => a - b);
      const leaseTokens = results.flatMap((r) => r.leaseTokens).sort((a, b) => a - b);
      expect(lockTokens.length).toBeGreaterThan(0);
      // No token granted twice, none skipped: every grant bumped the row exactly once.
      expect(lockTokens).toEqual(lockTokens.map((_, i) => i + 1));
      expect(leaseTokens).toEqual(leaseTokens.map((_, i) => i + 1));
      expect(results.reduce((s, r) => s + r.staleRefusals, 0)).toBe(lockTokens.length);
      expect(await lockRowsOf(company)).toEqual([
        { workspace_id: ws, holder: null, run_id: null, token: lockTokens.length },
      ]);
      expect(
        await store.db.selectFrom('task_leases').select(['holder', 'token']).where('task_id', '=', task.id).execute(),
      ).toEqual([{ holder: null, token: leaseTokens.length }]);
    });

    // Kills contender 6, so it runs last.
    it('a SIGKILLed holder: after its TTL the next claim succeeds with a higher token and its release is refused', async () => {
      const company = (await store.org.createCompany({ name: 'Doomed' })).id;
      const ws = (await store.org.createWorkspace({ companyId: company, name: 'repo' })).id;
      const task = await store.tasks.createTask({ companyId: company, title: 'doomed', requiresFilesystem: true });
      // Earlier grants, so the dead holder's token is not simply 1.
      for (let i = 0; i < 3; i++) {
        const c = await store.locks.claimWorkspaceLock(ws, { holder: 'warmup', runId: 'warmup', ttlMs: 1000 });
        if (c.status === 'acquired') await store.locks.releaseWorkspaceLock(ws, { token: c.lease.token });
      }
      const hanging = contenders.start(6, 'claimAndHang', {
        workspaceId: ws,
        taskId: task.id,
        holder: 'doomed',
        ttlMs: 300,
      });
      hanging.catch(() => {}); // rejects with ContenderExitedError once killed
      await contenders.waitForSignal(6, 'claimed');
      const dead = await store.db
        .selectFrom('workspace_locks')
        .select(['holder', 'token'])
        .where('workspace_id', '=', ws)
        .executeTakeFirstOrThrow();
      const deadLease = await store.db
        .selectFrom('task_leases')
        .select(['holder', 'token'])
        .where('task_id', '=', task.id)
        .executeTakeFirstOrThrow();
      expect(dead).toEqual({ holder: 'doomed', token: 4 });
      expect(deadLease).toEqual({ holder: 'doomed', token: 1 });
      await contenders.kill(6);
      await expect(hanging).rejects.toThrow(/exited/);

      // Polls until the dead holder's 300 ms TTL has run out (bounded by attempts, not asserted on time).
      const next = await contenders.run(7, 'claimWhenFree', {
        workspaceId: ws,
        taskId: task.id,
        holder: 'successor',
        maxAttempts: 2000,
      });
      expect(next, JSON.stringify(next)).toMatchObject({
        ok: true,
        value: { lockToken: dead.token + 1, leaseToken: deadLease.token + 1 },
      });

      // The dead holder's release and renew (replayed with its token) are refused.
      await expect(store.locks.releaseWorkspaceLock(ws, { token: dead.token })).rejects.toMatchObject({
        code: 'STALE_WORKSPACE_LOCK',
        reason: 'superseded',
        current: { token: dead.token + 1, holder: 'successor' },
      });
      await expect(store.locks.renewWorkspaceLock(ws, { token: dead.token, ttlMs: 1000 })).rejects.toMatchObject({
        code: 'STALE_WORKSPACE_LOCK',
      });
      await expect(store.locks.releaseTaskLease(task.id, { token: deadLease.token })).rejects.toMatchObject({
        code: 'STALE_TASK_LEASE',
        reason: 'superseded',
      });
      expect(await lockRowsOf(company)).toEqual([
        { workspace_id: ws, holder: 'successor', run_id: 'successor-run', token: dead.token + 1 },
      ]);
      expect(
        await store.db.selectFrom('task_leases').select(['holder', 'token']).where('task_id', '=', task.id).execute(),
      ).toEqual([{ holder: 'successor', token: deadLease.token + 1 }]);
    });
  });

  describe('v52 backfill of requires_filesystem', () => {
    it('matches the hand-computed expectation for awkward roles, departments, statuses and leases', async () => {
      const rows = await runBackfillFixture(fx);
      expect(rows).toEqual(BACKFILL_EXPECTED);
    });

    it('gives the same rows in tiny keyset batches and one-role chunks, reporting progress per batch', async () => {
      const clock = new ManualClock(BACKFILL_NOW);
      const store = await fx.freshStore({ clock, to: 8 });
      await insertBackfillFixture(store);
      const events: MigrationEvent[] = [];
      await store.migrate({ to: 52, onEvent: (e) => events.push(e) });
      const expectedOnes = Object.values(BACKFILL_EXPECTED).filter((v) => v === 1).length;
      // Through the migrator, progress reaches the caller (the CLI prints it).
      expect(events).toContainEqual({
        type: 'progress',
        version: 52,
        message: `0052: backfill complete, ${expectedOnes} tasks require the filesystem`,
      });
      await sql`update ${tbl(store.db, 'tasks')} set requires_filesystem = 0`.execute(store.db);
      const messages: string[] = [];
      const flagged = await backfillRequiresFilesystem(store.db, {
        now: BACKFILL_NOW,
        progress: (m) => messages.push(m),
        batchSize: 2,
        roleChunkSize: 1,
      });
      expect(await readRequiresFilesystem(store)).toEqual(BACKFILL_EXPECTED);
      expect(flagged).toBe(Object.values(BACKFILL_EXPECTED).filter((v) => v === 1).length);
      const taskCount = Object.keys(BACKFILL_EXPECTED).length;
      expect(messages).toHaveLength(Math.floor(taskCount / 2) + 1);
      expect(messages.at(-1)).toBe(`0052: backfill complete, ${flagged} tasks require the filesystem`);
    });
  });
}

// ---------------------------------------------------------------------------------------------
// The backfill fixture. `now` is the migration's clock; a lease is live iff holder is set and
// expires_at > now.

export const BACKFILL_NOW = 5_000_000;

const AGENTS: { id: string; role: string | null; department: string | null }[] = [
  { id: 'ag-director', role: 'Director', department: 'operations' }, // "cto" inside Director
  { id: 'ag-cto', role: 'CTO', department: null },
  { id: 'ag-sre', role: 'sre', department: null },
  { id: 'ag-sr-eng', role: 'Sr. Engineer', department: null },
  { id: 'ag-actor', role: 'Actor', department: null }, // "cto" inside Actor
  { id: 'ag-devops', role: 'DEVOPS', department: null },
  { id: 'ag-dev-lower', role: 'developer', department: null },
  { id: 'ag-dev-upper', role: 'DEVELOPER', department: null },
  { id: 'ag-percent', role: '%engineer%', department: null },
  { id: 'ag-underscore', role: 'en_gineer', department: null }, // not a LIKE pattern: no match
  { id: 'ag-pm-eng', role: 'Product Manager', department: 'engineering' }, // department exactly engineering
  { id: 'ag-pm-Eng', role: 'Product Manager', department: 'Engineering' }, // wrong case: no match
  { id: 'ag-pm-eng-space', role: 'Product Manager', department: 'engineering ' }, // trailing space: no match
  { id: 'ag-null-role', role: null, department: null },
  { id: 'ag-null-role-eng', role: null, department: 'engineering' },
  { id: 'ag-ceo', role: 'Chief Executive Officer', department: 'executive' },
  { id: 'ag-dev', role: 'Dev', department: null },
  { id: 'ag-treasurer', role: 'Treasurer', department: 'finance' },
  { id: 'ag-empty', role: '', department: '' },
  { id: 'ag-fullwidth', role: 'ＣＴＯ', department: null },
];

type Lease = { holder: string | null; expiresAt: number | null };
const live: Lease = { holder: 'run-x', expiresAt: BACKFILL_NOW + 1 };

const TASKS: { id: string; status: string; assignee: string | null; lease?: Lease; expected: 0 | 1 }[] = [
  // todo/backlog: the assignee's role or department decides.
  { id: 'T-01', status: 'todo', assignee: 'ag-director', expected: 1 },
  { id: 'T-02', status: 'backlog', assignee: 'ag-cto', expected: 1 },
  { id: 'T-03', status: 'todo', assignee: 'ag-sre', expected: 1 },
  { id: 'T-04', status: 'todo', assignee: 'ag-sr-eng', expected: 1 },
  { id: 'T-05', status: 'backlog', assignee: 'ag-actor', expected: 1 },
  { id: 'T-06', status: 'todo', assignee: 'ag-devops', expected: 1 },
  { id: 'T-07', status: 'todo', assignee: 'ag-dev-lower', expected: 1 },
  { id: 'T-08', status: 'todo', assignee: 'ag-dev-upper', expected: 1 },
  { id: 'T-09', status: 'todo', assignee: 'ag-percent', expected: 1 },
  { id: 'T-10', status: 'todo', assignee: 'ag-underscore', expected: 0 },
  { id: 'T-11', status: 'todo', assignee: 'ag-pm-eng', expected: 1 },
  { id: 'T-12', status: 'todo', assignee: 'ag-pm-Eng', expected: 0 },
  { id: 'T-13', status: 'todo', assignee: 'ag-pm-eng-space', expected: 0 },
  { id: 'T-14', status: 'todo', assignee: 'ag-null-role', expected: 0 },
  { id: 'T-15', status: 'backlog', assignee: 'ag-null-role-eng', expected: 1 },
  { id: 'T-16', status: 'todo', assignee: 'ag-ceo', expected: 0 },
  { id: 'T-17', status: 'todo', assignee: 'ag-dev', expected: 0 },
  { id: 'T-18', status: 'todo', assignee: 'ag-treasurer', expected: 0 },
  { id: 'T-19', status: 'todo', assignee: 'ag-empty', expected: 0 },
  { id: 'T-20', status: 'todo', assignee: 'ag-fullwidth', expected: 0 },
  { id: 'T-21', status: 'todo', assignee: null, expected: 0 },
  { id: 't-22', status: 'backlog', assignee: null, expected: 0 },
  // Other statuses: an engineer's task is not evidence unless it is todo/backlog (or in flight with a lease).
  { id: 't-23', status: 'ready', assignee: 'ag-cto', expected: 0 },
  { id: 't-24', status: 'blocked', assignee: 'ag-cto', expected: 0 },
  { id: 't-25', status: 'done', assignee: 'ag-cto', lease: live, expected: 0 },
  { id: 't-26', status: 'cancelled', assignee: 'ag-sre', expected: 0 },
  { id: 't-27', status: 'failed', assignee: 'ag-pm-eng', expected: 0 },
  // In flight: only a live lease counts, whoever the assignee is.
  { id: 'a-28', status: 'in_progress', assignee: 'ag-ceo', lease: live, expected: 1 },
  { id: 'a-29', status: 'dispatched', assignee: null, lease: live, expected: 1 },
  { id: 'a-30', status: 'in_progress', assignee: 'ag-cto', expected: 0 }, // no lease row
  {
    id: 'a-31',
    status: 'in_progress',
    assignee: 'ag-cto',
    lease: { holder: 'run-y', expiresAt: BACKFILL_NOW },
    expected: 0,
  }, // expires exactly now
  {
    id: 'a-32',
    status: 'dispatched',
    assignee: 'ag-ceo',
    lease: { holder: 'run-y', expiresAt: BACKFILL_NOW - 60_000 },
    expected: 0,
  },
  {
    id: 'a-33',
    status: 'in_progress',
    assignee: 'ag-ceo',
    lease: { holder: null, expiresAt: BACKFILL_NOW + 60_000 },
    expected: 0,
  }, // released
  { id: 'a-34', status: 'in_progress', assignee: 'ag-ceo', lease: { holder: 'run-z', expiresAt: null }, expected: 0 },
  { id: 'a-35', status: 'todo', assignee: 'ag-ceo', lease: live, expected: 0 }, // a lease is evidence only in flight
  {
    id: 'a-36',
    status: 'todo',
    assignee: 'ag-cto',
    lease: { holder: 'run-y', expiresAt: BACKFILL_NOW - 1 },
    expected: 1,
  }, // role still counts
];

export const BACKFILL_EXPECTED: Record<string, 0 | 1> = Object.fromEntries(TASKS.map((t) => [t.id, t.expected]));

/** Inserts the fixture into a store at version 0008 (before `requires_filesystem` exists). */
export async function insertBackfillFixture(store: Store): Promise<void> {
  const db = store.db;
  await db.insertInto('companies').values({ id: 'co', name: 'Acme', created_at: 0 }).execute();
  for (const a of AGENTS) {
    await db
      .insertInto('agents')
      .values({
        id: a.id,
        company_id: 'co',
        name: a.id,
        role: a.role,
        department: a.department,
        workspace_id: null,
        created_at: 0,
      })
      .execute();
  }
  for (const t of TASKS) {
    await sql`insert into ${tbl(db, 'tasks')} (id, company_id, assignee_agent_id, title, status, created_at, updated_at)
      values (${t.id}, 'co', ${t.assignee}, ${t.id}, ${t.status}, 0, 0)`.execute(db);
    if (t.lease) {
      await sql`insert into ${tbl(db, 'task_leases')} (task_id, holder, token, acquired_at, expires_at)
        values (${t.id}, ${t.lease.holder}, 1, 0, ${t.lease.expiresAt})`.execute(db);
    }
  }
}

export async function readRequiresFilesystem(store: Store): Promise<Record<string, number>> {
  const rows = await store.db.selectFrom('tasks').select(['id', 'requires_filesystem']).execute();
  return Object.fromEntries(rows.map((r) => [r.id, Number(r.requires_filesystem)]));
}

/** Fresh database at 0008, the fixture, then the real migration to 0052 at `BACKFILL_NOW`. */
export async function runBackfillFixture(fx: DialectFixture): Promise<Record<string, number>> {
  const store = await fx.freshStore({ clock: new ManualClock(BACKFILL_NOW), to: 8 });
  await insertBackfillFixture(store);
  const result = await store.migrate({ to: 52 });
  expect(result.applied).toEqual([52]);
  return readRequiresFilesystem(store);
}
