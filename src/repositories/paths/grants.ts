/**
 * One path-lease grant (schema 0095): the leases one acquisition wrote under one fencing token.
 * Renew, release and `tx.assertLease` address a grant by (workspace, token, holder), never by
 * holder name alone, so two processes that use the same holder name never touch each other's
 * leases and a stale grant is told from the current one.
 */
import type { CompiledQuery, Kysely, Transaction } from 'kysely';
import { decodePathLeaseKey } from '../../domain/write-paths.js';
import { InvalidArgumentError } from '../../errors.js';
import type { Database } from '../../schema/database.js';
import type { StoreContext } from '../context.js';
import { readLeaseRowLocked, type LeaseFence } from '../shared/fence.js';
import { requireLease, type LeaseLostReason } from '../shared/lease.js';
import { pathsLockKey, pathsTopic } from '../../protocol.js';
import { auditLeaseActs, auditsLeaseAct } from '../shared/audit.js';
import { idempotentInOneTrip, keyedWrite, type IdempotentCall } from '../idempotent.js';
import { optionalId } from '../validate.js';
import { findConflicts } from './acquire.js';
import { RENEW_IF_LIVE } from './statements.js';
import { prepared, runBound } from '../../query/prepared.js';
import { PathLeaseLostError, type PathLeaseGrant } from './types.js';
import { extend } from '../../objects.js';

type Trx = Transaction<Database>;

/** A value passed where a grant or the deprecated input object may go: a grant names its `kind`. */
export function isGrant(value: unknown): value is PathLeaseGrant {
  return typeof value === 'object' && value !== null && 'kind' in value;
}

/** Checks that `value` is a path-lease grant as a claim returned it, before any statement runs. */
export function requirePathGrant(value: unknown, field = 'lease'): PathLeaseGrant {
  const lease = requireLease('path_lease', value, field);
  const { keys, taskId, workspaceId } = value as Partial<PathLeaseGrant>;
  if (workspaceId !== undefined && workspaceId !== lease.resource)
    throw new InvalidArgumentError(
      `${field}.workspaceId`,
      'must equal lease.resource (pass the lease the claim returned)',
    );
  if (!Array.isArray(keys) || !keys.every((k) => typeof k === 'string'))
    throw new InvalidArgumentError(`${field}.keys`, 'must be the array of keys the claim returned');
  return Object.freeze(
    extend(lease, {
      workspaceId: lease.resource,
      keys: Object.freeze([...keys]),
      taskId: optionalId(`${field}.taskId`, taskId) ?? null,
    }),
  );
}

/** The latest token granted in the workspace, or 0. */
async function latestToken(trx: Trx, workspaceId: string): Promise<number> {
  const row = await trx
    .selectFrom('path_lease_tokens')
    .select('token')
    .where('workspace_id', '=', workspaceId)
    .executeTakeFirst();
  return row ? Number(row.token) : 0;
}

/**
 * Why a grant has no live lease: its rows lapsed (`expired`), or they are gone: released (or
 * pruned after expiry, which the grant's own `expiresAt` tells), or never granted; a grant whose
 * task was claimed again since is `superseded`.
 */
async function lostGrantReason(trx: Trx, lease: PathLeaseGrant, now: number): Promise<LeaseLostReason> {
  const row = await trx
    .selectFrom('path_leases')
    .select('expires_at')
    .where('workspace_id', '=', lease.resource)
    .where('token', '=', lease.token)
    .where('holder', '=', lease.holder)
    .executeTakeFirst();
  if (row) return 'expired';
  if (lease.token > (await latestToken(trx, lease.resource))) return 'never_granted';
  if (lease.taskId !== null) {
    const claim = await trx
      .selectFrom('path_lease_claims')
      .select('token')
      .where('task_id', '=', lease.taskId)
      .executeTakeFirst();
    if (claim && Number(claim.token) > lease.token) return 'superseded';
  }
  return lease.expiresAt <= now ? 'expired' : 'released';
}

/**
 * Whether `lease` lapsed and someone was granted (part of) it after: its task was claimed again,
 * or a later grant holds a key that overlaps one of its keys. While the grant has not lapsed, a
 * later overlapping grant proves that this holder released it (every live lease blocks).
 */
