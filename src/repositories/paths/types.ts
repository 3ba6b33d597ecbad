/**
 * The public types of `store.paths` (SPEC §5): path-scoped write leases, their errors and the
 * guarantee each method gives.
 */
import { TaskfenceError } from '../../errors.js';
import { WHOLE_WORKSPACE_KEY } from '../../domain/write-paths.js';
import type { TaskStatus } from '../../schema/database.js';
import {
  LeaseLostError,
  LeaseWaitTimeoutError,
  type Lease,
  type LeaseHolderInfo,
  type LeaseLostReason,
} from '../shared/lease.js';
import type { IdempotencyOptions } from '../idempotent.js';
import { claim, committed, grant, release, type OutcomeDeclarations } from '../shared/outcomes.js';

/** A lease key as messages show it. */
export function showKey(key: string): string {
  return key === WHOLE_WORKSPACE_KEY ? 'the whole workspace' : JSON.stringify(key);
}

/** TTL of the leases `claimTask` takes, and of a `renewPaths(lease)`, when the caller gives none. */
export const DEFAULT_PATH_LEASE_TTL_MS = 60_000;

/** At most this many conflicts are reported by a failed acquisition (the check stops there). */
export const PATH_CONFLICT_REPORT_LIMIT = 16;

/** One live lease on a key of a workspace. */
export interface PathLease {
  readonly workspaceId: string;
  /** The lease key: a normalized path, or `""` for the whole workspace. */
  readonly key: string;
  readonly holder: string;
  /** The task the lease was taken for (`claimTask`, or `acquirePaths` with `taskId`). */
  readonly taskId: string | null;
  readonly acquiredAt: number;
  readonly expiresAt: number;
  /** The grant this lease belongs to (`PathLeaseGrant.token`); null on a lease written before schema 0095. */
  readonly token: number | null;
}

/**
 * The grant of one acquisition (`tryAcquirePaths`, `acquirePaths`, `claimTask`): a `Lease` of
 * kind `path_lease` on the workspace (`resource` = `workspaceId`) whose `token` rises on every
 * grant in that workspace and is never reused, with the keys it leased. Pass it unchanged to
 * `renewPaths`, `releasePaths`, `submitTaskResult` and `tx.assertLease`: they act on this grant
 * only, so two processes that use the same holder name never touch each other's leases.
 */
export interface PathLeaseGrant extends Lease<'path_lease'> {
  readonly workspaceId: string;
  /** The lease keys of the grant (`leaseKeys` of the paths asked for); `[]` for a dynamic task claim. */
  readonly keys: readonly string[];
  /** The task the grant was taken for (`claimTask`, or `acquirePaths` with `taskId`). */
  readonly taskId: string | null;
}

/** A live lease of another grant that overlaps what was asked for. */
export interface PathLeaseConflict {
  readonly key: string;
  readonly holder: string;
  readonly expiresAt: number;
  /** The blocking grant's token (null for a lease written before schema 0095); a workspace lock's token. */
  readonly token: number | null;
  /** Set when the blocker is the workspace's exclusive lock (`claimWorkspaceLock`): it holds the whole workspace (`key` `""`). */
  readonly kind?: 'workspace_lock';
}

/** Who blocks a path claim: the first conflict's holder and expiry, and every conflict found (at most `PATH_CONFLICT_REPORT_LIMIT`). */
export interface PathLeaseHolderInfo extends LeaseHolderInfo {
  readonly conflicts: readonly PathLeaseConflict[];
}

export interface AcquirePathsInput extends IdempotencyOptions {
  readonly workspaceId: string;
  readonly holder: string;
  /** Paths to lease, reduced by `leaseKeys` (globs to their prefix; `"."`, `""` or `"*"` = the whole workspace). */
  readonly paths: readonly string[];
  readonly ttlMs: number;
  /** Tags the leases with a task, so that `submitTaskResult` releases them too. */
  readonly taskId?: string | null;
}

/**
 * The claim result (`LeaseClaim` of kind `path_lease`): `{ status: 'acquired', lease }` with the
 * grant, or `{ status: 'busy', heldBy }`. `acquired`, `leases` and `conflicts` are the 0.x shape,
 * kept for one release.
 */
