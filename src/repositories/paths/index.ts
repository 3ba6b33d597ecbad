/**
 * `store.paths` (SPEC §5): path-scoped write leases. The guarantees are stated on
 * `PathLeaseRepository` (types.ts); the statements are in statements.ts, the acquisition in
 * acquire.ts, a task's claim and result in claims.ts.
 */
import { InvalidArgumentError, NotFoundError } from '../../errors.js';
import { leaseKeys, WHOLE_WORKSPACE_KEY, decodePathLeaseKey } from '../../domain/write-paths.js';
import type { PathLeaseRow } from '../../schema/database.js';
import { clampTimerMs } from '../../timers.js';
import type { StoreContext } from '../context.js';
import { pathsLockKey, pathsTopic } from '../../protocol.js';
import { requireLease } from '../shared/lease.js';
import {
  optionalId,
  optionalIdFilter,
  optionalInput,
  requireId,
  requireInput,
  requirePathList,
  requirePositiveMs,
} from '../validate.js';
import { keyedCall, keyedWrite, type IdempotencyOptions } from '../idempotent.js';
import { acquireKeys, tokenRowLock } from './acquire.js';
import { CLAIM_REFUSALS, claimTask, SUBMIT_REFUSALS, submitTaskResult } from './claims.js';
import { GRANT_REFUSALS, isGrant, releaseGrant, renewGrant, requirePathGrant } from './grants.js';
import { chunked, descendantRanges, RANGE_CHUNK, RELEASE, RENEW, toPathLease } from './statements.js';
import {
  DEFAULT_PATH_LEASE_TTL_MS,
  PathLeaseTimeoutError,
  type TryAcquirePathsResult,
  type AcquirePathsInput,
  type PathLeaseGrant,
  type PathLeaseRepository,
  type PathTaskResult,
  type ReleasePathsInput,
  type RenewPathLeaseOptions,
  type RenewPathsInput,
  type RenewPathsResult,
} from './types.js';

/**
 * Builds `store.paths` on a store context. Every write runs in `dialect.writeTransaction`; the
 * per-workspace `lockKey('paths:<workspace>')` serializes conflict check and insert on PostgreSQL
 * (SQLite's BEGIN IMMEDIATE already does).
 *
 * @example
 * const paths = createPathLeaseRepository(createStoreContext(dialect));
 */