async function isSuperseded(trx: Trx, lease: PathLeaseGrant, now: number): Promise<boolean> {
  if (lease.expiresAt > now) return false;
  if (lease.taskId !== null) {
    const claim = await trx
      .selectFrom('path_lease_claims')
      .select('token')
      .where('task_id', '=', lease.taskId)
      .executeTakeFirst();
    if (claim && Number(claim.token) > lease.token) return true;
  }
  if (lease.keys.length === 0) return false;
  // Every overlapping row, lapsed or not (a takeover that lapsed in turn still took the keys).
  const overlapping = await findConflicts(trx, lease.resource, lease.keys, 0);
  return overlapping.some((c) => c.kind === undefined && c.token !== null && c.token > lease.token);
}

/**
 * A grant with no lease rows (a dynamic task claim) is live while it is its task's current
 * claim; `never_granted` and `superseded` as for any grant.
 */
async function isCurrentEmptyClaim(trx: Trx, lease: PathLeaseGrant): Promise<boolean> {
  if (lease.keys.length > 0 || lease.taskId === null) return false;
  const claim = await trx
    .selectFrom('path_lease_claims')
    .select(['token', 'holder', 'workspace_id'])
    .where('task_id', '=', lease.taskId)
    .executeTakeFirst();
  return (
    claim !== undefined &&
    Number(claim.token) === lease.token &&
    claim.holder === lease.holder &&
    claim.workspace_id === lease.resource
  );
}

/**
 * Whether the grant is live at `now`: every key it leased still has its row, unexpired (a grant
 * partly taken over after expiry, or partly released with the deprecated by-name form, is lost);
 * a dynamic claim without rows is live while it is its task's current claim.
 */
async function isLive(trx: Trx, lease: PathLeaseGrant, now: number): Promise<boolean> {
  if (lease.keys.length === 0) return isCurrentEmptyClaim(trx, lease);
  const rows = await trx
    .selectFrom('path_leases')
    .select('expires_at')
    .where('workspace_id', '=', lease.resource)
    .where('token', '=', lease.token)
    .where('holder', '=', lease.holder)
    .execute();
  return rows.length === lease.keys.length && rows.every((r) => Number(r.expires_at) > now);
}

/**
 * Extends the grant's leases to `expiresAt` if it is live at `now` (`isLive`); whether it was.
 * One statement where a WITH clause may write (`RENEW_IF_LIVE`), a read and an update elsewhere.
 */
async function renewIfLive(
  ctx: StoreContext,
  trx: Trx,
  lease: PathLeaseGrant,
  now: number,
  expiresAt: number,
): Promise<boolean> {
  const grant = { workspaceId: lease.resource, token: lease.token, holder: lease.holder };
  if (ctx.dialect.writableCtes && lease.keys.length > 0) {
    const row = await RENEW_IF_LIVE.first(trx, extend(grant, { now, expiresAt, keys: lease.keys.length }));
    return row?.live === true;
  }
  if (!(await isLive(trx, lease, now))) return false;
  await trx
    .updateTable('path_leases')
    .set({ expires_at: expiresAt })
    .where('workspace_id', '=', lease.resource)
    .where('token', '=', lease.token)
    .where('holder', '=', lease.holder)
    .execute();
  return true;
}

/** `renewPaths(lease, { ttlMs })`: extends the grant's leases while it is live, or throws `PathLeaseLostError`. */
/** The typed refusal a keyed renew or release of a grant stores. */
export const GRANT_REFUSALS = [PathLeaseLostError];

export async function renewGrant(
  ctx: StoreContext,
  lease: PathLeaseGrant,
  ttlMs: number,
  call: IdempotentCall | null = null,
): Promise<PathLeaseGrant> {
  return keyedWrite(
    ctx,
    call,
    async (trx) => {
      // Serialized with acquisitions: a lease seen live here cannot be taken over meanwhile.
      await ctx.dialect.lockKey(trx, pathsLockKey(lease.resource));
      const now = ctx.clock.now();
      const expiresAt = now + ttlMs;
      if (await renewIfLive(ctx, trx, lease, now, expiresAt)) {
        await auditLeaseActs(ctx, trx, now, [
          {
            act: 'renewed',
            kind: 'path_lease',
            resource: lease.resource,
            holder: lease.holder,
            token: lease.token,
            detail: { keys: lease.keys, expiresAt },
          },
        ]);
        return Object.freeze(extend(lease, { expiresAt }));
      }
      throw new PathLeaseLostError(lease.resource, lease.token, await lostGrantReason(trx, lease, now));
    },
    [pathsLockKey(lease.resource)],
  );
}