export type TryAcquirePathsResult =
  | {
      readonly status: 'acquired';
      readonly lease: PathLeaseGrant;
      /** @deprecated use `status === 'acquired'`. */
      readonly acquired: true;
      readonly leases: readonly PathLease[];
    }
  | {
      readonly status: 'busy';
      readonly heldBy: PathLeaseHolderInfo;
      /** @deprecated use `status === 'busy'`. */
      readonly acquired: false;
      /** @deprecated use `heldBy.conflicts`. */
      readonly conflicts: readonly PathLeaseConflict[];
    };

/** What `acquirePaths` returns: the leases (the 0.x shape, an array) carrying their grant as `lease`. */
export type AcquiredPaths = readonly PathLease[] & { readonly lease: PathLeaseGrant };

/** Options of `renewPaths(lease, options)`. */
export interface RenewPathLeaseOptions extends IdempotencyOptions {
  /** The new TTL from now (default `DEFAULT_PATH_LEASE_TTL_MS`). */
  readonly ttlMs?: number;
}

export interface AcquirePathsOptions {
  /** Give up after waiting this long (real time, not the store clock). */
  readonly timeoutMs: number;
  /**
   * Longest wait between two checks when no wake-up comes (default: the store's
   * `wakeFallbackMs`). A release wakes the waiter at once; a lease that merely expires announces
   * nothing, so this bounds how late its waiter notices.
   */
  readonly maxPollMs?: number;
}

/** @deprecated the 0.x form, by holder name: release the grant instead, `releasePaths(lease)`. */
export interface ReleasePathsInput extends IdempotencyOptions {
  readonly workspaceId: string;
  readonly holder: string;
  /** Release only the holder's leases on these paths and below them; omitted = all its leases in the workspace. */
  readonly paths?: readonly string[];
}

/** @deprecated the 0.x form, by holder name: renew the grant instead, `renewPaths(lease, { ttlMs })`. */
export interface RenewPathsInput extends IdempotencyOptions {
  readonly workspaceId: string;
  readonly holder: string;
  /**
   * Required: the paths the holder believes it holds. Renewal extends its live leases on or below
   * them and reports in `lost` every one of them it no longer holds, so a heartbeat always learns
   * that it lost a lease (expired, taken over by another holder, released or pruned).
   */
  readonly paths: readonly string[];
  readonly ttlMs: number;
}

/** @deprecated the result of the 0.x form of `renewPaths`. */
export interface RenewPathsResult {
  /** The leases now extended to `now + ttlMs`. */
  readonly renewed: readonly PathLease[];
  /**
   * The lease keys of `paths` the holder no longer holds live (no live lease of the holder on or
   * below them): they expired, were taken over by another holder, or were released. The holder
   * must stop writing there.
   */
  readonly lost: readonly string[];
}

/** How a claimed task's write set was leased. */
export type TaskWriteMode = 'whole-workspace' | 'paths' | 'dynamic';

/**
 * `claimTask`'s result: `{ status: 'acquired', lease }` (the claim's grant; in dynamic mode it
 * leases no keys) or `{ status: 'busy', heldBy }`, with the task's write `mode`. `claimed`,
 * `leases` and `conflicts` are the 0.x shape, kept for one release.
 */
export type PathClaimResult =
  | {
      readonly status: 'acquired';
      readonly mode: TaskWriteMode;
      readonly lease: PathLeaseGrant;
      /** @deprecated use `status === 'acquired'`. */
      readonly claimed: true;
      readonly leases: readonly PathLease[];
    }
  | {
      readonly status: 'busy';
      readonly mode: TaskWriteMode;
      readonly heldBy: PathLeaseHolderInfo;
      /** @deprecated use `status === 'busy'`. */
      readonly claimed: false;
      /** @deprecated use `heldBy.conflicts`. */
      readonly conflicts: readonly PathLeaseConflict[];
    };

