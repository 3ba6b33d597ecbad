import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdirSync, mkdtempSync, existsSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import {
  CleanupAlreadyCompletedError,
  CleanupBarrierError,
  CleanupClaimLostError,
  CleanupInProgressError,
  InvalidArgumentError,
  Migrator,
  MIGRATIONS,
  NotFoundError,
  OwnershipChangedError,
  ParentChangedError,
  StaleOwnershipError,
  type Clock,
  type CleanupAdmission,
  type CleanupClaim,
  type DetachResult,
  type OwnershipTransfer,
  type Store,
} from '../../src/index.js';
import type { DialectFixture } from '../support/fixtures.js';
import { ContenderExitedError, Contenders, partition, type Outcome } from '../support/race.js';
import { ops as OPS, type PairCall } from './ownership.ops.js';
import { tbl } from '../support/schema.js';

const HOUR = 3_600_000;

class FakeClock implements Clock {
  constructor(public t = Date.now()) {}
  now = () => this.t;
  advance(ms: number) {
    this.t += ms;
  }
}

interface Family {
  companyId: string;
  parentId: string;
  childId: string;
  groupId: string;
  /** The shared workspace's environment: in the group, owned by the parent. */
  envId: string;
}

let seq = 0;
/** A parent stewarding a shared group with one environment, and one shared child in it. */
async function seedFamily(store: Store, rootPath?: string): Promise<Family> {
  const n = ++seq;
  const company = await store.org.createCompany({ name: `c${n}` });
  const parent = await store.tasks.createTask({
    companyId: company.id,
    title: `parent ${n}`,
    requiresFilesystem: true,
  });
  const group = await store.ownership.createWorkspaceGroup({ stewardTaskId: parent.id });
  const env = await store.ownership.createEnvironment({
    ownerTaskId: parent.id,
    rootPath: rootPath ?? `/ws/${parent.id}`,
    groupId: group.id,
  });
  const child = await store.tasks.createTask({
    companyId: company.id,
    title: `child ${n}`,
    requiresFilesystem: true,
    parentId: parent.id,
    workspaceMode: 'shared',
  });
  return { companyId: company.id, parentId: parent.id, childId: child.id, groupId: group.id, envId: env.id };
}

async function newTask(store: Store, companyId: string, title = 'task') {
  return (await store.tasks.createTask({ companyId, title, requiresFilesystem: true })).id;
}

async function envRow(store: Store, id: string) {
  return store.db.selectFrom('task_environments').selectAll().where('id', '=', id).executeTakeFirstOrThrow();
}

async function groupRow(store: Store, id: string) {
  return store.db.selectFrom('workspace_groups').selectAll().where('id', '=', id).executeTakeFirstOrThrow();
}

async function rolesOf(store: Store, groupId: string) {
  const rows = await store.db
    .selectFrom('workspace_group_members')
    .select(['task_id', 'role'])
    .where('group_id', '=', groupId)
    .execute();
  return Object.fromEntries(rows.map((r) => [r.task_id, r.role]));
}

async function snapshotRow(store: Store, id: string) {
  return store.db.selectFrom('cleanup_snapshots').selectAll().where('id', '=', id).executeTakeFirstOrThrow();
}

/**
 * The schema-wide invariants of SPEC §6, as SQL that must return no rows.
 */
async function assertOwnershipInvariants(store: Store) {
  const checks: Record<string, Promise<{ rows: unknown[] }>> = {
    'an active group without exactly one steward member, or whose steward member is not its steward': sql`
      select g.id from ${tbl(store.db, 'workspace_groups')} g
       where g.status = 'active'
         and ((select count(*) from ${tbl(store.db, 'workspace_group_members')} m where m.group_id = g.id and m.role = 'steward') <> 1
              or not exists (select 1 from ${tbl(store.db, 'workspace_group_members')} m
                              where m.group_id = g.id and m.task_id = g.steward_task_id and m.role = 'steward'))`.execute(
      store.db,
    ),
    'a shared child task without a group membership': sql`
      select t.id from ${tbl(store.db, 'tasks')} t
       where t.workspace_mode = 'shared' and t.parent_id is not null
         and not exists (select 1 from ${tbl(store.db, 'workspace_group_members')} m where m.task_id = t.id)`.execute(
      store.db,
    ),
    'a claim on an environment for another generation': sql`
      select id from ${tbl(store.db, 'task_environments')}
       where cleanup_claimed_by is not null and cleanup_claim_generation <> ownership_generation`.execute(store.db),
    'a claim on a group for another generation': sql`
      select id from ${tbl(store.db, 'workspace_groups')}
       where cleanup_claimed_by is not null and cleanup_claim_generation <> ownership_generation`.execute(store.db),
    'a generation below 1': sql`
      select id from ${tbl(store.db, 'task_environments')} where ownership_generation < 1
      union all select id from ${tbl(store.db, 'workspace_groups')} where ownership_generation < 1`.execute(store.db),
    'a completed environment snapshot whose environment is not removed at that owner and generation': sql`
      select s.id from ${tbl(store.db, 'cleanup_snapshots')} s join ${tbl(store.db, 'task_environments')} e on e.id = s.resource_id
       where s.resource_kind = 'environment' and s.state = 'completed'
         and (e.status <> 'removed' or e.task_id <> s.owner_task_id or e.ownership_generation <> s.ownership_generation)`.execute(
      store.db,
    ),
    'a removed environment without a completed snapshot of its owner and generation': sql`
      select e.id from ${tbl(store.db, 'task_environments')} e
       where e.status = 'removed'
         and not exists (select 1 from ${tbl(store.db, 'cleanup_snapshots')} s
                          where s.resource_kind = 'environment' and s.resource_id = e.id and s.state = 'completed'
                            and s.owner_task_id = e.task_id and s.ownership_generation = e.ownership_generation)`.execute(
      store.db,
    ),
    // (A claimed snapshot whose resource moved on is legal until someone touches it: then it turns stale.)
    'a claimed snapshot whose unmoved resource does not carry its claim': sql`
      select s.id from ${tbl(store.db, 'cleanup_snapshots')} s join ${tbl(store.db, 'task_environments')} e on e.id = s.resource_id
       where s.resource_kind = 'environment' and s.state = 'claimed'
         and e.status = 'active' and e.ownership_generation = s.ownership_generation and e.task_id = s.owner_task_id
         and (e.cleanup_claimed_by is null or e.cleanup_claimed_by <> s.claimed_by)`.execute(store.db),
  };
  for (const [what, query] of Object.entries(checks)) {
    expect((await query).rows, what).toEqual([]);
  }
}

function errorOf<T>(o: Outcome<T>) {
  if (o.ok) throw new Error(`expected a failure, got ${JSON.stringify(o.value)}`);
  return o.error;
}

