/** Contender operations for the fenced-write suite (run in child processes by the race helper). */
import type { Lease, Store, StoreTransaction } from '../../src/index.js';
import type { ContenderTools } from '../support/contender.js';
import { defineOperations } from '../support/operations.js';

/** The host's own table: one row per fenced write, with the token it was written under. */
export type FenceHostTables = { fenced_results: { id: string; kind: string; resource: string; token: number } };

const host = (tx: StoreTransaction) => tx.db.withTables<FenceHostTables>();
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Holder A: in one store transaction, asserts `lease`, writes a host row under its token, signals
 * `inside:<id>`, then keeps the transaction open `holdMs` (long past the lease's expiry) and commits.
 * Returns whether it committed, or the lost-lease error it met.
 */
export async function fencedWrite(
  store: Store,
  args: { id: string; lease: Lease; holdMs: number; via?: 'store' | 'host' },
  tools: ContenderTools,
) {
  let signalled = false;
  const body = async (tx: StoreTransaction) => {
    await tx.assertLease(args.lease);
    await host(tx)
      .insertInto('fenced_results')
      .values({ id: args.id, kind: args.lease.kind, resource: args.lease.resource, token: args.lease.token })
      .execute();
    signalled = true;
    tools.signal(`inside:${args.id}`);
    await sleep(args.holdMs);
  };
  try {
    if (args.via === 'host') {
      // The host's own Kysely transaction, joined with store.withTransaction.
      await store.db
        .transaction()
        .setIsolationLevel('read committed')
        .execute((trx) => body(store.withTransaction(trx)));
    } else {
      await store.transaction(body);
    }
    return { committed: true as const };
  } catch (error) {
    // Under load the lease may lapse before the assertion: the parent still waits for this signal.
    if (!signalled) tools.signal(`inside:${args.id}`);
    const e = error as { code?: string; reason?: string; name?: string };
    return { committed: false as const, code: e.code ?? e.name ?? 'unknown', reason: e.reason ?? null };
  }
}

/**
 * Holder B: waits until A's lease lapsed, takes the resource over (a claim for locks, leases and
 * cleanup claims; `reconcileStaleRuns` then a new run for a coordinator run), and reads the host
 * rows the moment its grant committed: every row A committed before the grant is among them.
 */
export async function takeOver(
  store: Store,
  args: { kind: Lease['kind']; resource: string; targetKey?: string | null; holder: string; staleAfterMs?: number },
) {
  for (let attempt = 0; attempt < 400; attempt++) {
    let token: number | null = null;
    if (args.kind === 'workspace_lock') {
      const claim = await store.locks.claimWorkspaceLock(args.resource, {
        holder: args.holder,
        runId: args.holder,
        ttlMs: 60_000,
      });
      if (claim.status === 'acquired') token = claim.lease.token;
    } else if (args.kind === 'task_lease') {
      const claim = await store.locks.claimTaskLease(args.resource, { holder: args.holder, ttlMs: 60_000 });
      if (claim.status === 'acquired') token = claim.lease.token;
    } else if (args.kind === 'semaphore') {
      const claim = await store.semaphores.acquire(args.resource, { holder: args.holder, limit: 1, ttlMs: 60_000 });
      if (claim.status === 'acquired') token = claim.lease.token;
    } else if (args.kind === 'path_lease') {
      const claim = await store.paths.tryAcquirePaths({
        workspaceId: args.resource,
        holder: args.holder,
        paths: ['src/a.ts'],
        ttlMs: 60_000,
      });
      if (claim.status === 'acquired') token = claim.lease.token;
    } else if (args.kind === 'cleanup_claim') {
      const claim = await store.ownership.tryClaimCleanup(args.resource, args.holder, { ttlMs: 60_000 });
      if (claim.status === 'acquired') token = claim.claim.lease.token;
    } else if (args.kind === 'coordinator_run') {
      const failed = await store.runs.reconcileStaleRuns({ staleAfterMs: args.staleAfterMs! });
      if (failed.some((r) => r.id === args.resource)) {
        await store.runs.startCoordinatorRun({ targetKey: args.targetKey ?? null });
        token = 1;
      }
    }
    if (token !== null) {
      const seen = await store.db
        .withTables<FenceHostTables>()
        .selectFrom('fenced_results')
        .select('id')
        .where('resource', '=', args.resource)
        .execute();
      return { token, seen: seen.map((r) => r.id) };
    }
    await sleep(10);
  }
  throw new Error(`could not take ${args.kind} ${args.resource} over`);
}

export const ops = defineOperations(import.meta.url, { fencedWrite, takeOver });
