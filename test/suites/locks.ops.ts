/** Contender operations for the lock-mode suite (run in child processes by the race helper). */
import type { DispatchResult, Store } from '../../src/index.js';
import type { ContenderTools } from '../support/contender.js';
import { defineOperations } from '../support/operations.js';

/** A dispatch outcome reduced to what crosses the process boundary. */
export type DispatchSummary =
  | { outcome: 'dispatched'; lockMode: 'none'; taskLeaseToken: number; workspaceId: null }
  | {
      outcome: 'dispatched';
      lockMode: 'exclusive';
      taskLeaseToken: number;
      workspaceId: string;
      source: string;
      lockToken: number;
    }
  | {
      outcome: 'cancelled';
      reason: 'workspace_busy';
      workspaceId: string;
      heldByRunId: string | null;
      heldByToken: number;
    }
  | { outcome: 'skipped'; reason: string; code?: string };

export function summarize(r: DispatchResult): DispatchSummary {
  if (r.outcome === 'dispatched') {
    return r.lockMode === 'none'
      ? { outcome: 'dispatched', lockMode: 'none', taskLeaseToken: r.taskLease.token, workspaceId: null }
      : {
          outcome: 'dispatched',
          lockMode: 'exclusive',
          taskLeaseToken: r.taskLease.token,
          workspaceId: r.workspace.id,
          source: r.source,
          lockToken: r.workspaceLock.token,
        };
  }
  if (r.outcome === 'cancelled') {
    return {
      outcome: 'cancelled',
      reason: r.reason,
      workspaceId: r.workspace.id,
      heldByRunId: r.heldBy.runId,
      heldByToken: r.heldBy.token,
    };
  }
  return r.reason === 'workspace_unresolved'
    ? { outcome: 'skipped', reason: r.reason, code: r.error.code }
    : { outcome: 'skipped', reason: r.reason };
}

/** One `dispatchRun` in heartbeat mode. */
export async function dispatch(store: Store, args: { taskId: string; agentId: string; runId: string; ttlMs?: number }) {
  return summarize(await store.scheduler.dispatchRun({ ...args, mode: 'heartbeat' }));
}

/**
 * Claims, renews and releases the workspace lock and the task lease `iterations` times each,
 * returning every token granted; checks along the way that a released token is refused.
 */
export async function churn(
  store: Store,
  args: { workspaceId: string; taskId: string; iterations: number },
  tools: ContenderTools,
) {
  const lockTokens: number[] = [];
  const leaseTokens: number[] = [];
  const holder = `churn-${tools.index}`;
  let staleRefusals = 0;
  for (let i = 0; i < args.iterations; i++) {
    const lock = await store.locks.claimWorkspaceLock(args.workspaceId, {
      holder,
      runId: `${holder}-${i}`,
      ttlMs: 60_000,
    });
    if (lock.status === 'acquired') {
      lockTokens.push(lock.lease.token);
      await store.locks.renewWorkspaceLock(args.workspaceId, { token: lock.lease.token, ttlMs: 60_000 });
      await store.locks.releaseWorkspaceLock(args.workspaceId, { token: lock.lease.token });
      try {
        await store.locks.renewWorkspaceLock(args.workspaceId, { token: lock.lease.token, ttlMs: 60_000 });
      } catch (error) {
        if ((error as { code?: string }).code === 'STALE_WORKSPACE_LOCK') staleRefusals++;
        else throw error;
      }
    }
    const lease = await store.locks.claimTaskLease(args.taskId, { holder, ttlMs: 60_000 });
    if (lease.status === 'acquired') {
      leaseTokens.push(lease.lease.token);
      await store.locks.renewTaskLease(args.taskId, { token: lease.lease.token, ttlMs: 60_000 });
      await store.locks.releaseTaskLease(args.taskId, { token: lease.lease.token });
    }
  }
  return { lockTokens, leaseTokens, staleRefusals };
}

/** Claims the workspace lock and the task lease, signals `claimed`, then hangs until killed. */
export async function claimAndHang(
  store: Store,
  args: { workspaceId: string; taskId: string; holder: string; ttlMs: number },
  tools: ContenderTools,
) {
  const lock = await store.locks.claimWorkspaceLock(args.workspaceId, {
    holder: args.holder,
    runId: `${args.holder}-run`,
    ttlMs: args.ttlMs,
  });
  const lease = await store.locks.claimTaskLease(args.taskId, { holder: args.holder, ttlMs: args.ttlMs });
  if (lock.status !== 'acquired' || lease.status !== 'acquired')
    throw new Error(`expected free locks, got ${lock.status}/${lease.status}`);
  tools.signal('claimed');
  await new Promise(() => {}); // never resolves: SIGKILLed here
}

/** Claims the workspace lock and the task lease, retrying while busy (the dead holder's TTL runs out). */
export async function claimWhenFree(
  store: Store,
  args: { workspaceId: string; taskId: string; holder: string; maxAttempts: number },
) {
  let busy = 0;
  let lockToken: number | null = null;
  let leaseToken: number | null = null;
  for (let attempt = 0; attempt < args.maxAttempts; attempt++) {
    if (lockToken === null) {
      const lock = await store.locks.claimWorkspaceLock(args.workspaceId, {
        holder: args.holder,
        runId: `${args.holder}-run`,
        ttlMs: 60_000,
      });
      if (lock.status === 'acquired') lockToken = lock.lease.token;
    }
    if (leaseToken === null) {
      const lease = await store.locks.claimTaskLease(args.taskId, { holder: args.holder, ttlMs: 60_000 });
      if (lease.status === 'acquired') leaseToken = lease.lease.token;
    }
    if (lockToken !== null && leaseToken !== null) return { lockToken, leaseToken, busy };
    busy++;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  throw new Error(`still busy after ${args.maxAttempts} attempts`);
}

/** The operations this module's contenders run (see test/support/operations.ts). */
export const ops = defineOperations(import.meta.url, { dispatch, churn, claimAndHang, claimWhenFree });
