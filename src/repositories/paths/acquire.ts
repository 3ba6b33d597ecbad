/**
 * The all-or-nothing acquisition every lease path goes through (`tryAcquirePaths`,
 * `acquirePaths`, `claimTask`): under the workspace's key (protocol.ts, level 7) it locks the
 * workspace's token row, checks for conflicting live leases and, only if there are none, takes
 * the next fencing token and inserts the whole set under it.
 */
import type { CompiledQuery, Transaction } from 'kysely';
import { NotFoundError } from '../../errors.js';
import { decodePathLeaseKey, encodePathLeaseKey, WHOLE_WORKSPACE_KEY } from '../../domain/write-paths.js';
import type { Database, PathLeaseRow } from '../../schema/database.js';
import type { StoreContext } from '../context.js';
import { runBound } from '../../query/prepared.js';
import { pathsLockKey } from '../../protocol.js';
import { auditLeaseActs, type LeaseActRecord } from '../shared/audit.js';
import { liveWorkspaceLock } from '../shared/workspace-exclusion.js';
import {
  chunked,
  conflictParams,
  type ConflictParams,
  descendantRanges,
  FIND_CONFLICTS,
  GRANT,
  INSERT_LEASES,
  LIST_CHUNK,
  LOCK_TOKEN_ROW,
  NEXT_TOKEN,
  PRUNE_EXPIRED,
  RANGE_CHUNK,
  toPathLease,
} from './statements.js';
import {
  PATH_CONFLICT_REPORT_LIMIT,
  type PathLease,
  type PathLeaseConflict,
  type PathLeaseGrant,
  type TryAcquirePathsResult,
} from './types.js';
import { extend } from '../../objects.js';

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
    for (const row of await FIND_CONFLICTS.execute(trx, params, shape)) lock = addBlocker(row, seen, conflicts) ?? lock;
  }
  return { lock, conflicts };
}

/**
 * One row of a conflict check: the workspace's lock (`from_lock` 1), returned for the caller to
 * put first, or a lease, added to `conflicts` unless already there or past the report limit.
 */
function addBlocker(
  row: {
    lease_key: string;
    holder: string;
    expires_at: number | string;
    token: number | string | null;
    from_lock?: unknown;
  },
  seen: Set<string>,
  conflicts: PathLeaseConflict[],
): PathLeaseConflict | null {
  const token = row.token === null ? null : Number(row.token);
  if (Number(row.from_lock ?? 0) === 1) {
    return {
      key: WHOLE_WORKSPACE_KEY,
      holder: row.holder,
      expiresAt: Number(row.expires_at),
      token,
      kind: 'workspace_lock',
    };
  }
  const id = `${row.lease_key}\u0000${row.holder}`;
  if (seen.has(id) || conflicts.length >= PATH_CONFLICT_REPORT_LIMIT) return null;
  seen.add(id);
  conflicts.push({
    key: decodePathLeaseKey(row.lease_key),
    holder: row.holder,
    expiresAt: Number(row.expires_at),
    token,
  });
  return null;
}

/**
 * Locks the workspace's token row against every other grant until the transaction ends
 * (PostgreSQL `FOR UPDATE`; SQLite's write transaction already holds the database). A fenced
 * transaction (`tx.assertLease` on a path lease) reads the row `FOR SHARE`, so a grant waits
 * here for the fenced write to end, before it reads the clock.
 */
