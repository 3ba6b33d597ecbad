/**
 * The all-or-nothing acquisition every lease path goes through (`tryAcquirePaths`,
 * `acquirePaths`, `claimTask`): under the workspace's key (protocol.ts, level 7) it locks the
 * workspace's token row, checks for conflicting live leases and, only if there are none, takes
 * the next fencing token and inserts the whole set under it.
 */
import type { Transaction } from 'kysely';
import { NotFoundError } from '../../errors.js';
import { decodePathLeaseKey, encodePathLeaseKey, WHOLE_WORKSPACE_KEY } from '../../domain/write-paths.js';
import type { Database, PathLeaseRow } from '../../schema/database.js';
import type { StoreContext } from '../context.js';
import { pathsLockKey } from '../../protocol.js';
import { auditLeaseActs, type LeaseActRecord } from '../shared/audit.js';
import { liveWorkspaceLock } from '../shared/workspace-exclusion.js';
import {
  chunked,
  conflictParams,
  descendantRanges,
  FIND_CONFLICTS,
  INSERT_LEASES,
  LIST_CHUNK,
  NEXT_TOKEN,
  NEXT_TOKEN_AND_PRUNE,
  PRUNE_EXPIRED,
  RANGE_CHUNK,
  toPathLease,
} from './statements.js';
import {
  PATH_CONFLICT_REPORT_LIMIT,
  type PathLeaseConflict,
  type PathLeaseGrant,
  type TryAcquirePathsResult,
} from './types.js';

/** Live leases of any grant overlapping any of `keys`, the first few (see `buildPathConflictQuery`). */
export async function findConflicts(
  trx: Transaction<Database>,
  workspaceId: string,
  keys: readonly string[],
  now: number,
): Promise<PathLeaseConflict[]> {
  return (await scanConflicts(trx, workspaceId, keys, now, false)).conflicts;
}

/**
 * What blocks an acquisition of `keys`: the workspace's live exclusive lock first (the
 * whole-workspace key), then the first few overlapping live leases. The lock is read by the first
 * conflict statement itself, so a set checked in one statement costs one round trip.
 */
async function findBlockers(
  trx: Transaction<Database>,
  workspaceId: string,
  keys: readonly string[],
  now: number,
): Promise<PathLeaseConflict[]> {
  if (keys.length === 0) {
    const lock = await liveWorkspaceLock(trx, workspaceId, now);
    return lock ? [lock] : [];
  }
  const { lock, conflicts } = await scanConflicts(trx, workspaceId, keys, now, true);
  return lock ? [lock, ...conflicts] : conflicts;
}

async function scanConflicts(
  trx: Transaction<Database>,
  workspaceId: string,
  keys: readonly string[],
  now: number,
  withLock: boolean,
): Promise<{ lock: PathLeaseConflict | null; conflicts: PathLeaseConflict[] }> {
  const all = conflictParams(workspaceId, keys, now);
  const ancestorChunks = chunked(all.ancestors, LIST_CHUNK);
  const keyChunks = chunked(keys, RANGE_CHUNK);
  const seen = new Set<string>();
  const conflicts: PathLeaseConflict[] = [];
  let lock: PathLeaseConflict | null = null;
  // One statement for an ordinary set; a large one is checked chunk by chunk, stopping at the report limit.
  for (
    let i = 0;
    i < Math.max(ancestorChunks.length, keyChunks.length) && conflicts.length < PATH_CONFLICT_REPORT_LIMIT;
    i++
  ) {
    const ancestors = ancestorChunks[i] ?? [];
    const chunkKeys = keyChunks[i] ?? [];
    if (ancestors.length === 0 && chunkKeys.length === 0) continue;
    // The lock rides with the first statement only.
    const lockHere = withLock && i === 0;
    const params = { workspaceId, now, ancestors, ...descendantRanges(chunkKeys), withLock: lockHere };
    const shape = `${ancestors.length}:${chunkKeys.length}:${lockHere ? 1 : 0}`;
    for (const row of await FIND_CONFLICTS.execute(trx, params, shape)) {
      const token = row.token === null ? null : Number(row.token);
      if (Number(row.from_lock ?? 0) === 1) {
        lock = {
          key: WHOLE_WORKSPACE_KEY,
          holder: row.holder,
          expiresAt: Number(row.expires_at),
          token,
          kind: 'workspace_lock',
        };
        continue;
      }
      const id = `${row.lease_key}\u0000${row.holder}`;
      if (seen.has(id) || conflicts.length >= PATH_CONFLICT_REPORT_LIMIT) continue;
      seen.add(id);
      conflicts.push({
        key: decodePathLeaseKey(row.lease_key),
        holder: row.holder,
        expiresAt: Number(row.expires_at),
        token,
      });
    }
  }
  return { lock, conflicts };
}

/**
 * Locks the workspace's token row against every other grant until the transaction ends
 * (PostgreSQL `FOR UPDATE`; SQLite's write transaction already holds the database). A fenced
 * transaction (`tx.assertLease` on a path lease) reads the row `FOR SHARE`, so a grant waits
 * here for the fenced write to end, before it reads the clock.
 */
async function lockTokenRow(ctx: StoreContext, trx: Transaction<Database>, workspaceId: string): Promise<void> {
  const query = trx.selectFrom('path_lease_tokens').select('token').where('workspace_id', '=', workspaceId);
  await (ctx.dialect.supportsSkipLocked ? query.forUpdate() : query).executeTakeFirst();
}

