/**
 * Workspace locks and task leases (seed 000, SPEC §4): expiring, fenced leases.
 *
 * Both tables hold one row per workspace / task that is never deleted: a claim bumps `token`
 * under the row lock and a release sets `holder` to NULL, so tokens increase strictly for the
 * life of the workspace or task (a fencing token). A holder that crashed loses the lease when it
 * expires; a holder that lost its lease can neither renew nor release it.
 */
import { sql, type CompiledQuery } from 'kysely';
import type { StoreContext } from './context.js';
import { prepared, runBound } from '../query/prepared.js';
import { requireCounter, requireId, requireInput, requirePositiveMs } from './validate.js';
import { lostReason, requireLease, type LeaseLostError } from './shared/lease.js';
import { isLiveGrant, readLeaseRowLocked, type LeaseFence } from './shared/fence.js';
import { tableIn } from '../query/schema.js';
import { CommitOutcomeUnknownError, DatabaseFaultError } from '../errors.js';
import {
  idempotentInOneTrip,
  keyedCall,
  keyedWrite,
  type IdempotencyOptions,
  type IdempotentCall,
} from './idempotent.js';
import { claimTaskLeaseWith, mapMissing, readTaskLease } from './shared/task-lease-claim.js';
import { anyLivePathLease } from './shared/workspace-exclusion.js';
import { pathsLockKey } from '../protocol.js';
import { decodePathLeaseKey } from '../domain/write-paths.js';
import { auditLeaseActs, auditsLeaseAct, grantedActs as granted, type LeaseActRecord } from './shared/audit.js';
import {
  DEFAULT_TASK_LEASE_TTL_MS,
  DEFAULT_WORKSPACE_LOCK_TTL_MS,
  StaleTaskLeaseError,
  StaleWorkspaceLockError,
  type CurrentLeaseState,
  type LockRepository,
  type RenewLeaseOptions,
  type TaskLease,
  type WorkspaceLock,
  type WorkspaceLockClaim,
} from './shared/leases.js';

function requireToken(value: unknown): number {
  return requireCounter('token', value, 'token a claim returned');
}

export interface LeaseRow {
  token: number;
  holder: string | null;
  expires_at: number | null;
}

export function currentState(row: LeaseRow | undefined): CurrentLeaseState | null {
  return row
    ? {
        token: Number(row.token),
        holder: row.holder,
        expiresAt: row.expires_at === null ? null : Number(row.expires_at),
      }
    : null;
}

// The fenced statements, prepared (see prepared.ts). A claim is one upsert: the row is never
// deleted, so `token + 1` is higher than every token granted before; PostgreSQL (READ COMMITTED)
// evaluates its WHERE on the latest row version under the row lock, SQLite inside BEGIN IMMEDIATE.
// No row back ⇒ someone holds a live lock. Renew and release match the token: a later claim has
// bumped it, so a stale holder matches nothing.

const CLAIM_WORKSPACE_LOCK = prepared(
  (db, p: { workspaceId: string; holder: string; runId: string; now: number; expiresAt: number }) => sql<{
    token: number;
    expires_at: number;
  }>`
    insert into ${tableIn(db, 'workspace_locks')} (workspace_id, holder, run_id, token, acquired_at, expires_at)
    values (${p.workspaceId}, ${p.holder}, ${p.runId}, 1, ${p.now}, ${p.expiresAt})
    on conflict (workspace_id) do update
      set holder = excluded.holder, run_id = excluded.run_id, token = workspace_locks.token + 1,
          acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
      where workspace_locks.holder is null or workspace_locks.expires_at <= ${p.now}
    returning token, expires_at`,
);

/**
 * `claimWorkspaceLock` in one call of `taskfence_claim_workspace_lock_v1` (migration 0109,
 * PostgreSQL): the first live path lease of the workspace (which blocks the claim) and, only when
 * there is none, the guarded upsert of `CLAIM_WORKSPACE_LOCK`, and when that granted nothing, the
 * lock row as it is now (what a `busy` answer names). One row always: the grant's token, or the
 * path lease, or the holder. Sent after the workspace's paths key was taken (BEGIN takes it).
 */
