/**
 * Fenced host writes (`tx.assertLease`, issue 21) on one dialect: holder A's lease lapses while A
 * is inside a fenced transaction that writes a host row; holder B, in another process, takes the
 * resource over and reads the host rows as its grant committed. No row written under A's token
 * may commit after B's grant: A either committed before it (B sees A's row) or failed typed. A
 * fenced transaction that starts after the takeover fails with the kind's `LeaseLostError` and
 * its host writes roll back, even when the callback swallows the error.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from 'kysely';
import { coordinatorRunLease, LeaseLostError, type Lease, type Store } from '../../src/index.js';
import type { DialectFixture } from '../support/fixtures.js';
import { Contenders } from '../support/race.js';
import { tbl } from '../support/schema.js';
import { ops as OPS, type FenceHostTables } from './fence.ops.js';

/** Lease lifetime of holder A; A keeps its fenced transaction open well past it. */
const TTL_MS = 800;
const HOLD_MS = 2_000;

export function defineFenceSuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  let store: Store;
  let contenders: Contenders<typeof OPS>;
  let companyId: string;

  beforeAll(async () => {
    fx = makeFixture();
    const url = await fx.freshUrl();
    store = await fx.open(url);
    await store.migrate();
    await sql`create table ${tbl(store.db, 'fenced_results')} (id text primary key, kind text not null, resource text not null, token bigint not null)`.execute(
      store.db,
    );
    companyId = (await store.org.createCompany({ name: 'Fence' })).id;
    contenders = await Contenders.start(2, { url, ops: OPS, storeOptions: { poolSize: 2 } });
  }, 600_000);
  afterAll(async () => {
    await contenders?.close();
    await fx.cleanup();
  });

  const hostRows = (resource: string) =>
    store.db
      .withTables<FenceHostTables>()
      .selectFrom('fenced_results')
      .selectAll()
      .where('resource', '=', resource)
      .execute();

  /** A fresh resource of `kind` and A's lease on it, lapsing after TTL_MS. */
  async function grantA(
    kind: 'workspace_lock' | 'task_lease' | 'coordinator_run' | 'semaphore' | 'path_lease' | 'cleanup_claim',
    round: number,
  ) {
    if (kind === 'cleanup_claim') {
      // A's claim on the snapshot of an environment whose owner's cleanup was admitted.
      const task = await store.tasks.createTask({ companyId, title: `c-${round}`, requiresFilesystem: false });
      await store.ownership.createEnvironment({ ownerTaskId: task.id, rootPath: `/ws/c-${round}` });
      const [snapshot] = (await store.ownership.admitTaskCleanup(task.id)).snapshots;
      const claim = await store.ownership.claimCleanup(snapshot!.id, 'A', { ttlMs: TTL_MS });
      return { lease: claim.lease as Lease, takeOver: { kind, resource: snapshot!.id, holder: 'B' } };
    }
    if (kind === 'path_lease') {
      // B takes a path below A's: the takeover prunes nothing of A's, so only the token row fences it.
      const ws = await store.org.createWorkspace({ companyId, name: `paths-${round}` });
      const claim = await store.paths.tryAcquirePaths({
        workspaceId: ws.id,
        holder: 'A',
        paths: ['src'],
        ttlMs: TTL_MS,
      });
      if (claim.status !== 'acquired') throw new Error('expected a grant');
      return { lease: claim.lease as Lease, takeOver: { kind, resource: ws.id, holder: 'B' } };
    }
    if (kind === 'semaphore') {
      const name = `sem-${round}`;
      const claim = await store.semaphores.acquire(name, { holder: 'A', limit: 1, ttlMs: TTL_MS });
      if (claim.status !== 'acquired') throw new Error('expected a grant');
      return { lease: claim.lease as Lease, takeOver: { kind, resource: name, holder: 'B' } };
    }
    if (kind === 'workspace_lock') {
      const ws = await store.org.createWorkspace({ companyId, name: `ws-${round}` });
      const claim = await store.locks.claimWorkspaceLock(ws.id, { holder: 'A', runId: 'A', ttlMs: TTL_MS });
      if (claim.status !== 'acquired') throw new Error('expected a grant');
      return { lease: claim.lease as Lease, takeOver: { kind, resource: ws.id, holder: 'B' } };
    }
    if (kind === 'task_lease') {
      const task = await store.tasks.createTask({ companyId, title: `t-${round}`, requiresFilesystem: false });
      const claim = await store.locks.claimTaskLease(task.id, { holder: 'A', ttlMs: TTL_MS });
      if (claim.status !== 'acquired') throw new Error('expected a grant');
      return { lease: claim.lease as Lease, takeOver: { kind, resource: task.id, holder: 'B' } };
    }
    const targetKey = `fence:${round}`;
    const run = await store.runs.startCoordinatorRun({ targetKey });
    return {
      lease: coordinatorRunLease(run) as Lease,
      takeOver: { kind, resource: run.id, targetKey, holder: 'B', staleAfterMs: TTL_MS },
    };
  }

  const lostCode = {
    workspace_lock: 'STALE_WORKSPACE_LOCK',
    task_lease: 'STALE_TASK_LEASE',
    coordinator_run: 'COORDINATOR_RUN_NOT_RUNNING',
    semaphore: 'SEMAPHORE_LEASE_LOST',
    path_lease: 'PATH_LEASE_LOST',
    cleanup_claim: 'CLEANUP_CLAIM_LOST',
  };
  const lateReason = {
    workspace_lock: 'superseded',
    task_lease: 'superseded',
    coordinator_run: 'released',
    semaphore: 'expired',
    path_lease: 'expired',
    cleanup_claim: 'superseded',
  };

  let round = 0;
  describe.each([
    'workspace_lock',
    'task_lease',
    'coordinator_run',
    'semaphore',
    'path_lease',
    'cleanup_claim',
  ] as const)('tx.assertLease on a %s', (kind) => {
    it.each(['store', 'host'] as const)(
      'a takeover waits for the fenced transaction (store.transaction or the host’s own with withTransaction): no host row under the old token commits after the new grant (%s)',
      async (via) => {
        // Only a round in which A asserted its live lease and wrote can catch a takeover that does
        // not wait: play rounds until two such rounds happened (under load A's lease may lapse first).
        let fenced = 0;
        for (let i = 0; i < 6 && fenced < 2; i++) {
          const r = ++round;
          const { lease, takeOver } = await grantA(kind, r);
          const id = `A-${kind}-${r}`;
          const a = contenders.start(0, 'fencedWrite', { id, lease, holdMs: HOLD_MS, via });
          await contenders.waitForSignal(0, `inside:${id}`);
          const b = await contenders.run(1, 'takeOver', takeOver);
          const outcome = await a;
          if (!b.ok) throw new Error(`takeover failed: ${b.error.message}`);
          if (!outcome.ok) throw new Error(`fenced write crashed: ${outcome.error.message}`);
          const committed = (await hostRows(lease.resource)).map((row) => row.id);
          if (outcome.value.committed) {
            // A committed: it must have committed before B's grant, so B saw its row.
            expect(committed).toContain(id);
            expect(b.value.seen).toContain(id);
            fenced++;
          } else {
            expect(outcome.value).toMatchObject({ code: lostCode[kind] });
            expect(committed).not.toContain(id);
          }
        }
        expect(fenced, 'rounds in which A wrote under its live lease').toBe(2);
      },
      120_000,
    );

    it('a fenced transaction after the takeover fails typed and its host write rolls back, even if the error is caught', async () => {
      const r = ++round;
      const { lease, takeOver } = await grantA(kind, r);
      await new Promise((resolve) => setTimeout(resolve, TTL_MS + 50));
      const b = await contenders.run(1, 'takeOver', takeOver);
      if (!b.ok) throw new Error(`takeover failed: ${b.error.message}`);
      const failed = store.transaction(async (tx) => {
        await tx.db
          .withTables<FenceHostTables>()
          .insertInto('fenced_results')
          .values({ id: `late-${r}`, kind, resource: lease.resource, token: lease.token })
          .execute();
        await tx.assertLease(lease).catch((error: unknown) => {
          expect(error).toBeInstanceOf(LeaseLostError);
        });
      });
      await expect(failed).rejects.toMatchObject({ code: lostCode[kind], kind, reason: lateReason[kind] });
      expect((await hostRows(lease.resource)).map((row) => row.id)).not.toContain(`late-${r}`);
      // Every later statement of such a transaction fails too.
      await expect(
        store.transaction(async (tx) => {
          await tx.assertLease(lease).catch(() => {});
          await tx.db.withTables<FenceHostTables>().selectFrom('fenced_results').select('id').execute();
        }),
      ).rejects.toBeInstanceOf(LeaseLostError);
    }, 60_000);
  });

  it('refuses a lease of an unknown kind, or a malformed one, before any statement', async () => {
    await expect(
      store.transaction((tx) =>
        tx.assertLease({ kind: 'nope', resource: 'x', holder: 'h', token: 1, expiresAt: 0 } as never),
      ),
    ).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    await expect(
      store.transaction((tx) =>
        tx.assertLease({ kind: 'task_lease', resource: 'x', holder: 'h', token: 0, expiresAt: 0 }),
      ),
    ).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
  });
}