export interface PathClaimOptions extends IdempotencyOptions {
  /** Lease TTL (default `DEFAULT_PATH_LEASE_TTL_MS`); renew with `renewPaths`. */
  readonly ttlMs?: number;
  /**
   * The lease of the dispatch the claim is made under (`dispatch.lease`): refused with
   * `DispatchLeaseLostError` unless it is the task's active dispatch's.
   */
  readonly dispatchLease?: Lease<'dispatch'>;
}

export interface PathTaskResult {
  readonly status: Extract<TaskStatus, 'done' | 'failed'>;
  /**
   * The dispatch fence: the lease of the dispatch the result is for (`dispatch.lease`). Unless
   * it is the task's active dispatch's (same id and token), the result is refused with
   * `DispatchLeaseLostError` and changes nothing: a worker whose dispatch was reclaimed,
   * cancelled or superseded cannot finish the task or end its new holder's dispatch.
   */
  readonly dispatchLease?: Lease<'dispatch'>;
}

export interface PathTaskSubmission {
  readonly status: PathTaskResult['status'];
  /** Keys of the task's leases that were released. */
  readonly released: readonly string[];
}

/** `acquirePaths` waited `timeoutMs` and the set was still blocked; `blockers` are the last conflicts seen. */
export class PathLeaseTimeoutError extends LeaseWaitTimeoutError {
  readonly code = 'PATH_LEASE_TIMEOUT';
  readonly kind = 'path_lease';
  constructor(
    readonly workspaceId: string,
    readonly holder: string,
    readonly keys: readonly string[],
    readonly timeoutMs: number,
    readonly blockers: readonly PathLeaseConflict[],
  ) {
    super(
      `Holder ${JSON.stringify(holder)} could not lease ${keys.map(showKey).join(', ')} in workspace ${workspaceId} ` +
        `within ${timeoutMs} ms; blocked by ${blockers.map((b) => `${showKey(b.key)} held by ${JSON.stringify(b.holder)}`).join(', ')}. ` +
        'Wait for those holders to release (or their leases to expire), or raise timeoutMs.',
    );
  }
  /** The workspace, as every lease wait names what it waited for. */
  get resource(): string {
    return this.workspaceId;
  }
}

/**
 * A path-lease grant is not (or no longer) live: `renewPaths(lease)`, `releasePaths(lease)`,
 * `submitTaskResult(taskId, lease, …)` and `tx.assertLease` refuse it. `superseded`: the task was
 * claimed again after this grant; `expired`: its leases lapsed; `released`: they were released
 * (or taken over after expiry); `never_granted`: no such grant in this workspace.
 */
export class PathLeaseLostError extends LeaseLostError {
  readonly code = 'PATH_LEASE_LOST';
  readonly kind = 'path_lease';
  constructor(
    readonly workspaceId: string,
    readonly token: number,
    readonly reason: LeaseLostReason,
  ) {
    super(
      `Path-lease grant ${token} in workspace ${workspaceId} is not held (${reason}). ` +
        'This holder lost its paths: stop writing there and acquire them again.',
    );
  }
}

/** Why `claimTask` or `submitTaskResult` refused. */
export type PathClaimRefusal =
  | 'task_has_no_workspace'
  | 'task_finished'
  | 'held_by_other_holder'
  | 'not_dispatch_holder';

/**
 * `claimTask` / `submitTaskResult` refused: the task has no workspace, is finished, another
 * holder holds its leases, or (a result by holder name) the task's active dispatch has no claim
 * by this holder.
 */
export class PathClaimRefusedError extends TaskfenceError {
  readonly code = 'PATH_CLAIM_REFUSED';
  constructor(
    readonly taskId: string,
    readonly holder: string,
    readonly reason: PathClaimRefusal,
    readonly detail: string,
  ) {
    super(`Task ${taskId} refused for holder ${JSON.stringify(holder)}: ${detail}.`);
  }
}