const CLAIM_WORKSPACE_LOCK_FN = prepared(
  (db, p: { workspaceId: string; holder: string; runId: string; now: number; expiresAt: number }) => sql<{
    token: number | null;
    expires_at: number | null;
    path_key: string | null;
    path_holder: string | null;
    path_token: number | null;
    path_expires_at: number | null;
    held_holder: string | null;
    held_run_id: string | null;
    held_token: number | null;
    held_acquired_at: number | null;
    held_expires_at: number | null;
  }>`select * from ${tableIn(db, 'taskfence_claim_workspace_lock_v1')}(${p.workspaceId}::text, ${p.holder}::text,
      ${p.runId}::text, ${p.now}::bigint, ${p.expiresAt}::bigint)`,
);

const RENEW_WORKSPACE_LOCK = prepared(
  (db, p: { workspaceId: string; token: number; now: number; expiresAt: number }) => sql<{
    holder: string;
    run_id: string;
    expires_at: number;
  }>`
    update ${tableIn(db, 'workspace_locks')} set expires_at = ${p.expiresAt}
    where workspace_id = ${p.workspaceId} and token = ${p.token} and holder is not null and expires_at > ${p.now}
    returning holder, run_id, expires_at`,
);

const RELEASE_WORKSPACE_LOCK = prepared(
  (db, p: { workspaceId: string; token: number; now: number }) => sql<{ token: number }>`
    update ${tableIn(db, 'workspace_locks')} set holder = null, run_id = null, expires_at = ${p.now}
    where workspace_id = ${p.workspaceId} and token = ${p.token} and holder is not null
    returning token`,
);

const RENEW_TASK_LEASE = prepared(
  (db, p: { taskId: string; token: number; now: number; expiresAt: number }) => sql<{
    holder: string;
    expires_at: number;
  }>`
    update ${tableIn(db, 'task_leases')} set expires_at = ${p.expiresAt}
    where task_id = ${p.taskId} and token = ${p.token} and holder is not null and expires_at > ${p.now}
    returning holder, expires_at`,
);

const RELEASE_TASK_LEASE = prepared(
  (db, p: { taskId: string; token: number; now: number }) => sql<{ token: number }>`
    update ${tableIn(db, 'task_leases')} set holder = null, expires_at = ${p.now}
    where task_id = ${p.taskId} and token = ${p.token} and holder is not null
    returning token`,
);

/**
 * The lease a renew or release call names: the lease itself, or (the form kept for one release)
 * the resource id and `{ token }`. Validated before any statement.
 */
function leaseArgument<K extends 'workspace_lock' | 'task_lease'>(
  kind: K,
  idField: string,
  first: unknown,
  second: unknown,
): {
  resource: string;
  /** The lease's holder; null for the deprecated form, which names none. */
  holder: string | null;
  token: number;
  ttlMs: number | undefined;
  expiresAt: number | null;
  options: IdempotencyOptions;
} {
  if (typeof first === 'string') {
    const resource = requireId(idField, first);
    const input = requireInput('input', second) as { token?: unknown; ttlMs?: unknown } & IdempotencyOptions;
    return {
      resource,
      holder: null,
      token: requireToken(input.token),
      ttlMs: input.ttlMs as number | undefined,
      expiresAt: null,
      options: input,
    };
  }
  const lease = requireLease(kind, first);
  const options = second === undefined ? {} : (requireInput('options', second) as RenewLeaseOptions);
  return {
    resource: lease.resource,
    holder: lease.holder,
    token: lease.token,
    ttlMs: options.ttlMs,
    expiresAt: lease.expiresAt,
    options,
  };
}

// The typed refusals a keyed renew or release stores (a claim answers `busy`, a result).
const WORKSPACE_LOCK_REFUSALS = [StaleWorkspaceLockError];
const TASK_LEASE_REFUSALS = [StaleTaskLeaseError];

/**
 * `tx.assertLease` for a workspace lock: the lock row, read `FOR SHARE` on PostgreSQL, must carry
 * the lease's token, a holder and an unexpired lease; otherwise `StaleWorkspaceLockError`.
 */
