/**
 * A cleanup worker on taskfence's public API (SPEC §6): it takes the snapshots an admitted cleanup
 * left behind (`listPendingCleanups`), claims each one (`claimCleanup`), tears the resource down
 * outside the database, and records the outcome (`completeCleanup`, or `failCleanup` for a retry).
 *
 * The claim is the fence. It is taken at the snapshot's (owner, generation): while it is active no
 * transfer can move the resource, and completing or failing it is refused if the owner or
 * generation moved anyway (`StaleOwnershipError`) or the claim was lost (`CleanupClaimLostError`,
 * after it expired and another worker took it). A resource that moved since the inventory is never
 * torn down: its snapshot is marked `stale` and its new owner decides.
 *
 * In an application, import from 'taskfence' instead of the source tree.
 */
import {
  CleanupAlreadyCompletedError,
  CleanupClaimLostError,
  CleanupInProgressError,
  StaleOwnershipError,
  type CleanupClaim,
  type CleanupTarget,
  type Store,
} from '../../src/index.js';

/** Removes what a claimed resource holds outside the database; throws if it cannot (the snapshot is retried). */
export type TearDown = (target: CleanupTarget) => Promise<void>;

export interface CleanupPassOptions {
  /** This worker's name: the claimant recorded on the snapshot. */
  readonly workerId: string;
  readonly tearDown: TearDown;
  /** How long a claim lives (default taskfence's 10 minutes); renew it for teardowns that take longer. */
  readonly claimTtlMs?: number;
  /** Only this task's snapshots (default: every pending snapshot). */
  readonly taskId?: string;
  /** At most this many snapshots per pass. */
  readonly limit?: number;
  readonly log: (line: string) => void;
}

/** What one pass did, by snapshot id. */
export interface CleanupPassResult {
  readonly completed: string[];
  /** Teardown failed: recorded with `failCleanup`, listed again by the next pass. */
  readonly failed: string[];
  /** The resource moved since the inventory: the snapshot is `stale`, the resource untouched. */
  readonly stale: string[];
  /** Another worker holds the claim, the snapshot completed meanwhile, or this worker lost its claim. */
  readonly skipped: string[];
}

const label = (t: { kind: string; id: string } | { resourceKind: string; resourceId: string }) =>
  'kind' in t ? `${t.kind} ${t.id}` : `${t.resourceKind} ${t.resourceId}`;

/** The refusals that mean "this snapshot is not (or no longer) ours to act on": every one changed nothing. */
function isFenceRefusal(
  error: unknown,
): error is StaleOwnershipError | CleanupClaimLostError | CleanupAlreadyCompletedError {
  return (
    error instanceof StaleOwnershipError ||
    error instanceof CleanupClaimLostError ||
    error instanceof CleanupAlreadyCompletedError
  );
}

/**
 * One pass over the pending cleanups (pending, failed, and claimed ones whose claim expired
 * because a worker died): claim, tear down, complete. Run it in a loop (with a pause between
 * passes) as a daemon; every process may run one, since a claim is exclusive.
 */
export async function cleanupPass(store: Store, options: CleanupPassOptions): Promise<CleanupPassResult> {
  const { workerId, log } = options;
  const result: CleanupPassResult = { completed: [], failed: [], stale: [], skipped: [] };
  const pending = await store.ownership.listPendingCleanups({
    ...(options.taskId === undefined ? {} : { taskId: options.taskId }),
    ...(options.limit === undefined ? {} : { limit: options.limit }),
  });
  for (const snapshot of pending) {
    // 1. Claim at the snapshot's generation.
    let claim: CleanupClaim;
    try {
      claim = await store.ownership.claimCleanup(snapshot.id, workerId, {
        ...(options.claimTtlMs === undefined ? {} : { ttlMs: options.claimTtlMs }),
      });
    } catch (error) {
      if (error instanceof StaleOwnershipError) {
        log(
          `${workerId}: ${label(snapshot)} moved to task ${error.currentOwnerTaskId} at generation ${error.currentGeneration} since the inventory: snapshot stale, not torn down`,
        );
        result.stale.push(snapshot.id);
        continue;
      }
      if (error instanceof CleanupInProgressError || error instanceof CleanupAlreadyCompletedError) {
        log(`${workerId}: ${label(snapshot)} skipped (${error.code})`);
        result.skipped.push(snapshot.id);
        continue;
      }
      throw error;
    }
    log(
      `${workerId}: claimed ${label(claim.target)} at generation ${claim.target.generation} (attempt ${claim.attempt})`,
    );

    // 2. Tear down outside the database, under the claim: no transfer can move the resource now.
    let teardownError: string | null = null;
    try {
      await options.tearDown(claim.target);
    } catch (error) {
      teardownError = error instanceof Error ? error.message : String(error);
    }

    // 3. Record the outcome, fenced on (resource, owner, generation) and the claim.
    try {
      if (teardownError === null) {
        await store.ownership.completeCleanup(claim);
        log(`${workerId}: ${label(claim.target)} torn down; cleanup completed`);
        result.completed.push(snapshot.id);
      } else {
        await store.ownership.failCleanup(claim, teardownError);
        log(`${workerId}: ${label(claim.target)} teardown failed (${teardownError}); recorded for a retry`);
        result.failed.push(snapshot.id);
      }
    } catch (error) {
      if (!isFenceRefusal(error)) throw error;
      log(`${workerId}: ${label(claim.target)}: outcome refused (${error.code}); the snapshot is not ours any more`);
      (error instanceof StaleOwnershipError ? result.stale : result.skipped).push(snapshot.id);
    }
  }
  return result;
}