export function createPathLeaseRepository(ctx: StoreContext): PathLeaseRepository {
  const { dialect } = ctx;

  function checkAcquireInput(input: AcquirePathsInput) {
    requireInput('input', input);
    const workspaceId = requireId('workspaceId', input.workspaceId);
    const holder = requireId('holder', input.holder);
    const ttlMs = requirePositiveMs('ttlMs', input.ttlMs);
    const keys = leaseKeys(requirePathList('paths', input.paths));
    const taskId = optionalId('taskId', input.taskId);
    return { workspaceId, holder, ttlMs, keys, taskId };
  }

  /** A keyed attempt that found the paths busy: rolled back with its key, so a later attempt may still acquire. */
  class BusyAttempt extends Error {
    constructor(readonly result: TryAcquirePathsResult) {
      super('busy attempt');
    }
  }

  const repo: PathLeaseRepository = {
    async tryAcquirePaths(input) {
      const { workspaceId, holder, ttlMs, keys, taskId } = checkAcquireInput(input);
      const call = keyedCall('paths.tryAcquirePaths', input, { workspaceId, holder, ttlMs, keys, taskId }, []);
      // PostgreSQL: BEGIN takes the workspace's key and its token row, then one statement grants (3 round trips).
      const tokenRow = tokenRowLock(ctx, workspaceId);
      const held = tokenRow ? { tokenRow } : undefined;
      return keyedWrite(
        ctx,
        call,
        (trx) => acquireKeys(ctx, trx, workspaceId, holder, keys, ttlMs, taskId, held),
        [pathsLockKey(workspaceId)],
        tokenRow ?? undefined,
      );
    },

    async acquirePaths(input, options) {
      const { workspaceId, holder, ttlMs, keys, taskId } = checkAcquireInput(input);
      requireInput('options', options);
      const timeoutMs = requirePositiveMs('timeoutMs', options.timeoutMs, 0);
      const maxPollMs = options.maxPollMs === undefined ? undefined : requirePositiveMs('maxPollMs', options.maxPollMs);
      // A real-time deadline: waiting is a duration, and a test's frozen store clock must not make it endless.
      const deadline = performance.now() + timeoutMs;
      // Keyed, only the acquiring attempt is recorded (a busy one rolls back with its key): a retry
      // of a wait that acquired returns its grant; one that timed out waits again.
      const call = keyedCall('paths.acquirePaths', input, { workspaceId, holder, ttlMs, keys, taskId }, []);
      const tokenRow = tokenRowLock(ctx, workspaceId);
      const held = tokenRow ? { tokenRow } : undefined;
      const attempt = (trx: Parameters<typeof acquireKeys>[1]) =>
        acquireKeys(ctx, trx, workspaceId, holder, keys, ttlMs, taskId, held).then((r) => {
          if (call !== null && r.status === 'busy') throw new BusyAttempt(r);
          return r;
        });
      for (;;) {
        // Subscribe before trying: a release committed between the try and the wait still wakes us.
        const wake = dialect.wakeups.subscribe(pathsTopic(workspaceId), maxPollMs);
        const result = await keyedWrite(ctx, call, attempt, [pathsLockKey(workspaceId)], tokenRow ?? undefined).catch(
          (error: unknown) => {
            if (error instanceof BusyAttempt) return error.result;
            wake.cancel();
            throw error;
          },
        );
        if (result.status === 'acquired') {
          wake.cancel();
          return Object.assign([...result.leases], { lease: result.lease });
        }
        const left = deadline - performance.now();
        if (left <= 0) {
          wake.cancel();
          throw new PathLeaseTimeoutError(workspaceId, holder, keys, timeoutMs, result.conflicts);
        }
        // Woken by a release in this workspace, or after the fallback interval, or at the deadline.
        const deadlineTimer = setTimeout(() => wake.cancel(), clampTimerMs(left));
        await wake.woken;
        clearTimeout(deadlineTimer);
      }
    },

    releasePaths: async (input: ReleasePathsInput | PathLeaseGrant, options?: IdempotencyOptions) => {
      if (isGrant(input)) {
        const lease = requirePathGrant(input);
        const opts = optionalInput('options', options);
        return releaseGrant(ctx, lease, keyedCall('paths.releasePaths', opts, { lease }, GRANT_REFUSALS));
      }
      requireInput('input', input);
      const workspaceId = requireId('workspaceId', input.workspaceId);
      const holder = requireId('holder', input.holder);
      const keys = input.paths === undefined ? null : leaseKeys(requirePathList('paths', input.paths));
      if (keys !== null && keys.length === 0) return { released: [] };
      const call = keyedCall('paths.releasePaths', input, { workspaceId, holder, keys }, []);
      const rows = await keyedWrite(ctx, call, async (trx) => {
        await dialect.wakeups.notify(trx, pathsTopic(workspaceId));
        if (keys === null) return RELEASE.execute(trx, { workspaceId, holder, froms: [], tos: [] }, -1);
        const released: { lease_key: string }[] = [];
        for (const chunk of chunked(keys, RANGE_CHUNK)) {
          released.push(
            ...(await RELEASE.execute(trx, { workspaceId, holder, ...descendantRanges(chunk) }, chunk.length)),
          );
        }
        return released;
      });
      return { released: rows.map((r) => decodePathLeaseKey(r.lease_key)).sort() };
    },

    // One implementation of both forms; the deprecated one returns `RenewPathsResult`.
    renewPaths: (async (
      input: RenewPathsInput | PathLeaseGrant,
      options?: RenewPathLeaseOptions,
    ): Promise<PathLeaseGrant | RenewPathsResult> => {
      if (isGrant(input)) {
        const opts = options === undefined ? {} : requireInput('options', options);
        const ttlMs = opts.ttlMs === undefined ? DEFAULT_PATH_LEASE_TTL_MS : requirePositiveMs('ttlMs', opts.ttlMs);
        const lease = requirePathGrant(input);
        return renewGrant(ctx, lease, ttlMs, keyedCall('paths.renewPaths', opts, { lease, ttlMs }, GRANT_REFUSALS));
      }
      requireInput('input', input);
      const workspaceId = requireId('workspaceId', input.workspaceId);
      const holder = requireId('holder', input.holder);
      const ttlMs = requirePositiveMs('ttlMs', input.ttlMs);
      if (input.paths === undefined || input.paths === null) {
        throw new InvalidArgumentError(
          'paths',
          'is required: pass the paths the holder expects to hold, so that renewal can report the ones it lost',
        );
      }
      const keys = leaseKeys(requirePathList('paths', input.paths));
      if (keys.length === 0) return { renewed: [], lost: [] };
      const call = keyedCall('paths.renewPaths', input, { workspaceId, holder, ttlMs, keys }, []);
      const rows = await keyedWrite(
        ctx,
        call,
        async (trx) => {
          // Serialized with acquisitions: a lease seen live here cannot be taken over meanwhile.
          await dialect.lockKey(trx, pathsLockKey(workspaceId));
          const now = ctx.clock.now();
          const extended: PathLeaseRow[] = [];
          // The keys are an antichain, so their ranges are disjoint: no lease is renewed twice.
          for (const chunk of chunked(keys, RANGE_CHUNK)) {
            const params = { workspaceId, holder, now, expiresAt: now + ttlMs, ...descendantRanges(chunk) };
            extended.push(...(await RENEW.execute(trx, params, chunk.length)));
          }
          return extended;
        },
        [pathsLockKey(workspaceId)],
      );
      const renewed = rows.map(toPathLease).sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
      // A key is kept if a renewed lease is on or below it: the key is the lease's key or one of its ancestors.
      const asked = new Set(keys);
      const kept = new Set<string>();
      for (const { key } of renewed) {
        if (asked.has(WHOLE_WORKSPACE_KEY)) kept.add(WHOLE_WORKSPACE_KEY);
        for (let end = key.length; end > 0; end = key.lastIndexOf('/', end - 1)) {
          const prefix = key.slice(0, end);
          if (asked.has(prefix)) kept.add(prefix);
        }
      }
      return { renewed, lost: keys.filter((k) => !kept.has(k)) };
    }) as PathLeaseRepository['renewPaths'],

    async listPathLeases(filter) {
      requireInput('filter', filter);
      const workspaceId = requireId('workspaceId', filter.workspaceId);
      const holder = optionalIdFilter('holder', filter.holder);
      let query = dialect.db
        .selectFrom('path_leases')
        .selectAll()
        .where('workspace_id', '=', workspaceId)
        .where('expires_at', '>', ctx.clock.now());
      if (holder !== undefined) query = query.where('holder', '=', holder);
      const rows = await query.orderBy('lease_key').orderBy('holder').execute();
      if (
        rows.length === 0 &&
        !(await dialect.db.selectFrom('workspaces').select('id').where('id', '=', workspaceId).executeTakeFirst())
      ) {
        throw new NotFoundError('workspace', workspaceId);
      }
      return rows.map(toPathLease);
    },

    async pruneExpiredPaths(workspaceId) {
      requireId('workspaceId', workspaceId);
      const result = await dialect.writeTransaction((trx) =>
        trx
          .deleteFrom('path_leases')
          .where('workspace_id', '=', workspaceId)
          .where('expires_at', '<=', ctx.clock.now())
          .executeTakeFirst(),
      );
      return Number(result.numDeletedRows);
    },

    async claimTask(taskId, holder, options) {
      requireId('taskId', taskId);
      requireId('holder', holder);
      const opts = optionalInput('options', options);
      const ttlMs = requirePositiveMs('ttlMs', opts.ttlMs ?? DEFAULT_PATH_LEASE_TTL_MS);
      const dispatchLease =
        opts.dispatchLease === undefined
          ? undefined
          : requireLease('dispatch', opts.dispatchLease, 'options.dispatchLease');
      return claimTask(
        ctx,
        taskId,
        holder,
        ttlMs,
        dispatchLease,
        keyedCall('paths.claimTask', opts, { taskId, holder, ttlMs, dispatchLease }, CLAIM_REFUSALS),
      );
    },

    submitTaskResult: async (
      taskId: string,
      by: string | PathLeaseGrant,
      result: PathTaskResult,
      options?: IdempotencyOptions,
    ) => {
      requireId('taskId', taskId);
      const holder = isGrant(by) ? requirePathGrant(by, 'lease') : requireId('holder', by);
      const { status, dispatchLease } = requireInput('result', result);
      if (status !== 'done' && status !== 'failed')
        throw new InvalidArgumentError('result.status', "must be 'done' or 'failed'");
      const fence =
        dispatchLease === undefined ? undefined : requireLease('dispatch', dispatchLease, 'result.dispatchLease');
      const call = keyedCall(
        'paths.submitTaskResult',
        optionalInput('options', options),
        { taskId, by: holder, status, dispatchLease: fence },
        SUBMIT_REFUSALS,
      );
      return submitTaskResult(ctx, taskId, holder, status, fence, call);
    },
  };
  return repo;
}