export const fenceWorkspaceLock: LeaseFence = async (ctx, trx, lease) => {
  const row = await readLeaseRowLocked(
    ctx,
    trx
      .selectFrom('workspace_locks')
      .select(['token', 'holder', 'expires_at'])
      .where('workspace_id', '=', lease.resource),
  );
  if (isLiveGrant(row, lease.token, ctx.clock.now())) return;
  throw new StaleWorkspaceLockError(
    lease.resource,
    lease.token,
    lostReason(currentState(row), lease.token),
    currentState(row),
  );
};

/** `tx.assertLease` for a task lease (the same fence as `fenceWorkspaceLock`); otherwise `StaleTaskLeaseError`. */
export const fenceTaskLease: LeaseFence = async (ctx, trx, lease) => {
  const row = await readLeaseRowLocked(
    ctx,
    trx.selectFrom('task_leases').select(['token', 'holder', 'expires_at']).where('task_id', '=', lease.resource),
  );
  if (isLiveGrant(row, lease.token, ctx.clock.now())) return;
  throw new StaleTaskLeaseError(
    lease.resource,
    lease.token,
    lostReason(currentState(row), lease.token),
    currentState(row),
  );
};

/** The trail's row of a release; the deprecated `{ token }` form names no holder. */
function released(kind: 'workspace_lock' | 'task_lease', resource: string, holder: string | null, token: number) {
  return { act: 'released', kind, resource, holder: holder ?? '(not given)', token } satisfies LeaseActRecord;
}