async function lockTokenRow(ctx: StoreContext, trx: Transaction<Database>, workspaceId: string): Promise<void> {
  // Without row locks (SQLite) the write transaction already holds the whole database: nothing to read.
  if (ctx.dialect.supportsSkipLocked) await LOCK_TOKEN_ROW.first(trx, { workspaceId });
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
 * Locks the caller has taken for an acquisition (PostgreSQL): the statement that locks the
 * workspace's token row, which BEGIN may have sent (read with `beginResult`, else sent here), and
 * whether the workspace's key was taken by SQL of the caller's (`lockKey` is then skipped).
 */
export interface HeldForGrant {
  readonly tokenRow: CompiledQuery;
  readonly keyTaken?: boolean;
}

/** The token row's lock for BEGIN to send (`WriteTransactionOptions.first`); null where it is not one statement (SQLite). */
export function tokenRowLock(ctx: StoreContext, workspaceId: string): CompiledQuery | null {
  return ctx.dialect.writableCtes ? LOCK_TOKEN_ROW.bind(ctx.dialect.db, { workspaceId }) : null;
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
  held?: HeldForGrant,
): Promise<TryAcquirePathsResult> {
  if (!held?.keyTaken) await ctx.dialect.lockKey(trx, pathsLockKey(workspaceId));
  if (!held) await lockTokenRow(ctx, trx, workspaceId);
  else if (!ctx.dialect.beginResult(held.tokenRow)) await runBound(trx, held.tokenRow);
  // Read the clock only once the workspace is serialized, so lease times follow commit order.
  const now = ctx.clock.now();
  const params = conflictParams(workspaceId, keys, now);
  // PostgreSQL (writable CTEs, so its stored functions too): one call of the grant function
  // (0106), for a set the chunked path below would check in one statement.
  if (ctx.dialect.writableCtes && keys.length <= RANGE_CHUNK && params.ancestors.length <= LIST_CHUNK)
    return grantInOne(ctx, trx, params, holder, keys, ttlMs, taskId);
  // One exclusion rule per workspace: a live workspace lock is the whole-workspace key, so it
  // blocks every path claim there (and `claimWorkspaceLock` takes this key and checks the leases).
  const conflicts = await findBlockers(trx, workspaceId, keys, now);
  if (conflicts.length > 0) return busy(conflicts);
  const chunks = chunked(keys, LIST_CHUNK).map((chunk) => chunk.map(encodePathLeaseKey));
  const token = await nextToken(ctx, trx, workspaceId, now);
  const expiresAt = now + ttlMs;
  const rows: PathLeaseRow[] = [];
  const lost: LapsedLease[] = [];
  if (keys.length > 0) {
    for (const stored of chunks) {
      // Expired leases of any grant on exactly these keys are garbage from now on.
      lost.push(...(await PRUNE_EXPIRED.execute(trx, { workspaceId, stored, now }, stored.length)));
      rows.push(
        ...(await INSERT_LEASES.execute(
          trx,
          { workspaceId, stored, holder, taskId, now, expiresAt, token },
          stored.length,
        )),
      );
    }
  }
  const order = new Map(keys.map((key, i) => [key, i]));
  const leases = rows.map(toPathLease).sort((a, b) => order.get(a.key)! - order.get(b.key)!);
  return granted(ctx, trx, { workspaceId, holder, keys, taskId, now, expiresAt, token }, leases, lost);
}

/** A lapsed lease a grant took its key over from. */
type LapsedLease = { holder: string; token: number | string | null; lease_key: string; expires_at: number | string };

function busy(conflicts: PathLeaseConflict[]): TryAcquirePathsResult {
  const first = conflicts[0]!;
  return {
    status: 'busy',
    heldBy: { holder: first.holder, expiresAt: first.expiresAt, conflicts },
    acquired: false,
    conflicts,
  };
}

/** The acquisition as one `GRANT` call (PostgreSQL's grant function): the check, the token, the prune and the rows. */
async function grantInOne(
  ctx: StoreContext,
  trx: Transaction<Database>,
  params: ConflictParams,
  holder: string,
  keys: readonly string[],
  ttlMs: number,
  taskId: string | null,
): Promise<TryAcquirePathsResult> {
  const { workspaceId, now } = params;
  const expiresAt = now + ttlMs;
  const stored = keys.map(encodePathLeaseKey);
  const rows = await orMissingWorkspace(
    ctx,
    workspaceId,
    GRANT.execute(trx, extend(params, { stored, holder, taskId, expiresAt })),
  );
  const seen = new Set<string>();
  const conflicts: PathLeaseConflict[] = [];
  let lock: PathLeaseConflict | null = null;
  for (const row of rows)
    if (row.kind === 'blocker') lock = addBlocker(row as Parameters<typeof addBlocker>[0], seen, conflicts) ?? lock;
  if (lock || conflicts.length > 0) return busy(lock ? [lock, ...conflicts] : conflicts);
  const grant = rows.find((row) => row.kind === 'granted');
  if (!grant || Number(grant.from_lock) !== keys.length)
    throw new Error(`taskfence: a path grant in workspace ${workspaceId} found no blocker but wrote no lease`);
  const token = Number(grant.token);
  const leases = keys.map((key) => ({ workspaceId, key, holder, taskId, acquiredAt: now, expiresAt, token }));
  const lost = rows.filter((row) => row.kind === 'lost') as LapsedLease[];
  return granted(ctx, trx, { workspaceId, holder, keys, taskId, now, expiresAt, token }, leases, lost);
}

/** The granted result, after the trail's rows: the grant, and one `lost` per lapsed grant it took keys over from. */
async function granted(
  ctx: StoreContext,
  trx: Transaction<Database>,
  g: {
    workspaceId: string;
    holder: string;
    keys: readonly string[];
    taskId: string | null;
    now: number;
    expiresAt: number;
    token: number;
  },
  leases: PathLease[],
  lapsed: readonly LapsedLease[],
): Promise<TryAcquirePathsResult> {
  const { workspaceId, holder, keys, taskId, now, expiresAt, token } = g;
  // The lapsed grants this one takes keys over from, for the trail: holder and token → keys.
  const lost = new Map<string, { holder: string; token: number | null; expiresAt: number; keys: string[] }>();
  for (const r of lapsed) {
    const lostToken = r.token === null ? null : Number(r.token);
    const id = `${lostToken}\u0000${r.holder}`;
    const grant = lost.get(id) ?? { holder: r.holder, token: lostToken, expiresAt: Number(r.expires_at), keys: [] };
    grant.keys.push(decodePathLeaseKey(r.lease_key));
    lost.set(id, grant);
  }
  await auditLeaseActs(ctx, trx, now, [
    { act: 'granted', kind: 'path_lease', resource: workspaceId, holder, token, detail: { keys, taskId, expiresAt } },
    ...[...lost.values()].map(
      (l): LeaseActRecord => ({
        act: 'lost',
        kind: 'path_lease',
        resource: workspaceId,
        holder: l.holder,
        token: l.token,
        detail: { reason: 'superseded', keys: l.keys, expiresAt: l.expiresAt, by: { holder, token } },
      }),
    ),
  ]);
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
  return { status: 'acquired', lease, acquired: true, leases };
}