/** A token write's foreign-key violation means the workspace does not exist. */
async function orMissingWorkspace<T>(ctx: StoreContext, workspaceId: string, write: Promise<T>): Promise<T> {
  try {
    return await write;
  } catch (error) {
    if (ctx.dialect.classifyError(error) === 'foreign_key_violation') throw new NotFoundError('workspace', workspaceId);
    throw error;
  }
}

/** The next fencing token of the workspace: one higher than every token granted there before. */
async function nextToken(ctx: StoreContext, trx: Transaction<Database>, workspaceId: string, now: number) {
  const row = await orMissingWorkspace(ctx, workspaceId, NEXT_TOKEN.first(trx, { workspaceId, now }));
  return Number(row!.token);
}

/**
 * `nextToken` and the first `PRUNE_EXPIRED` in one statement where a WITH clause may write
 * (`NEXT_TOKEN_AND_PRUNE`, PostgreSQL). Returns the token and the pruned rows.
 */
async function nextTokenPruning(
  ctx: StoreContext,
  trx: Transaction<Database>,
  workspaceId: string,
  stored: readonly string[],
  now: number,
) {
  const rows = await orMissingWorkspace(
    ctx,
    workspaceId,
    NEXT_TOKEN_AND_PRUNE.execute(trx, { workspaceId, stored, now }, stored.length),
  );
  return {
    token: Number(rows[0]!.next_token),
    pruned: rows.flatMap((r) =>
      r.lease_key === null
        ? []
        : [{ holder: r.holder!, token: r.token, lease_key: r.lease_key, expires_at: r.expires_at! }],
    ),
  };
}

/** The all-or-nothing acquisition, inside the caller's write transaction: one grant, or the blockers. */
export async function acquireKeys(
  ctx: StoreContext,
  trx: Transaction<Database>,
  workspaceId: string,
  holder: string,
  keys: readonly string[],
  ttlMs: number,
  taskId: string | null,
): Promise<TryAcquirePathsResult> {
  await ctx.dialect.lockKey(trx, pathsLockKey(workspaceId));
  await lockTokenRow(ctx, trx, workspaceId);
  // Read the clock only once the workspace is serialized, so lease times follow commit order.
  const now = ctx.clock.now();
  // One exclusion rule per workspace: a live workspace lock is the whole-workspace key, so it
  // blocks every path claim there (and `claimWorkspaceLock` takes this key and checks the leases).
  const conflicts = await findBlockers(trx, workspaceId, keys, now);
  if (conflicts.length > 0) {
    const first = conflicts[0]!;
    return {
      status: 'busy',
      heldBy: { holder: first.holder, expiresAt: first.expiresAt, conflicts },
      acquired: false,
      conflicts,
    };
  }
  const chunks = chunked(keys, LIST_CHUNK).map((chunk) => chunk.map(encodePathLeaseKey));
  // With writable CTEs the token and the first chunk's prune are one statement (one round trip).
  const head =
    ctx.dialect.writableCtes && keys.length > 0 ? await nextTokenPruning(ctx, trx, workspaceId, chunks[0]!, now) : null;
  const token = head ? head.token : await nextToken(ctx, trx, workspaceId, now);
  const expiresAt = now + ttlMs;
  const rows: PathLeaseRow[] = [];
  // The lapsed grants this one takes keys over from, for the trail: holder and token → keys.
  const lost = new Map<string, { holder: string; token: number | null; expiresAt: number; keys: string[] }>();
  if (keys.length > 0) {
    for (const [i, stored] of chunks.entries()) {
      // Expired leases of any grant on exactly these keys are garbage from now on.
      const pruned =
        i === 0 && head ? head.pruned : await PRUNE_EXPIRED.execute(trx, { workspaceId, stored, now }, stored.length);
      for (const r of pruned) {
        const token = r.token === null ? null : Number(r.token);
        const id = `${token}\u0000${r.holder}`;
        const grant = lost.get(id) ?? { holder: r.holder, token, expiresAt: Number(r.expires_at), keys: [] };
        grant.keys.push(decodePathLeaseKey(r.lease_key));
        lost.set(id, grant);
      }
      rows.push(
        ...(await INSERT_LEASES.execute(
          trx,
          { workspaceId, stored, holder, taskId, now, expiresAt, token },
          stored.length,
        )),
      );
    }
  }
  await auditLeaseActs(ctx, trx, now, [
    { act: 'granted', kind: 'path_lease', resource: workspaceId, holder, token, detail: { keys, taskId, expiresAt } },
    ...[...lost.values()].map(
      (g): LeaseActRecord => ({
        act: 'lost',
        kind: 'path_lease',
        resource: workspaceId,
        holder: g.holder,
        token: g.token,
        detail: { reason: 'superseded', keys: g.keys, expiresAt: g.expiresAt, by: { holder, token } },
      }),
    ),
  ]);
  const order = new Map(keys.map((key, i) => [key, i]));
  const lease: PathLeaseGrant = Object.freeze({
    kind: 'path_lease' as const,
    resource: workspaceId,
    holder,
    token,
    expiresAt,
    workspaceId,
    keys: Object.freeze([...keys]),
    taskId,
  });
  return {
    status: 'acquired',
    lease,
    acquired: true,
    leases: rows.map(toPathLease).sort((a, b) => order.get(a.key)! - order.get(b.key)!),
  };
}
