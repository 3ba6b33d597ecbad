/**
 * `store.renewLeases(leases, { ttlMs })` (issue 24): a worker's heartbeat, every lease it holds
 * renewed in one write transaction (one commit), each as its own renewal call renews it, and the
 * lost ones reported per item instead of failing the batch.
 */
import { InvalidArgumentError } from '../../errors.js';
import type { Repositories } from '../index.js';
import { requirePositiveMs } from '../validate.js';
import { coordinatorRunLease } from './running-run.js';
import { LeaseLostError, requireLease, requireLeaseKind, type Lease, type LeaseKind } from './lease.js';

/** Most leases one `renewLeases` call renews. */
export const MAX_RENEW_BATCH = 1_000;

/** One lease `renewLeases` found lost: its index in the input, and what its own renewal throws. */
export interface LostLease {
  readonly index: number;
  readonly lease: Lease;
  readonly error: LeaseLostError;
}

/** `renewLeases`' result: per item, the renewed lease or why it is lost. */
export interface RenewedLeases {
  /** Every lease that was live, renewed, in input order, as its own renewal returns it. */
  readonly renewed: readonly Lease[];
  /** Every lease that was not, in input order: nothing was written for it. */
  readonly lost: readonly LostLease[];
}

/**
 * The lock-order level of a kind's renewal (src/protocol.ts): a dispatch heartbeat takes its
 * task's key (6), a path renewal its workspace's key (7); the others take none. Renewing in
 * (level, resource) order keeps every batch in the protocol's order, so two heartbeats whose
 * leases cross (two workspaces each) never deadlock.
 */
const LEVEL: Record<LeaseKind, number> = {
  coordinator_run: 0,
  task_lease: 0,
  workspace_lock: 0,
  semaphore: 0,
  cleanup_claim: 4,
  dispatch: 6,
  path_lease: 7,
};

/** Checks the batch before any statement: an array of grants, each of a kind `renewLeases` renews. */
export function checkRenewBatch(leases: unknown, options: unknown): { leases: Lease[]; ttlMs: number | undefined } {
  if (!Array.isArray(leases) || leases.length > MAX_RENEW_BATCH)
    throw new InvalidArgumentError('leases', `must be an array of at most ${MAX_RENEW_BATCH} leases`);
  const checked = leases.map((value: unknown, i) => {
    const kind = requireLeaseKind(value, `leases[${i}]`);
    if (kind === 'cleanup_claim')
      throw new InvalidArgumentError(
        `leases[${i}].kind`,
        'a cleanup claim is renewed with ownership.renewCleanupClaim(claim), which needs the whole claim',
      );
    requireLease(kind, value, `leases[${i}]`);
    // The area's own renewal reads its own fields (a path grant's keys): pass the object as given.
    return value as Lease;
  });
  const ttl = (options as { ttlMs?: unknown } | undefined)?.ttlMs;
  return { leases: checked, ttlMs: ttl === undefined ? undefined : requirePositiveMs('ttlMs', ttl) };
}

/** Renews `lease` through its area's own renewal on `repos` (a transaction's repositories). */
async function renewOne(repos: Repositories, lease: Lease, ttlMs: number | undefined): Promise<Lease> {
  const options = ttlMs === undefined ? {} : { ttlMs };
  switch (lease.kind) {
    case 'workspace_lock':
      return repos.locks.renewWorkspaceLock(lease as never, options);
    case 'task_lease':
      return repos.locks.renewTaskLease(lease as never, options);
    case 'semaphore':
      return repos.semaphores.renew(lease as never, options);
    case 'path_lease':
      return repos.paths.renewPaths(lease as never, options);
    case 'dispatch':
      return repos.dispatches.heartbeatDispatch(lease as never, options);
    case 'coordinator_run':
      return coordinatorRunLease(await repos.runs.heartbeatCoordinatorRun(lease.resource));
    default:
      throw new InvalidArgumentError('lease.kind', `cannot renew a ${lease.kind} here`);
  }
}

/**
 * Renews every lease of `leases` on `repos` (the repositories of one open transaction), in lock
 * order, each through its own renewal; a `LeaseLostError` is reported for its item, anything else
 * is thrown (and the caller's transaction rolls back).
 */
export async function renewLeasesIn(
  repos: Repositories,
  leases: readonly Lease[],
  ttlMs: number | undefined,
): Promise<RenewedLeases> {
  const order = leases
    .map((lease, index) => ({ lease, index }))
    .sort(
      (a, b) =>
        LEVEL[a.lease.kind] - LEVEL[b.lease.kind] ||
        (a.lease.resource < b.lease.resource ? -1 : a.lease.resource > b.lease.resource ? 1 : 0) ||
        a.index - b.index,
    );
  const renewed = new Map<number, Lease>();
  const lost: LostLease[] = [];
  for (const { lease, index } of order) {
    try {
      renewed.set(index, await renewOne(repos, lease, ttlMs));
    } catch (error) {
      if (!(error instanceof LeaseLostError)) throw error;
      lost.push({ index, lease, error });
    }
  }
  return {
    renewed: [...renewed.entries()].sort((a, b) => a[0] - b[0]).map(([, lease]) => lease),
    lost: lost.sort((a, b) => a.index - b.index),
  };
}