export function defineOwnershipSuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  beforeAll(() => {
    fx = makeFixture();
  });
  afterAll(() => fx.cleanup());

  describe('ownership transfer (compare-and-swap)', () => {
    let store: Store;
    let clock: FakeClock;
    beforeAll(async () => {
      clock = new FakeClock();
      store = await fx.freshStore({ clock });
    });
    afterAll(() => assertOwnershipInvariants(store));

    it('starts every environment and group at generation 1 and bumps by exactly one per transfer', async () => {
      const f = await seedFamily(store);
      const x = await newTask(store, f.companyId);
      expect((await store.ownership.getEnvironment(f.envId))!.generation).toBe(1);
      expect((await store.ownership.getWorkspaceGroup(f.groupId))!.generation).toBe(1);
      const moved = await store.ownership.transferEnvironmentOwnership({
        environmentId: f.envId,
        expectedOwnerTaskId: f.parentId,
        expectedGeneration: 1,
        newOwnerTaskId: x,
      });
      expect(moved).toEqual({
        resourceKind: 'environment',
        resourceId: f.envId,
        ownerTaskId: x,
        generation: 2,
        changed: true,
      });
      const back = await store.ownership.transferEnvironmentOwnership({
        environmentId: f.envId,
        expectedOwnerTaskId: x,
        expectedGeneration: 2,
        newOwnerTaskId: f.parentId,
      });
      expect(back.generation).toBe(3);
      expect(await envRow(store, f.envId)).toMatchObject({ task_id: f.parentId, ownership_generation: 3 });
    });

    it('refuses a stale expectation with the current owner and generation, changing nothing', async () => {
      const f = await seedFamily(store);
      const x = await newTask(store, f.companyId);
      const y = await newTask(store, f.companyId);
      await store.ownership.transferEnvironmentOwnership({
        environmentId: f.envId,
        expectedOwnerTaskId: f.parentId,
        expectedGeneration: 1,
        newOwnerTaskId: x,
      });
      const before = await envRow(store, f.envId);
      const error = await store.ownership
        .transferEnvironmentOwnership({
          environmentId: f.envId,
          expectedOwnerTaskId: f.parentId,
          expectedGeneration: 1,
          newOwnerTaskId: y,
        })
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(OwnershipChangedError);
      expect(error).toMatchObject({
        code: 'OWNERSHIP_CHANGED',
        currentOwnerTaskId: x,
        currentGeneration: 2,
        expectedGeneration: 1,
      });
      // Right owner, wrong generation is just as stale.
      await expect(
        store.ownership.transferEnvironmentOwnership({
          environmentId: f.envId,
          expectedOwnerTaskId: x,
          expectedGeneration: 1,
          newOwnerTaskId: y,
        }),
      ).rejects.toBeInstanceOf(OwnershipChangedError);
      expect(await envRow(store, f.envId)).toEqual(before);
    });

    it('treats a transfer to the current owner as a no-op without a bump', async () => {
      const f = await seedFamily(store);
      const same = await store.ownership.transferEnvironmentOwnership({
        environmentId: f.envId,
        expectedOwnerTaskId: f.parentId,
        expectedGeneration: 1,
        newOwnerTaskId: f.parentId,
      });
      expect(same).toMatchObject({ ownerTaskId: f.parentId, generation: 1, changed: false });
      const group = await store.ownership.transferGroupStewardship({
        groupId: f.groupId,
        expectedStewardTaskId: f.parentId,
        expectedGeneration: 1,
        newStewardTaskId: f.parentId,
      });
      expect(group).toMatchObject({ generation: 1, changed: false });
      expect((await envRow(store, f.envId)).ownership_generation).toBe(1);
      expect((await groupRow(store, f.groupId)).ownership_generation).toBe(1);
    });

    it('rejects a transfer of a missing environment and to a missing task', async () => {
      const f = await seedFamily(store);
      await expect(
        store.ownership.transferEnvironmentOwnership({
          environmentId: 'nope',
          expectedOwnerTaskId: f.parentId,
          expectedGeneration: 1,
          newOwnerTaskId: f.childId,
        }),
      ).rejects.toBeInstanceOf(NotFoundError);
      await expect(
        store.ownership.transferEnvironmentOwnership({
          environmentId: f.envId,
          expectedOwnerTaskId: f.parentId,
          expectedGeneration: 1,
          newOwnerTaskId: 'ghost',
        }),
      ).rejects.toBeInstanceOf(NotFoundError);
      expect((await envRow(store, f.envId)).ownership_generation).toBe(1);
    });

    it('moves group stewardship and the membership roles together', async () => {
      const f = await seedFamily(store);
      const r = await store.ownership.transferGroupStewardship({
        groupId: f.groupId,
        expectedStewardTaskId: f.parentId,
        expectedGeneration: 1,
        newStewardTaskId: f.childId,
      });
      expect(r).toMatchObject({ resourceKind: 'group', ownerTaskId: f.childId, generation: 2, changed: true });
      expect(await rolesOf(store, f.groupId)).toEqual({ [f.parentId]: 'member', [f.childId]: 'steward' });
      // A steward from outside the group joins it as steward.
      const outsider = await newTask(store, f.companyId);
      await store.ownership.transferGroupStewardship({
        groupId: f.groupId,
        expectedStewardTaskId: f.childId,
        expectedGeneration: 2,
        newStewardTaskId: outsider,
      });
      expect(await rolesOf(store, f.groupId)).toEqual({
        [f.parentId]: 'member',
        [f.childId]: 'member',
        [outsider]: 'steward',
      });
      // The environment is a separate resource and kept its owner.
      expect(await envRow(store, f.envId)).toMatchObject({ task_id: f.parentId, ownership_generation: 1 });
      // A task belongs to one active group at most: the steward of another group cannot take this one.
      const other = await seedFamily(store);
      await expect(
        store.ownership.transferGroupStewardship({
          groupId: f.groupId,
          expectedStewardTaskId: outsider,
          expectedGeneration: 3,
          newStewardTaskId: other.childId,
        }),
      ).rejects.toBeInstanceOf(InvalidArgumentError);
      expect((await groupRow(store, f.groupId)).ownership_generation).toBe(3);
    });

    it('refuses a transfer while a cleanup claim is active, and allows it once the claim expired', async () => {
      const f = await seedFamily(store);
      const x = await newTask(store, f.companyId);
      const admission = await store.ownership.admitTaskCleanup(f.parentId);
      const envSnapshot = admission.snapshots.find((s) => s.resourceId === f.envId)!;
      const claim = await store.ownership.claimCleanup(envSnapshot.id, 'worker-a', { ttlMs: 60_000 });
      const input = {
        environmentId: f.envId,
        expectedOwnerTaskId: f.parentId,
        expectedGeneration: 1,
        newOwnerTaskId: x,
      };
      const error = await store.ownership.transferEnvironmentOwnership(input).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(CleanupInProgressError);
      expect(error).toMatchObject({
        code: 'CLEANUP_IN_PROGRESS',
        claimedBy: 'worker-a',
        claimExpiresAt: claim.expiresAt,
      });
      expect(await envRow(store, f.envId)).toMatchObject({
        task_id: f.parentId,
        ownership_generation: 1,
        cleanup_claimed_by: 'worker-a',
      });
      clock.advance(60_000);
      const moved = await store.ownership.transferEnvironmentOwnership(input);
      expect(moved.generation).toBe(2);
      expect(await envRow(store, f.envId)).toMatchObject({
        task_id: x,
        cleanup_claimed_by: null,
        cleanup_claim_expires_at: null,
      });
    });
  });

  describe('cleanup barrier, snapshots and claims', () => {
    let store: Store;
    let clock: FakeClock;
    beforeAll(async () => {
      clock = new FakeClock();
      store = await fx.freshStore({ clock });
    });
    afterAll(() => assertOwnershipInvariants(store));

    it('admits cleanup once and persists the inventory as (resource, owner, generation) snapshots in the same transaction', async () => {
      const f = await seedFamily(store);
      const own = await store.ownership.createEnvironment({ ownerTaskId: f.parentId, rootPath: '/ws/private' });
      // Move the private environment once so its snapshot must carry generation 2.
      const x = await newTask(store, f.companyId);
      await store.ownership.transferEnvironmentOwnership({
        environmentId: own.id,
        expectedOwnerTaskId: f.parentId,
        expectedGeneration: 1,
        newOwnerTaskId: x,
      });
      await store.ownership.transferEnvironmentOwnership({
        environmentId: own.id,
        expectedOwnerTaskId: x,
        expectedGeneration: 2,
        newOwnerTaskId: f.parentId,
      });
      const first = await store.ownership.admitTaskCleanup(f.parentId, 'delete');
      expect(first).toMatchObject({ taskId: f.parentId, kind: 'delete', alreadyAdmitted: false });
      const inventory = first.snapshots.map((s) => [
        s.resourceKind,
        s.resourceId,
        s.ownerTaskId,
        s.generation,
        s.state,
      ]);
      expect(inventory).toEqual(
        [
          ['environment', f.envId, f.parentId, 1, 'pending'],
          ['environment', own.id, f.parentId, 3, 'pending'],
          ['group', f.groupId, f.parentId, 1, 'pending'],
        ].sort((a, b) => (a[0] === b[0] ? String(a[1]).localeCompare(String(b[1])) : a[0] === 'environment' ? -1 : 1)),
      );
      const again = await store.ownership.admitTaskCleanup(f.parentId, 'archive');
      expect(again.alreadyAdmitted).toBe(true);
      expect(again.kind).toBe('delete');
      expect(again.snapshots.map((s) => s.id)).toEqual(first.snapshots.map((s) => s.id));
      const { rows } = await sql<{
        n: number;
      }>`select count(*) as n from ${tbl(store.db, 'task_cleanup_admissions')} where task_id = ${f.parentId}`.execute(
        store.db,
      );
      expect(Number(rows[0]!.n)).toBe(1);
      expect(await store.ownership.listCleanupSnapshots(f.parentId)).toEqual(first.snapshots);
    });

    it('lets no resource reach a task whose cleanup was admitted', async () => {
      const f = await seedFamily(store);
      const x = await newTask(store, f.companyId);
      await store.ownership.admitTaskCleanup(x);
      const transfer = await store.ownership
        .transferEnvironmentOwnership({
          environmentId: f.envId,
          expectedOwnerTaskId: f.parentId,
          expectedGeneration: 1,
          newOwnerTaskId: x,
        })
        .catch((e: unknown) => e);
      expect(transfer).toBeInstanceOf(CleanupBarrierError);
      expect(transfer).toMatchObject({ code: 'CLEANUP_BARRIER', admittedTaskId: x, admittedKind: 'archive' });
      await expect(store.ownership.createEnvironment({ ownerTaskId: x, rootPath: '/ws/x' })).rejects.toBeInstanceOf(
        CleanupBarrierError,
      );
      await expect(store.ownership.createWorkspaceGroup({ stewardTaskId: x })).rejects.toBeInstanceOf(
        CleanupBarrierError,
      );
      expect(await envRow(store, f.envId)).toMatchObject({ task_id: f.parentId, ownership_generation: 1 });
    });

    it('claims, completes and marks the resource removed; completing again is a no-op; claiming again is refused', async () => {
      const f = await seedFamily(store);
      const { snapshots } = await store.ownership.admitTaskCleanup(f.parentId);
      const envSnapshot = snapshots.find((s) => s.resourceId === f.envId)!;
      const claim = await store.ownership.claimCleanup(envSnapshot.id, 'worker-a', { ttlMs: 1_000 });
      expect(claim).toMatchObject({
        snapshotId: envSnapshot.id,
        claimant: 'worker-a',
        attempt: 1,
        expiresAt: clock.t + 1_000,
        target: {
          kind: 'environment',
          id: f.envId,
          ownerTaskId: f.parentId,
          generation: 1,
          rootPath: `/ws/${f.parentId}`,
        },
      });
      expect(await envRow(store, f.envId)).toMatchObject({
        cleanup_claimed_by: 'worker-a',
        cleanup_claim_generation: 1,
      });
      const done = await store.ownership.completeCleanup(claim);
      expect(done).toMatchObject({ state: 'completed', attempts: 1, claimedBy: 'worker-a' });
      expect(await envRow(store, f.envId)).toMatchObject({
        status: 'removed',
        cleanup_claimed_by: null,
        ownership_generation: 1,
      });
      expect(await store.ownership.completeCleanup(claim)).toEqual(done);
      await expect(store.ownership.claimCleanup(envSnapshot.id, 'worker-b')).rejects.toBeInstanceOf(
        CleanupAlreadyCompletedError,
      );
      await expect(
        store.ownership.transferEnvironmentOwnership({
          environmentId: f.envId,
          expectedOwnerTaskId: f.parentId,
          expectedGeneration: 1,
          newOwnerTaskId: f.childId,
        }),
      ).rejects.toBeInstanceOf(NotFoundError);
      const groupSnapshot = snapshots.find((s) => s.resourceKind === 'group')!;
      const groupClaim = await store.ownership.claimCleanup(groupSnapshot.id, 'worker-a');
      expect(groupClaim.target).toEqual({ kind: 'group', id: f.groupId, ownerTaskId: f.parentId, generation: 1 });
      await store.ownership.completeCleanup(groupClaim);
      expect((await groupRow(store, f.groupId)).status).toBe('removed');
    });

    it('one active claim at a time: a second claimant is refused until the first fails, releases or expires', async () => {
      const f = await seedFamily(store);
      const { snapshots } = await store.ownership.admitTaskCleanup(f.parentId);
      const s = snapshots.find((x) => x.resourceId === f.envId)!;
      const a = await store.ownership.claimCleanup(s.id, 'worker-a', { ttlMs: 1_000 });
      await expect(store.ownership.claimCleanup(s.id, 'worker-b')).rejects.toBeInstanceOf(CleanupInProgressError);
      // Losing the race is a result with tryClaimCleanup.
      expect(await store.ownership.tryClaimCleanup(s.id, 'worker-b')).toEqual({
        status: 'busy',
        heldBy: { holder: 'worker-a', expiresAt: a.expiresAt, resourceKind: 'environment', resourceId: f.envId },
      });
      const failed = await store.ownership.failCleanup(a, 'EBUSY: device busy');
      expect(failed).toMatchObject({ state: 'failed', lastError: 'EBUSY: device busy', claimedBy: null });
      expect((await envRow(store, f.envId)).cleanup_claimed_by).toBeNull();
      expect((await store.ownership.listPendingCleanups({ taskId: f.parentId })).map((p) => p.id)).toContain(s.id);
      const b = await store.ownership.claimCleanup(s.id, 'worker-b', { ttlMs: 1_000 });
      expect(b.attempt).toBe(2);
      expect(await store.ownership.releaseCleanupClaim(b)).toMatchObject({ state: 'pending', claimedBy: null });
      const c = await store.ownership.claimCleanup(s.id, 'worker-c', { ttlMs: 1_000 });
      expect((await store.ownership.listPendingCleanups({ taskId: f.parentId })).map((p) => p.id)).not.toContain(s.id);
      clock.advance(1_000);
      // Expired: the snapshot is pending again, and another worker may take it over.
      expect((await store.ownership.listPendingCleanups({ taskId: f.parentId })).map((p) => p.id)).toContain(s.id);
      const d = await store.ownership.claimCleanup(s.id, 'worker-d', { ttlMs: 1_000 });
      expect(d.attempt).toBe(4);
      const lost = await store.ownership.completeCleanup(c).catch((e: unknown) => e);
      expect(lost).toBeInstanceOf(CleanupClaimLostError);
      expect(lost).toMatchObject({ code: 'CLEANUP_CLAIM_LOST', claimant: 'worker-c', currentClaimant: 'worker-d' });
      expect(await envRow(store, f.envId)).toMatchObject({ status: 'active', cleanup_claimed_by: 'worker-d' });
      const renewed = await store.ownership.renewCleanupClaim(d, { ttlMs: 5_000 });
      expect(renewed.expiresAt).toBe(clock.t + 5_000);
      expect((await store.ownership.completeCleanup(renewed)).state).toBe('completed');
    });

    it('refuses a stale completion after a transfer: the snapshot turns stale and the resource is untouched', async () => {
      const f = await seedFamily(store);
      const x = await newTask(store, f.companyId);
      const { snapshots } = await store.ownership.admitTaskCleanup(f.parentId);
      const s = snapshots.find((y) => y.resourceId === f.envId)!;
      const claim = await store.ownership.claimCleanup(s.id, 'slow-worker', { ttlMs: 1_000 });
      clock.advance(1_001); // the worker stalls past its claim
      await store.ownership.transferEnvironmentOwnership({
        environmentId: f.envId,
        expectedOwnerTaskId: f.parentId,
        expectedGeneration: 1,
        newOwnerTaskId: x,
      });
      const moved = await envRow(store, f.envId);
      for (const attempt of [
        () => store.ownership.completeCleanup(claim),
        () => store.ownership.failCleanup(claim, 'gave up'),
        () => store.ownership.releaseCleanupClaim(claim),
        () => store.ownership.renewCleanupClaim(claim),
        () => store.ownership.claimCleanup(s.id, 'another-worker'),
      ]) {
        const error = await attempt().catch((e: unknown) => e);
        expect(error).toBeInstanceOf(StaleOwnershipError);
        expect(error).toMatchObject({
          code: 'STALE_OWNERSHIP',
          snapshotOwnerTaskId: f.parentId,
          snapshotGeneration: 1,
          currentOwnerTaskId: x,
          currentGeneration: 2,
        });
        expect(await envRow(store, f.envId)).toEqual(moved);
      }
      expect(moved).toMatchObject({ status: 'active', task_id: x, ownership_generation: 2, cleanup_claimed_by: null });
      expect(await snapshotRow(store, s.id)).toMatchObject({ state: 'stale', claimed_by: null });
      expect((await store.ownership.listPendingCleanups({ taskId: f.parentId })).map((p) => p.id)).not.toContain(s.id);
    });

    it('marks a pending snapshot stale when the resource moved before anyone claimed it', async () => {
      const f = await seedFamily(store);
      const { snapshots } = await store.ownership.admitTaskCleanup(f.parentId);
      const g = snapshots.find((y) => y.resourceKind === 'group')!;
      await store.ownership.transferGroupStewardship({
        groupId: f.groupId,
        expectedStewardTaskId: f.parentId,
        expectedGeneration: 1,
        newStewardTaskId: f.childId,
      });
      const before = await groupRow(store, f.groupId);
      await expect(store.ownership.claimCleanup(g.id, 'w')).rejects.toBeInstanceOf(StaleOwnershipError);
      expect(await groupRow(store, f.groupId)).toEqual(before);
      expect((await snapshotRow(store, g.id)).state).toBe('stale');
    });
  });

  describe('subtask detachment', () => {
    let store: Store;
    beforeAll(async () => {
      store = await fx.freshStore();
    });
    afterAll(() => assertOwnershipInvariants(store));

    it('moves hierarchy, stewardship, roles, environment owner and both generations in one step', async () => {
      const f = await seedFamily(store);
      const result = await store.ownership.detachSubtask({ taskId: f.childId, expectedParentId: f.parentId });
      expect(result).toEqual({
        outcome: 'detached',
        taskId: f.childId,
        formerParentId: f.parentId,
        group: { id: f.groupId, formerStewardTaskId: f.parentId, generation: 2 },
        environments: [{ id: f.envId, generation: 2 }],
      });
      expect((await store.tasks.requireTask(f.childId)).parentId).toBeNull();
      expect(await groupRow(store, f.groupId)).toMatchObject({ steward_task_id: f.childId, ownership_generation: 2 });
      expect(await envRow(store, f.envId)).toMatchObject({ task_id: f.childId, ownership_generation: 2 });
      expect(await rolesOf(store, f.groupId)).toEqual({ [f.parentId]: 'member', [f.childId]: 'steward' });
      // The parent's later cleanup inventory no longer contains what moved.
      const admission = await store.ownership.admitTaskCleanup(f.parentId);
      expect(admission.snapshots).toEqual([]);
    });

    it('is a no-op for a root task and refuses a different parent', async () => {
      const f = await seedFamily(store);
      expect(await store.ownership.detachSubtask({ taskId: f.parentId, expectedParentId: f.childId })).toEqual({
        outcome: 'already_root',
        taskId: f.parentId,
      });
      const other = await newTask(store, f.companyId);
      await expect(
        store.ownership.detachSubtask({ taskId: f.childId, expectedParentId: other }),
      ).rejects.toBeInstanceOf(ParentChangedError);
      await store.ownership.detachSubtask({ taskId: f.childId, expectedParentId: f.parentId });
      expect(await store.ownership.detachSubtask({ taskId: f.childId, expectedParentId: f.parentId })).toMatchObject({
        outcome: 'already_root',
      });
      expect((await envRow(store, f.envId)).ownership_generation).toBe(2);
    });

    it('is refused once cleanup was admitted for the parent or for the task itself, changing nothing', async () => {
      for (const who of ['parent', 'child'] as const) {
        const f = await seedFamily(store);
        const admitted = who === 'parent' ? f.parentId : f.childId;
        await store.ownership.admitTaskCleanup(admitted, 'delete');
        const error = await store.ownership
          .detachSubtask({ taskId: f.childId, expectedParentId: f.parentId })
          .catch((e: unknown) => e);
        expect(error).toBeInstanceOf(CleanupBarrierError);
        expect(error).toMatchObject({
          code: 'CLEANUP_BARRIER',
          taskId: f.childId,
          admittedTaskId: admitted,
          admittedKind: 'delete',
        });
        expect((await store.tasks.requireTask(f.childId)).parentId).toBe(f.parentId);
        expect(await groupRow(store, f.groupId)).toMatchObject({
          steward_task_id: f.parentId,
          ownership_generation: 1,
        });
        expect(await envRow(store, f.envId)).toMatchObject({ task_id: f.parentId, ownership_generation: 1 });
        expect(await rolesOf(store, f.groupId)).toEqual({ [f.parentId]: 'steward', [f.childId]: 'member' });
      }
    });

    it('takes stewardship from a further ancestor, behind that ancestor’s barrier too', async () => {
      const f = await seedFamily(store);
      const grandchild = await store.tasks.createTask({
        companyId: f.companyId,
        title: 'grandchild',
        requiresFilesystem: true,
        parentId: f.childId,
        workspaceMode: 'shared',
      });
      // The root (steward) is under cleanup: detaching the grandchild would move its inventory.
      await store.ownership.admitTaskCleanup(f.parentId);
      await expect(
        store.ownership.detachSubtask({ taskId: grandchild.id, expectedParentId: f.childId }),
      ).rejects.toBeInstanceOf(CleanupBarrierError);
      const g = await seedFamily(store);
      const gc = await store.tasks.createTask({
        companyId: g.companyId,
        title: 'gc',
        requiresFilesystem: true,
        parentId: g.childId,
        workspaceMode: 'shared',
      });
      const r = await store.ownership.detachSubtask({ taskId: gc.id, expectedParentId: g.childId });
      expect(r).toMatchObject({ outcome: 'detached', group: { formerStewardTaskId: g.parentId, generation: 2 } });
      expect(await rolesOf(store, g.groupId)).toEqual({
        [g.parentId]: 'member',
        [g.childId]: 'member',
        [gc.id]: 'steward',
      });
      expect(await envRow(store, g.envId)).toMatchObject({ task_id: gc.id, ownership_generation: 2 });
    });

    it('only clears the parent link of a task outside any shared group', async () => {
      const f = await seedFamily(store);
      const isolated = await store.tasks.createTask({
        companyId: f.companyId,
        title: 'iso',
        requiresFilesystem: true,
        parentId: f.parentId,
      });
      const env = await store.ownership.createEnvironment({ ownerTaskId: isolated.id, rootPath: '/ws/iso' });
      expect(await store.ownership.detachSubtask({ taskId: isolated.id, expectedParentId: f.parentId })).toEqual({
        outcome: 'detached',
        taskId: isolated.id,
        formerParentId: f.parentId,
        group: null,
        environments: [],
      });
      expect(await envRow(store, env.id)).toMatchObject({ task_id: isolated.id, ownership_generation: 1 });
      expect(await groupRow(store, f.groupId)).toMatchObject({ steward_task_id: f.parentId, ownership_generation: 1 });
    });
  });

  describe('migrations 0053–0054', () => {
    it('start existing environments and groups at generation 1 and go down and up again', async () => {
      const upTo54 = MIGRATIONS.filter((m) => m.version <= 54);
      const store = await fx.freshStore({ to: 53 });
      const migrator = new Migrator(store.dialect, upTo54);
      const now = Date.now();
      await store.db.insertInto('companies').values({ id: 'c', name: 'c', created_at: now }).execute();
      await store.db
        .insertInto('tasks')
        .values({
          id: 't',
          company_id: 'c',
          title: 't',
          created_at: now,
          updated_at: now,
          requires_filesystem: 1,
          parent_id: null,
          workspace_mode: null,
        } as never)
        .execute();
      await sql`insert into ${tbl(store.db, 'workspace_groups')} (id, steward_task_id, created_at, updated_at) values ('g', 't', 0, 0)`.execute(
        store.db,
      );
      await sql`insert into ${tbl(store.db, 'task_environments')} (id, task_id, group_id, root_path, created_at, updated_at) values ('e', 't', 'g', '/e', 0, 0)`.execute(
        store.db,
      );
      await migrator.migrate({ to: 54 });
      expect((await envRow(store, 'e')).ownership_generation).toBe(1);
      expect((await groupRow(store, 'g')).ownership_generation).toBe(1);
      await migrator.migrate({ to: 52, allowDataLoss: true });
      const tables = Object.keys((await store.describeSchema()).tables);
      expect(tables).not.toContain('task_environments');
      expect(tables).not.toContain('cleanup_snapshots');
      await migrator.migrate({ to: 54 });
      expect(Object.keys((await store.describeSchema()).tables)).toEqual(
        expect.arrayContaining(['task_cleanup_admissions', 'cleanup_snapshots']),
      );
    });
  });

  describe('races between processes', () => {
    /** Processes in the pool; pairwise races run POOL / 2 independent cases at once. */
    const POOL = 8;
    /** Connections per process for the many-contender race: POOL × 4 = 32 contenders, each on its own connection. */
    const PER_PROCESS = 4;
    const PAIRS = POOL / 2;
    let url: string;
    let store: Store;
    let clock: FakeClock;
    let contenders: Contenders<typeof OPS>;
    beforeAll(async () => {
      url = await fx.freshUrl();
      clock = new FakeClock();
      store = await fx.open(url, { clock });
      await store.migrate();
      contenders = await Contenders.start(POOL, { url, ops: OPS, storeOptions: { poolSize: 1 } });
    });
    afterAll(async () => {
      await contenders?.close();
      if (store) await assertOwnershipInvariants(store);
    });

    /** Runs `first` in even and `second` in odd contenders, all released together; pair k works on case k. */
    async function racePairs<A, B>(
      first: (k: number) => PairCall,
      second: (k: number) => PairCall,
    ): Promise<[Outcome<A>, Outcome<B>][]> {
      const outcomes = await contenders.race('dispatch', (i) => {
        const [op, args] = i % 2 === 0 ? first(i >> 1) : second(i >> 1);
        return { op, args };
      });
      return Array.from({ length: PAIRS }, (_, k) => [
        outcomes[2 * k] as Outcome<A>,
        outcomes[2 * k + 1] as Outcome<B>,
      ]);
    }

    it('two opposing transfers of one environment: exactly one succeeds and the generation rises by one', async () => {
      let cases = 0;
      for (let round = 0; round < 4; round++) {
        const families = await Promise.all(Array.from({ length: PAIRS }, () => seedFamily(store)));
        const targets = await Promise.all(
          families.map(async (f) => [await newTask(store, f.companyId, 'x'), await newTask(store, f.companyId, 'y')]),
        );
        const transfer = (k: number, side: number): PairCall => [
          'transferEnvironment',
          {
            environmentId: families[k]!.envId,
            expectedOwnerTaskId: families[k]!.parentId,
            expectedGeneration: 1,
            newOwnerTaskId: targets[k]![side]!,
          },
        ];
        const results = await racePairs<OwnershipTransfer, OwnershipTransfer>(
          (k) => transfer(k, 0),
          (k) => transfer(k, 1),
        );
        for (const [k, pair] of results.entries()) {
          const { wins, losses } = partition(pair);
          expect(wins, JSON.stringify(pair)).toHaveLength(1);
          const winner = targets[k]![wins[0]!.index % 2]!;
          expect(wins[0]!.value).toMatchObject({ ownerTaskId: winner, generation: 2, changed: true });
          expect(losses[0]!.error).toMatchObject({
            code: 'OWNERSHIP_CHANGED',
            currentOwnerTaskId: winner,
            currentGeneration: 2,
          });
          expect(await envRow(store, families[k]!.envId)).toMatchObject({ task_id: winner, ownership_generation: 2 });
          cases++;
        }
      }
      expect(cases).toBe(4 * PAIRS);
    });

    it('two opposing stewardship transfers: exactly one succeeds, with its roles', async () => {
      for (let round = 0; round < 2; round++) {
        const families = await Promise.all(Array.from({ length: PAIRS }, () => seedFamily(store)));
        const targets = await Promise.all(
          families.map(async (f) => [f.childId, await newTask(store, f.companyId, 'y')]),
        );
        const transfer = (k: number, side: number): PairCall => [
          'transferGroup',
          {
            groupId: families[k]!.groupId,
            expectedStewardTaskId: families[k]!.parentId,
            expectedGeneration: 1,
            newStewardTaskId: targets[k]![side]!,
          },
        ];
        const results = await racePairs<OwnershipTransfer, OwnershipTransfer>(
          (k) => transfer(k, 0),
          (k) => transfer(k, 1),
        );
        for (const [k, pair] of results.entries()) {
          const { wins, losses } = partition(pair);
          expect(wins, JSON.stringify(pair)).toHaveLength(1);
          const winner = targets[k]![wins[0]!.index % 2]!;
          expect(losses[0]!.error).toMatchObject({
            code: 'OWNERSHIP_CHANGED',
            currentOwnerTaskId: winner,
            currentGeneration: 2,
          });
          expect(await groupRow(store, families[k]!.groupId)).toMatchObject({
            steward_task_id: winner,
            ownership_generation: 2,
          });
          const roles = await rolesOf(store, families[k]!.groupId);
          expect(Object.entries(roles).filter(([, r]) => r === 'steward')).toEqual([[winner, 'steward']]);
        }
      }
    });

    it(`${POOL * PER_PROCESS} contenders, each on its own connection, with the same expectation: one winner, everyone else sees it`, async () => {
      const N = POOL * PER_PROCESS;
      await contenders.race('openConnections', () => ({ count: PER_PROCESS }));
      for (let round = 0; round < 3; round++) {
        const f = await seedFamily(store);
        const targets: string[] = [];
        for (let i = 0; i < N; i++) targets.push(await newTask(store, f.companyId, `t${i}`));
        const input = (i: number) => ({
          environmentId: f.envId,
          expectedOwnerTaskId: f.parentId,
          expectedGeneration: 1,
          newOwnerTaskId: targets[i]!,
        });
        const perProcess = await contenders.race('transferOnEachConnection', (p) => ({
          calls: Array.from({ length: PER_PROCESS }, (_, c) => input(p * PER_PROCESS + c)),
        }));
        const outcomes = perProcess.flatMap((o, p) => {
          if (!o.ok) throw new Error(`process ${p} failed: ${JSON.stringify(o.error)}`);
          return o.value.map((v, c) => ({ ...v, index: p * PER_PROCESS + c }));
        });
        expect(outcomes).toHaveLength(N);
        const { wins, losses } = partition(outcomes);
        expect(wins, JSON.stringify(losses.filter((l) => l.error.code !== 'OWNERSHIP_CHANGED'))).toHaveLength(1);
        const winner = targets[wins[0]!.index]!;
        expect(wins[0]!.value).toMatchObject({ ownerTaskId: winner, generation: 2 });
        for (const l of losses)
          expect(l.error).toMatchObject({
            code: 'OWNERSHIP_CHANGED',
            currentOwnerTaskId: winner,
            currentGeneration: 2,
          });
        expect(await envRow(store, f.envId)).toMatchObject({ task_id: winner, ownership_generation: 2 });
      }
    });

    it('a transfer racing a cleanup claim: never both succeed', async () => {
      let cases = 0;
      for (let round = 0; round < 4; round++) {
        const setups = await Promise.all(
          Array.from({ length: PAIRS }, async () => {
            const f = await seedFamily(store);
            const x = await newTask(store, f.companyId, 'x');
            const { snapshots } = await store.ownership.admitTaskCleanup(f.parentId);
            return { f, x, snapshotId: snapshots.find((y) => y.resourceId === f.envId)!.id };
          }),
        );
        const results = await racePairs<OwnershipTransfer, CleanupClaim>(
          (k) => [
            'transferEnvironment',
            {
              environmentId: setups[k]!.f.envId,
              expectedOwnerTaskId: setups[k]!.f.parentId,
              expectedGeneration: 1,
              newOwnerTaskId: setups[k]!.x,
            },
          ],
          (k) => ['claimCleanup', { snapshotId: setups[k]!.snapshotId, claimant: `worker-${k}` }],
        );
        for (const [k, [transfer, claim]] of results.entries()) {
          const { f, x, snapshotId } = setups[k]!;
          expect([transfer.ok, claim.ok].filter(Boolean), JSON.stringify([transfer, claim])).toHaveLength(1);
          const env = await envRow(store, f.envId);
          const snap = await snapshotRow(store, snapshotId);
          if (transfer.ok) {
            expect(errorOf(claim)).toMatchObject({
              code: 'STALE_OWNERSHIP',
              currentOwnerTaskId: x,
              currentGeneration: 2,
            });
            expect(env).toMatchObject({ task_id: x, ownership_generation: 2, cleanup_claimed_by: null });
            expect(snap.state).toBe('stale');
          } else {
            expect(errorOf(transfer)).toMatchObject({ code: 'CLEANUP_IN_PROGRESS', claimedBy: `worker-${k}` });
            expect(env).toMatchObject({
              task_id: f.parentId,
              ownership_generation: 1,
              cleanup_claimed_by: `worker-${k}`,
              cleanup_claim_generation: 1,
            });
            expect(snap).toMatchObject({ state: 'claimed', claimed_by: `worker-${k}` });
          }
          cases++;
        }
      }
      expect(cases).toBe(4 * PAIRS);
    });

    it("a transfer to a task racing that task's cleanup admission: the resource is in the inventory or never arrives", async () => {
      const orders = { transferFirst: 0, admitFirst: 0 };
      for (let round = 0; round < 6; round++) {
        const setups = await Promise.all(
          Array.from({ length: PAIRS }, async () => {
            const f = await seedFamily(store);
            return { f, x: await newTask(store, f.companyId, 'x') };
          }),
        );
        const results = await racePairs<OwnershipTransfer, CleanupAdmission>(
          (k) => [
            'transferEnvironment',
            {
              environmentId: setups[k]!.f.envId,
              expectedOwnerTaskId: setups[k]!.f.parentId,
              expectedGeneration: 1,
              newOwnerTaskId: setups[k]!.x,
            },
          ],
          (k) => ['admit', { taskId: setups[k]!.x }],
        );
        for (const [k, [transfer, admission]] of results.entries()) {
          const { f, x } = setups[k]!;
          expect(admission.ok, JSON.stringify(admission)).toBe(true);
          const inventory = admission.ok
            ? admission.value.snapshots.map((s) => [s.resourceId, s.ownerTaskId, s.generation])
            : [];
          if (transfer.ok) {
            // The transfer committed first: the admission saw X owning the environment.
            expect(inventory, JSON.stringify([transfer, admission])).toContainEqual([f.envId, x, 2]);
            expect(await envRow(store, f.envId)).toMatchObject({ task_id: x, ownership_generation: 2 });
            orders.transferFirst++;
          } else {
            expect(errorOf(transfer)).toMatchObject({ code: 'CLEANUP_BARRIER', admittedTaskId: x });
            expect(inventory.some(([id]) => id === f.envId)).toBe(false);
            expect(await envRow(store, f.envId)).toMatchObject({ task_id: f.parentId, ownership_generation: 1 });
            orders.admitFirst++;
          }
        }
      }
      expect(orders.transferFirst + orders.admitFirst).toBe(6 * PAIRS);
    });

    it('detach racing admit-cleanup on the parent, many rounds: every outcome is one of the two legal orders', async () => {
      const orders = { detachFirst: 0, admitFirst: 0 };
      const ROUNDS = 8;
      for (let round = 0; round < ROUNDS; round++) {
        const setups = await Promise.all(
          Array.from({ length: PAIRS }, async () => {
            const f = await seedFamily(store);
            const privateEnv = await store.ownership.createEnvironment({
              ownerTaskId: f.parentId,
              rootPath: `/ws/${f.parentId}/own`,
            });
            return { f, privateEnvId: privateEnv.id };
          }),
        );
        const results = await racePairs<DetachResult, CleanupAdmission>(
          (k) => ['detach', { taskId: setups[k]!.f.childId, expectedParentId: setups[k]!.f.parentId }],
          (k) => ['admit', { taskId: setups[k]!.f.parentId }],
        );
        for (const [k, [detached, admitted]] of results.entries()) {
          const { f, privateEnvId } = setups[k]!;
          expect(admitted.ok, JSON.stringify(admitted)).toBe(true);
          const admission = (admitted as Extract<typeof admitted, { ok: true }>).value;
          const inventory = admission.snapshots
            .map((s) => `${s.resourceKind}:${s.resourceId}@${s.ownerTaskId}#${s.generation}`)
            .sort();
          const dbSnapshots = (
            await store.db.selectFrom('cleanup_snapshots').selectAll().where('task_id', '=', f.parentId).execute()
          )
            .map((s) => `${s.resource_kind}:${s.resource_id}@${s.owner_task_id}#${s.ownership_generation}`)
            .sort();
          expect(dbSnapshots).toEqual(inventory);
          const child = await store.tasks.requireTask(f.childId);
          const group = await groupRow(store, f.groupId);
          const env = await envRow(store, f.envId);
          const roles = await rolesOf(store, f.groupId);
          if (detached.ok) {
            // Order 1: detach committed first; the inventory taken after it no longer has what moved.
            orders.detachFirst++;
            expect(inventory).toEqual([`environment:${privateEnvId}@${f.parentId}#1`]);
            expect(child.parentId).toBeNull();
            expect(group).toMatchObject({ steward_task_id: f.childId, ownership_generation: 2 });
            expect(env).toMatchObject({ task_id: f.childId, ownership_generation: 2 });
            expect(roles).toEqual({ [f.parentId]: 'member', [f.childId]: 'steward' });
          } else {
            // Order 2: admission committed first; detach was refused and changed nothing.
            orders.admitFirst++;
            expect(errorOf(detached)).toMatchObject({ code: 'CLEANUP_BARRIER', admittedTaskId: f.parentId });
            expect(inventory).toEqual(
              [
                `environment:${privateEnvId}@${f.parentId}#1`,
                `environment:${f.envId}@${f.parentId}#1`,
                `group:${f.groupId}@${f.parentId}#1`,
              ].sort(),
            );
            expect(child.parentId).toBe(f.parentId);
            expect(group).toMatchObject({ steward_task_id: f.parentId, ownership_generation: 1 });
            expect(env).toMatchObject({ task_id: f.parentId, ownership_generation: 1 });
            expect(roles).toEqual({ [f.parentId]: 'steward', [f.childId]: 'member' });
          }
        }
      }
      expect(orders.detachFirst + orders.admitFirst).toBe(ROUNDS * PAIRS);
    });

    it('a child is never visible without its membership, even to readers racing its creation', async () => {
      const families = await Promise.all(Array.from({ length: PAIRS }, () => seedFamily(store)));
      const COUNT = 20;
      const results = await racePairs<string[], { iterations: number; violations: number; seen: number }>(
        (k) => [
          'createSharedChildren',
          { companyId: families[k]!.companyId, parentId: families[k]!.parentId, count: COUNT },
        ],
        (k) => ['watchMemberships', { parentId: families[k]!.parentId, count: COUNT + 1 }],
      );
      for (const [k, [created, watched]] of results.entries()) {
        expect(created.ok, JSON.stringify(created)).toBe(true);
        expect(watched, JSON.stringify(watched)).toMatchObject({ ok: true, value: { violations: 0, seen: COUNT + 1 } });
        const roles = await rolesOf(store, families[k]!.groupId);
        expect(Object.values(roles).filter((r) => r === 'member')).toHaveLength(COUNT + 1);
      }
    });

    it('a worker process whose claim expired and whose resource was transferred cannot complete: refused, resource untouched', async () => {
      const f = await seedFamily(store);
      const x = await newTask(store, f.companyId, 'x');
      const { snapshots } = await store.ownership.admitTaskCleanup(f.parentId);
      const s = snapshots.find((y) => y.resourceId === f.envId)!;
      const claimed = await contenders.run(0, 'claimCleanup', {
        snapshotId: s.id,
        claimant: 'remote-worker',
      });
      expect(claimed.ok, JSON.stringify(claimed)).toBe(true);
      const saved = clock.t;
      try {
        clock.advance(HOUR); // the remote worker stalled past its claim
        await store.ownership.transferEnvironmentOwnership({
          environmentId: f.envId,
          expectedOwnerTaskId: f.parentId,
          expectedGeneration: 1,
          newOwnerTaskId: x,
        });
      } finally {
        clock.t = saved;
      }
      const before = await envRow(store, f.envId);
      const completed = await contenders.run(
        0,
        'completeCleanup',
        (claimed as Extract<typeof claimed, { ok: true }>).value,
      );
      expect(errorOf(completed)).toMatchObject({
        code: 'STALE_OWNERSHIP',
        currentOwnerTaskId: x,
        currentGeneration: 2,
      });
      expect(await envRow(store, f.envId)).toEqual(before);
      expect(before).toMatchObject({ status: 'active', task_id: x, ownership_generation: 2 });
      expect((await snapshotRow(store, s.id)).state).toBe('stale');
    });

    // Last in this block: it kills the pool's last process.
    it('a worker SIGKILLed mid-teardown: a new process retries from the persisted snapshot, failing closed where ownership moved', async () => {
      const victim = POOL - 1;
      const root = mkdtempSync(join(tmpdir(), 'taskfence-teardown-'));
      try {
        const company = await store.org.createCompany({ name: 'crash' });
        const parent = await newTask(store, company.id, 'parent');
        const heir = await newTask(store, company.id, 'heir');
        const dirs = ['kept', 'moved'].map((name) => {
          const dir = join(root, name);
          mkdirSync(dir);
          for (const file of ['a', 'b']) writeFileSync(join(dir, file), file);
          return dir;
        });
        const kept = await store.ownership.createEnvironment({ ownerTaskId: parent, rootPath: dirs[0]! });
        const moved = await store.ownership.createEnvironment({ ownerTaskId: parent, rootPath: dirs[1]! });
        const { snapshots } = await store.ownership.admitTaskCleanup(parent, 'delete');
        const snapshotOf = (envId: string) => snapshots.find((s) => s.resourceId === envId)!;

        const running = contenders
          .start(victim, 'teardownAndHang', {
            claims: [kept, moved].map((env) => ({ snapshotId: snapshotOf(env.id).id, claimant: `doomed-worker` })),
          })
          .catch((e: unknown) => e);
        await contenders.waitForSignal(victim, 'mid-teardown');
        await contenders.kill(victim);
        const died = await running;
        expect(died).toBeInstanceOf(ContenderExitedError);
        expect(died).toMatchObject({ signal: 'SIGKILL' });

        // Half torn down; the claims are persisted and still held by the dead worker.
        for (const dir of dirs) expect(readdirSync(dir)).toEqual(['b']);
        for (const env of [kept, moved]) {
          expect(await snapshotRow(store, snapshotOf(env.id).id)).toMatchObject({
            state: 'claimed',
            attempts: 1,
            claimed_by: 'doomed-worker',
          });
          expect((await envRow(store, env.id)).cleanup_claimed_by).toBe('doomed-worker');
        }
        expect(await store.ownership.listPendingCleanups({ taskId: parent })).toEqual([]);

        // After the dead claims expired, ownership of one environment moves on.
        clock.advance(HOUR);
        await store.ownership.transferEnvironmentOwnership({
          environmentId: moved.id,
          expectedOwnerTaskId: parent,
          expectedGeneration: 1,
          newOwnerTaskId: heir,
        });
        const movedBefore = await envRow(store, moved.id);

        const restarted = await Contenders.start(1, { url, ops: OPS, storeOptions: { poolSize: 1 } });
        let outcome: Outcome<
          { snapshotId: string; resourceId: string; ok: boolean; code?: string; attempt?: number }[]
        >;
        try {
          outcome = await restarted.run(0, 'retryPendingCleanups', {
            taskId: parent,
            skewMs: HOUR,
            claimant: 'worker-restarted',
          });
        } finally {
          await restarted.close();
        }
        expect(outcome.ok, JSON.stringify(outcome)).toBe(true);
        const results = Object.fromEntries(
          (outcome as Extract<typeof outcome, { ok: true }>).value.map((r) => [r.resourceId, r]),
        );
        expect(Object.keys(results).sort()).toEqual([kept.id, moved.id].sort());
        expect(results[kept.id]).toMatchObject({ ok: true, attempt: 2 });
        expect(results[moved.id]).toMatchObject({ ok: false, code: 'STALE_OWNERSHIP' });

        expect(existsSync(dirs[0]!)).toBe(false);
        expect(await envRow(store, kept.id)).toMatchObject({ status: 'removed', cleanup_claimed_by: null });
        expect(await snapshotRow(store, snapshotOf(kept.id).id)).toMatchObject({
          state: 'completed',
          attempts: 2,
          claimed_by: 'worker-restarted',
        });
        // Failed closed: the retry touched neither the moved environment's row nor its directory.
        expect(readdirSync(dirs[1]!)).toEqual(['b']);
        expect(await envRow(store, moved.id)).toEqual(movedBefore);
        expect(movedBefore).toMatchObject({
          status: 'active',
          task_id: heir,
          ownership_generation: 2,
          cleanup_claimed_by: null,
        });
        expect(await snapshotRow(store, snapshotOf(moved.id).id)).toMatchObject({ state: 'stale', claimed_by: null });
      } finally {
        rmSync(root, { recursive: true, force: true });
      }
    });
  });
}