/** The lease rows of one grant, for deletion. */
const grantRows = (db: Kysely<Database>, p: { workspaceId: string; token: number; holder: string }) =>
  db
    .deleteFrom('path_leases')
    .where('workspace_id', '=', p.workspaceId)
    .where('token', '=', p.token)
    .where('holder', '=', p.holder);

const RELEASE_GRANT = prepared((db, p: { workspaceId: string; token: number; holder: string }) =>
  grantRows(db, p).returning('lease_key'),
);

/**
 * `releasePaths(lease)`: deletes the grant's leases. A repeat release is a no-op; a token never
 * granted in the workspace throws `PathLeaseLostError`.
 */
export async function releaseGrant(
  ctx: StoreContext,
  lease: PathLeaseGrant,
  call: IdempotentCall | null = null,
): Promise<{ readonly released: readonly string[] }> {
  // PostgreSQL announces the release in the deleting statement itself (only if it deleted).
  const announce = ctx.dialect.wakeups.notifyExpression(pathsTopic(lease.resource));
  // Bound before BEGIN, which sends it (PostgreSQL, one round trip less). With an announcement
  // (its topic a literal of the expression) it is compiled per call; without, prepared.
  const grant = { workspaceId: lease.resource, token: lease.token, holder: lease.holder };
  const deletion: CompiledQuery<{ lease_key: string }> = announce
    ? grantRows(ctx.dialect.db, grant)
        .returning(['lease_key', announce.as('announced')])
        .compile()
    : RELEASE_GRANT.bind(ctx.dialect.db, grant);
  // Unkeyed and unaudited on PostgreSQL, a grant that has not lapsed (so it cannot have been
  // superseded): BEGIN, the deletion and COMMIT in one round trip.
  const once =
    ctx.dialect.writableCtes && call === null && !auditsLeaseAct(ctx, 'released') && lease.expiresAt > ctx.clock.now();
  const settle = (rows: readonly { lease_key: string }[]) =>
    rows.length > 0 ? { value: { released: rows.map((r) => decodePathLeaseKey(r.lease_key)).sort() } } : null;
  return idempotentInOneTrip(ctx, once, deletion, settle, () =>
    keyedWrite(
      ctx,
      call,
      async (trx) => {
        const rows = (ctx.dialect.beginResult(deletion) ?? (await runBound(trx, deletion))).rows;
        // Rows under the token prove it was granted; only a miss asks the workspace's latest token.
        if (rows.length === 0 && lease.token > (await latestToken(trx, lease.resource)))
          throw new PathLeaseLostError(lease.resource, lease.token, 'never_granted');
        // The lease protocol's release rule: a grant taken over (after it lapsed) is superseded, and
        // releasing it throws (rolling back the deletion of its lapsed leftovers, which block nobody).
        if (await isSuperseded(trx, lease, ctx.clock.now()))
          throw new PathLeaseLostError(lease.resource, lease.token, 'superseded');
        // No row left: released already, a no-op (nothing notified, nothing recorded).
        const released = rows.map((r) => decodePathLeaseKey(r.lease_key)).sort();
        if (rows.length > 0) {
          await auditLeaseActs(ctx, trx, ctx.clock.now(), [
            {
              act: 'released',
              kind: 'path_lease',
              resource: lease.resource,
              holder: lease.holder,
              token: lease.token,
              detail: { keys: released },
            },
          ]);
          if (!announce) await ctx.dialect.wakeups.notify(trx, pathsTopic(lease.resource));
        }
        return { released };
      },
      undefined,
      deletion,
    ),
  );
}

/**
 * `tx.assertLease` for a path-lease grant. The workspace's token row is read `FOR SHARE` on
 * PostgreSQL: every acquisition in the workspace locks it `FOR UPDATE` before it reads the clock,
 * so a takeover waits for this transaction to end. The grant is live while all its rows are
 * unexpired (see `isLive`).
 */
export const fencePathLease: LeaseFence = async (ctx, trx, value) => {
  // `tx.assertLease` validated it with `requirePathGrant`.
  const lease = value as PathLeaseGrant;
  await readLeaseRowLocked(
    ctx,
    trx.selectFrom('path_lease_tokens').select('token').where('workspace_id', '=', lease.resource),
  );
  const now = ctx.clock.now();
  if (await isLive(trx, lease, now)) return;
  throw new PathLeaseLostError(lease.resource, lease.token, await lostGrantReason(trx, lease, now));
};