/** Path-scoped write leases (SPEC §5, seed 002): durable, per workspace, across processes. */
export interface PathLeaseRepository {
  /**
   * Leases every key of `paths` as one grant, or nothing: in one write transaction (serialized
   * per workspace) it looks for live leases that overlap any key — ancestors by equality,
   * descendants by one bytewise key range, never a scan of the workspace — and only if there are
   * none writes all the leases under a new fencing token. Every live lease blocks, whoever holds
   * it: the same holder name does not share (extend a grant with `renewPaths(lease)`). A live
   * workspace lock (`claimWorkspaceLock`) blocks too: it is the whole-workspace key. Expired
   * leases never block.
   *
   * @example
   * const r = await store.paths.tryAcquirePaths({ workspaceId, holder, paths: ['src/a.ts'], ttlMs: 30_000 });
   * if (r.status === 'busy') console.log(r.heldBy.conflicts); // [{ key: 'src', holder: 'agent-2', expiresAt, token }]
   * else await store.paths.releasePaths(r.lease);
   */
  tryAcquirePaths(input: AcquirePathsInput): Promise<TryAcquirePathsResult>;

  /**
   * Like `tryAcquirePaths`, but waits (jittered polling) until the whole set is free, then takes
   * it at once. It holds nothing while it waits, so waiters can never deadlock each other.
   * Throws `PathLeaseTimeoutError` naming the blockers after `timeoutMs`. Returns the leases
   * (an array, the 0.x shape) with the grant as `.lease`.
   *
   * @example
   * const { lease } = await store.paths.acquirePaths({ workspaceId, holder, paths: ['docs'], ttlMs: 30_000 }, { timeoutMs: 5_000 });
   */
  acquirePaths(input: AcquirePathsInput, options: AcquirePathsOptions): Promise<AcquiredPaths>;

  /**
   * Releases one grant: deletes the leases of `lease` (and of no other grant, whatever its
   * holder name) and returns their keys. A repeat release is a no-op (`released: []`); a grant
   * taken over after it lapsed (a later grant holds an overlapping key, or its task was claimed
   * again) throws `PathLeaseLostError` (`superseded`), a token never granted (`never_granted`).
   *
   * @example
   * await store.paths.releasePaths(claim.lease);
   */
  releasePaths(lease: PathLeaseGrant, options?: IdempotencyOptions): Promise<{ readonly released: readonly string[] }>;
  /**
   * @deprecated the 0.x form, removed in the next release: it deletes every lease of the holder
   * name in the workspace (only those on or below `paths`, if given), other processes' of the same
   * name included. Release the grant instead: `releasePaths(lease)`.
   *
   * @example
   * await store.paths.releasePaths({ workspaceId, holder, paths: ['src'] });
   */
  releasePaths(input: ReleasePathsInput): Promise<{ readonly released: readonly string[] }>;

  /**
   * Renews one grant: extends every live lease of `lease` to now + `ttlMs` (default
   * `DEFAULT_PATH_LEASE_TTL_MS`), serialized with acquisitions in the workspace, and returns the
   * renewed grant. A grant with no live lease left throws `PathLeaseLostError` (`expired`,
   * `released`, or `never_granted`): another grant may hold the paths now.
   *
   * @example
   * const lease = await store.paths.renewPaths(claim.lease, { ttlMs: 30_000 });
   */
  renewPaths(lease: PathLeaseGrant, options?: RenewPathLeaseOptions): Promise<PathLeaseGrant>;
  /**
   * @deprecated the 0.x form, by holder name, removed in the next release: use
   * `renewPaths(lease, { ttlMs })`.
   *
   * Extends the holder's live leases on or below `paths` (required) to now + `ttlMs`, atomically
   * with respect to acquisitions in the workspace. An expired lease is not revived: every key of
   * `paths` the holder no longer holds live is reported in `lost`, whether it expired, was taken
   * over by another holder or was released, since another holder may have the path now.
   *
   * @example
   * const { lost } = await store.paths.renewPaths({ workspaceId, holder, ttlMs: 30_000, paths: ['src'] });
   */
  renewPaths(input: RenewPathsInput): Promise<RenewPathsResult>;

  /** Live leases of a workspace (all holders, or one), ordered by key; for diagnostics and tests. An unknown workspace is a `NotFoundError`. */
  listPathLeases(filter: { readonly workspaceId: string; readonly holder?: string }): Promise<PathLease[]>;

  /** Deletes expired leases of a workspace (maintenance; they never block anyone anyway). Returns how many. */
  pruneExpiredPaths(workspaceId: string): Promise<number>;