/** Builds `store.locks` on a store context; every claim, renew and release is one write transaction. */
export function createLockRepository(ctx: StoreContext): LockRepository {
  const { dialect } = ctx;
  const db = dialect.db;

  const readWorkspaceLock = (trx: typeof db, workspaceId: string) =>
    trx
      .selectFrom('workspace_locks')
      .select(['token', 'holder', 'expires_at'])
      .where('workspace_id', '=', workspaceId)
      .executeTakeFirst();

  /** The lost-lease error for `token` against the row as it is now. */
  const workspaceLockLost = (workspaceId: string, token: number, row: LeaseRow | undefined): LeaseLostError =>
    new StaleWorkspaceLockError(workspaceId, token, lostReason(currentState(row), token), currentState(row));
  const taskLeaseLost = (taskId: string, token: number, row: LeaseRow | undefined): LeaseLostError =>
    new StaleTaskLeaseError(taskId, token, lostReason(currentState(row), token), currentState(row));

  /**
   * A release that matched nothing (the lease protocol's release rule): a repeat release is a
   * no-op while nobody was granted the lock after this token, or while this token's lease has not
   * lapsed (nobody can take over a live lease, so a later grant proves this holder released it).
   * A token taken over after it lapsed is superseded. The deprecated `{ token }` form carries no
   * `expiresAt`, so only the first holds for it.
   */
  /** A release in one round trip (`idempotentInOneTrip`): PostgreSQL, unkeyed, its act not audited. */
  const releaseOnce = (call: IdempotentCall | null) =>
    dialect.writableCtes && call === null && !auditsLeaseAct(ctx, 'released');
  /** The release matched its row: done. Nothing matched: explained by the ordinary path. */
  const releasedRow = (rows: readonly unknown[]) => (rows.length > 0 ? { value: undefined } : null);

  const releasedAlready = (row: LeaseRow | undefined, token: number, expiresAt: number | null, now: number) =>
    row !== undefined &&
    ((Number(row.token) === token && row.holder === null) ||
      (Number(row.token) > token && expiresAt !== null && now < expiresAt));

  /**
   * A workspace lock's or task lease's release: `release` (bound) in one round trip when it can
   * be (`releaseOnce`), else in a transaction that explains a miss under the release rule.
   */
  const releaseLease = (
    call: IdempotentCall | null,
    release: CompiledQuery<{ token: number }>,
    lease: {
      token: number;
      act: LeaseActRecord;
      read: (trx: typeof db) => Promise<LeaseRow | undefined>;
      expiresAt: number | null;
      lost: (row: LeaseRow | undefined) => LeaseLostError;
    },
  ) =>
    idempotentInOneTrip(ctx, releaseOnce(call), release, releasedRow, () =>
      keyedWrite(
        ctx,
        call,
        async (trx) => {
          // Matching the token is the whole fence: a later claim has bumped it, so a stale holder matches nothing.
          if ((dialect.beginResult(release) ?? (await runBound(trx, release))).rows[0]) {
            await auditLeaseActs(ctx, trx, ctx.clock.now(), [lease.act]);
            return;
          }
          const current = await lease.read(trx);
          if (releasedAlready(current, lease.token, lease.expiresAt, ctx.clock.now())) return;
          throw lease.lost(current);
        },
        undefined,
        release,
      ),
    );

  async function renewWorkspaceLock(first: unknown, second?: unknown): Promise<WorkspaceLock> {
    const args = leaseArgument('workspace_lock', 'workspaceId', first, second);
    const { resource: workspaceId, token } = args;
    const ttlMs = args.ttlMs === undefined ? DEFAULT_WORKSPACE_LOCK_TTL_MS : requirePositiveMs('ttlMs', args.ttlMs);
    const call = keyedCall(
      'locks.renewWorkspaceLock',
      args.options,
      { workspaceId, token, ttlMs },
      WORKSPACE_LOCK_REFUSALS,
    );
    return keyedWrite(ctx, call, async (trx) => {
      const now = ctx.clock.now();
      // Only the latest grant, still held and not yet expired, may extend its lease.
      const row = await RENEW_WORKSPACE_LOCK.first(trx, { workspaceId, token, now, expiresAt: now + ttlMs });
      if (row) {
        await auditLeaseActs(ctx, trx, now, [
          {
            act: 'renewed',
            kind: 'workspace_lock',
            resource: workspaceId,
            holder: row.holder,
            token,
            detail: { runId: row.run_id, expiresAt: Number(row.expires_at) },
          },
        ]);
        return Object.freeze({
          kind: 'workspace_lock' as const,
          resource: workspaceId,
          holder: row.holder,
          runId: row.run_id,
          token,
          expiresAt: Number(row.expires_at),
        });
      }
      throw workspaceLockLost(workspaceId, token, await readWorkspaceLock(trx, workspaceId));
    });
  }

  async function releaseWorkspaceLock(first: unknown, second?: unknown): Promise<void> {
    const {
      resource: workspaceId,
      holder,
      token,
      expiresAt,
      options,
    } = leaseArgument('workspace_lock', 'workspaceId', first, second);
    const call = keyedCall('locks.releaseWorkspaceLock', options, { workspaceId, token }, WORKSPACE_LOCK_REFUSALS);
    // Bound before BEGIN, which sends it (PostgreSQL, one round trip less): its time only stamps
    // the released row; the miss reads the time again.
    const release = RELEASE_WORKSPACE_LOCK.bind(db, { workspaceId, token, now: ctx.clock.now() });
    await releaseLease(call, release, {
      token,
      act: released('workspace_lock', workspaceId, holder, token),
      read: (trx) => readWorkspaceLock(trx, workspaceId),
      expiresAt,
      lost: (row) => workspaceLockLost(workspaceId, token, row),
    });
  }

  async function renewTaskLease(first: unknown, second?: unknown): Promise<TaskLease> {
    const args = leaseArgument('task_lease', 'taskId', first, second);
    const { resource: taskId, token } = args;
    const ttlMs = args.ttlMs === undefined ? DEFAULT_TASK_LEASE_TTL_MS : requirePositiveMs('ttlMs', args.ttlMs);
    const call = keyedCall('locks.renewTaskLease', args.options, { taskId, token, ttlMs }, TASK_LEASE_REFUSALS);
    return keyedWrite(ctx, call, async (trx) => {
      const now = ctx.clock.now();
      const row = await RENEW_TASK_LEASE.first(trx, { taskId, token, now, expiresAt: now + ttlMs });
      if (row) {
        await auditLeaseActs(ctx, trx, now, [
          {
            act: 'renewed',
            kind: 'task_lease',
            resource: taskId,
            holder: row.holder,
            token,
            detail: { expiresAt: Number(row.expires_at) },
          },
        ]);
        return Object.freeze({
          kind: 'task_lease' as const,
          resource: taskId,
          holder: row.holder,
          token,
          expiresAt: Number(row.expires_at),
        });
      }
      throw taskLeaseLost(taskId, token, await readTaskLease(trx, taskId));
    });
  }

  async function releaseTaskLease(first: unknown, second?: unknown): Promise<void> {
    const {
      resource: taskId,
      holder,
      token,
      expiresAt,
      options,
    } = leaseArgument('task_lease', 'taskId', first, second);
    const call = keyedCall('locks.releaseTaskLease', options, { taskId, token }, TASK_LEASE_REFUSALS);
    const release = RELEASE_TASK_LEASE.bind(db, { taskId, token, now: ctx.clock.now() });
    await releaseLease(call, release, {
      token,
      act: released('task_lease', taskId, holder, token),
      read: (trx) => readTaskLease(trx, taskId),
      expiresAt,
      lost: (row) => taskLeaseLost(taskId, token, row),
    });
  }

  return {
    async claimWorkspaceLock(workspaceId, input) {
      requireId('workspaceId', workspaceId);
      requireInput('input', input);
      const holder = requireId('holder', input.holder);
      const runId = requireId('runId', input.runId);
      const ttlMs = input.ttlMs === undefined ? DEFAULT_WORKSPACE_LOCK_TTL_MS : requirePositiveMs('ttlMs', input.ttlMs);
      const call = keyedCall('locks.claimWorkspaceLock', input, { workspaceId, holder, runId, ttlMs }, []);
      // PostgreSQL without a trail of lost holders: the path check, the claim and the read of the
      // holder in one function call (0109), bound before BEGIN, which sends it after taking the
      // paths key. Its time is read before the lock, so it is early: a lapse or a path lease is
      // judged live a little longer, and the new lease ends a little early, never late.
      const claimedAt = ctx.clock.now();
      const foldedClaim =
        dialect.writableCtes && !auditsLeaseAct(ctx, 'lost')
          ? CLAIM_WORKSPACE_LOCK_FN.bind(db, {
              workspaceId,
              holder,
              runId,
              now: claimedAt,
              expiresAt: claimedAt + ttlMs,
            })
          : undefined;
      // Unkeyed, with no grant to audit: the whole claim in one round trip, BEGIN carrying the
      // function's call and COMMIT (a busy claim writes nothing). A connection lost in that
      // round trip leaves the outcome unknown; the claim is then run again as an ordinary
      // transaction (`resolving`), which finds this call's own grant if it committed: the row
      // still names this holder and run, stamped with this call's `claimedAt` and expiry, and is live.
      const oneTrip = foldedClaim !== undefined && call === null && !auditsLeaseAct(ctx, 'granted');
      const ownGrant = (held: {
        holder: string | null;
        run_id: string | null;
        acquired_at?: number | null;
        expires_at: number | null;
      }) =>
        held.holder === holder &&
        held.run_id === runId &&
        Number(held.acquired_at) === claimedAt &&
        Number(held.expires_at) === claimedAt + ttlMs;
      /** This call's lease, granted under `token` until `expiresAt`. */
      const grantOf = (token: number | null, expiresAt: number | null) =>
        Object.freeze({
          kind: 'workspace_lock' as const,
          resource: workspaceId,
          holder,
          runId,
          token: Number(token),
          expiresAt: Number(expiresAt),
        });
      const attempt = (once: boolean, resolving: boolean) =>
        mapMissing(ctx, 'workspace', workspaceId, () =>
          keyedWrite(
            ctx,
            call,
            async (trx): Promise<WorkspaceLockClaim> => {
              // One exclusion rule per workspace: the lock is the whole-workspace path key, so it is
              // claimed under the workspace's paths key (protocol.ts, level 7) and a live path lease blocks it.
              await dialect.lockKey(trx, pathsLockKey(workspaceId));
              const now = foldedClaim ? claimedAt : ctx.clock.now();
              const expiresAt = now + ttlMs;
              const folded = foldedClaim
                ? (dialect.beginResult(foldedClaim) ?? (await runBound(trx, foldedClaim))).rows[0]
                : undefined;
              const path =
                folded === undefined
                  ? await anyLivePathLease(trx, workspaceId, now)
                  : folded.path_holder === null
                    ? null
                    : {
                        key: decodePathLeaseKey(folded.path_key!),
                        holder: folded.path_holder,
                        expiresAt: Number(folded.path_expires_at),
                        token: folded.path_token === null ? null : Number(folded.path_token),
                      };
              if (path)
                return {
                  status: 'busy',
                  heldBy: {
                    holder: path.holder,
                    runId: null,
                    token: path.token ?? 0,
                    expiresAt: path.expiresAt,
                    pathKey: path.key,
                  },
                };
              // The trail names the holder a claim takes a lapsed lock over from: read before the claim.
              const before = auditsLeaseAct(ctx, 'lost') ? await readWorkspaceLock(trx, workspaceId) : undefined;
              const row =
                folded === undefined
                  ? await CLAIM_WORKSPACE_LOCK.first(trx, { workspaceId, holder, runId, now, expiresAt })
                  : folded.token === null
                    ? undefined
                    : { token: folded.token, expires_at: folded.expires_at! };
              if (row) {
                const lease = grantOf(row.token, row.expires_at);
                await auditLeaseActs(
                  ctx,
                  trx,
                  now,
                  granted(
                    'workspace_lock',
                    workspaceId,
                    holder,
                    lease.token,
                    { runId, expiresAt: lease.expiresAt },
                    before,
                  ),
                );
                return { status: 'acquired', lease };
              }
              const held =
                folded === undefined
                  ? await trx
                      .selectFrom('workspace_locks')
                      .select(['holder', 'run_id', 'token', 'acquired_at', 'expires_at'])
                      .where('workspace_id', '=', workspaceId)
                      .executeTakeFirstOrThrow()
                  : {
                      holder: folded.held_holder,
                      run_id: folded.held_run_id,
                      token: Number(folded.held_token),
                      acquired_at: folded.held_acquired_at,
                      expires_at: folded.held_expires_at,
                    };
              // After a lost round trip: the live lock is this call's own grant, which committed.
              if (resolving && ownGrant(held))
                return {
                  status: 'acquired',
                  lease: grantOf(held.token, held.expires_at),
                };
              return {
                status: 'busy',
                heldBy: {
                  holder: held.holder!,
                  runId: held.run_id,
                  token: Number(held.token),
                  expiresAt: Number(held.expires_at),
                },
              };
            },
            [pathsLockKey(workspaceId)],
            foldedClaim,
            once,
          ),
        );
      if (!oneTrip) return attempt(false, false);
      try {
        return await attempt(true, false);
      } catch (error) {
        if (!(error instanceof CommitOutcomeUnknownError)) throw error;
        try {
          return await attempt(false, true);
        } catch (again) {
          // Still unreachable: the outcome is still unknown.
          throw again instanceof DatabaseFaultError ? error : again;
        }
      }
    },

    renewWorkspaceLock: renewWorkspaceLock,
    releaseWorkspaceLock: releaseWorkspaceLock,

    async getWorkspaceLock(workspaceId) {
      requireId('workspaceId', workspaceId);
      const row = await db
        .selectFrom('workspace_locks')
        .select(['holder', 'run_id', 'token', 'expires_at'])
        .where('workspace_id', '=', workspaceId)
        .where('holder', 'is not', null)
        .where('expires_at', '>', ctx.clock.now())
        .executeTakeFirst();
      return row
        ? { holder: row.holder!, runId: row.run_id, token: Number(row.token), expiresAt: Number(row.expires_at) }
        : null;
    },

    async claimTaskLease(taskId, input) {
      requireId('taskId', taskId);
      requireInput('input', input);
      const holder = requireId('holder', input.holder);
      const ttlMs = input.ttlMs === undefined ? DEFAULT_TASK_LEASE_TTL_MS : requirePositiveMs('ttlMs', input.ttlMs);
      return claimTaskLeaseWith(ctx, taskId, { holder, ttlMs, idempotencyKey: input.idempotencyKey });
    },

    renewTaskLease: renewTaskLease,
    releaseTaskLease: releaseTaskLease,

    async getTaskLease(taskId) {
      requireId('taskId', taskId);
      const row = await db
        .selectFrom('task_leases')
        .select(['holder', 'token', 'expires_at'])
        .where('task_id', '=', taskId)
        .where('holder', 'is not', null)
        .where('expires_at', '>', ctx.clock.now())
        .executeTakeFirst();
      return row ? { holder: row.holder!, token: Number(row.token), expiresAt: Number(row.expires_at) } : null;
    },
  };
}