  /**
   * Claims a task for `holder` by leasing its write set in the task's workspace, in one
   * transaction with marking it `in_progress`: `writes` omitted (null) leases the whole workspace,
   * which conflicts with every other lease there; a path list leases those paths (disjoint tasks
   * run in parallel); `[]` is dynamic mode: nothing is leased now and the holder calls
   * `acquirePaths({ …, taskId })` as it goes. Paths are normalized here (a bad stored path throws
   * `InvalidWritePathError`). A live workspace lock on the task's workspace conflicts with every
   * mode but the dynamic one. On conflict nothing changes and the blockers are returned. The
   * grant (`lease`) is the task's current claim: a later claim of the task, or a new dispatch of
   * it, supersedes it. Only a `ready`, `dispatched` or (a re-claim) `in_progress` task is claimed
   * (README "The work lifecycle"); any other unfinished one is `TaskTransitionRefusedError`. With
   * `dispatchLease` the claim is refused (`DispatchLeaseLostError`) unless that is the task's
   * active dispatch.
   *
   * @example
   * const r = await store.paths.claimTask(task.id, 'agent-1', { ttlMs: 30_000 });
   * if (r.status === 'acquired') await store.paths.submitTaskResult(task.id, r.lease, { status: 'done' });
   */
  claimTask(taskId: string, holder: string, options?: PathClaimOptions): Promise<PathClaimResult>;

  /**
   * Records a task's result (`done` or `failed`) and releases every lease of that task — claim
   * leases and dynamic ones taken with its `taskId` — in the same transaction. `lease` must be the
   * task's current claim (`claimTask`'s grant): a grant superseded by a later claim, even under
   * the same holder name, throws `PathLeaseLostError`. Refused with `PathClaimRefusedError` if the
   * task is already finished, and with `TaskTransitionRefusedError` unless it is `in_progress`
   * (claimed). In the same transaction the task's active dispatch ends (`completed` or `failed`)
   * and its dependents move on, as with `dispatches.completeDispatch`. The dispatch fence: with
   * `result.dispatchLease` the result is refused (`DispatchLeaseLostError`) unless that is the
   * task's active dispatch; without it, a new dispatch of the task supersedes every earlier claim,
   * so the grant of a worker whose dispatch was taken over is `PathLeaseLostError` (`superseded`).
   *
   * @example
   * await store.paths.submitTaskResult(task.id, claim.lease, { status: 'done' });
   */
  submitTaskResult(
    taskId: string,
    lease: PathLeaseGrant,
    result: PathTaskResult,
    options?: IdempotencyOptions,
  ): Promise<PathTaskSubmission>;
  /**
   * @deprecated the 0.x form, by holder name, removed in the next release: pass the claim's
   * grant. Refused with `PathClaimRefusedError` if another holder name holds a live lease of the
   * task, or (`not_dispatch_holder`) if the task has an active dispatch, no `dispatchLease` is
   * passed and the holder has no claim made under that dispatch.
   *
   * @example
   * await store.paths.submitTaskResult(task.id, 'agent-1', { status: 'done' });
   */
  submitTaskResult(
    taskId: string,
    holder: string,
    result: PathTaskResult,
    options?: IdempotencyOptions,
  ): Promise<PathTaskSubmission>;
}

/**
 * Each call's declared outcome (see shared/outcomes.ts). `renewPaths` has two forms: the grant
 * form returns the renewed grant or throws; the deprecated by-name form reports lost keys in `lost`.
 */
export const PATH_OUTCOMES: OutcomeDeclarations<PathLeaseRepository> = {
  tryAcquirePaths: claim,
  acquirePaths: grant,
  releasePaths: release,
  renewPaths: {
    returned: (r: RenewPathsResult | PathLeaseGrant) =>
      'kind' in r || r.lost.length === 0 ? { outcome: 'renewed' } : { outcome: 'lost', keys: r.lost },
    stale: 'lost',
  },
  listPathLeases: committed,
  pruneExpiredPaths: committed,
  claimTask: claim,
  submitTaskResult: release,
};
