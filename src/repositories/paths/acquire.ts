/**
 * The all-or-nothing acquisition every lease path goes through (`tryAcquirePaths`,
 * `acquirePaths`, `claimTask`): under the workspace's key (lock-keys.ts, level 7) it checks for
 * conflicting live leases and, only if there are none, inserts the whole set.
 */
import type { Transaction } from 'kysely';
import { NotFoundError } from '../../errors.js';
import { decodePathLeaseKey, encodePathLeaseKey } from '../../domain/write-paths.js';
import type { Database, PathLeaseRow } from '../../schema/database.js';
import type { StoreContext } from '../context.js';
import { pathsLockKey } from '../shared/lock-keys.js';
import {
  chunked,
  conflictParams,
  descendantRanges,
  FIND_CONFLICTS,
  INSERT_LEASES,
  LIST_CHUNK,
  PRUNE_EXPIRED,
  RANGE_CHUNK,
  toPathLease,
} from './statements.js';
import { PATH_CONFLICT_REPORT_LIMIT, type PathLeaseConflict, type TryAcquirePathsResult } from './types.js';

/** Live leases of other holders overlapping any of `keys`, the first few (see `buildPathConflictQuery`). */
export async function findConflicts(
  trx: Transaction<Database>,
  workspaceId: string,
  holder: string,
  keys: readonly string[],
  now: number,
): Promise<PathLeaseConflict[]> {
  const all = conflictParams(workspaceId, holder, keys, now);
  const ancestorChunks = chunked(all.ancestors, LIST_CHUNK);
  const keyChunks = chunked(keys, RANGE_CHUNK);
  const seen = new Set<string>();
  const conflicts: PathLeaseConflict[] = [];
  // One statement for an ordinary set; a large one is checked chunk by chunk, stopping at the report limit.
  for (
    let i = 0;
    i < Math.max(ancestorChunks.length, keyChunks.length) && conflicts.length < PATH_CONFLICT_REPORT_LIMIT;
    i++
  ) {
    const ancestors = ancestorChunks[i] ?? [];
    const chunkKeys = keyChunks[i] ?? [];
    if (ancestors.length === 0 && chunkKeys.length === 0) continue;
    const params = { workspaceId, holder, now, ancestors, ...descendantRanges(chunkKeys) };
    const rows = await FIND_CONFLICTS.execute(trx, params, `${ancestors.length}:${chunkKeys.length}`);
    for (const row of rows) {
      const id = `${row.lease_key}\u0000${row.holder}`;
      if (seen.has(id) || conflicts.length >= PATH_CONFLICT_REPORT_LIMIT) continue;
      seen.add(id);
      conflicts.push({
        key: decodePathLeaseKey(row.lease_key),
        holder: row.holder,
        expiresAt: Number(row.expires_at),
      });
    }
  }
  return conflicts;
}

/** The all-or-nothing acquisition, inside the caller's write transaction. */
export async function acquireKeys(
  ctx: StoreContext,
  trx: Transaction<Database>,
  workspaceId: string,
  holder: string,
  keys: readonly string[],
  ttlMs: number,
  taskId: string | null,
): Promise<TryAcquirePathsResult> {
  if (keys.length === 0) return { acquired: true, leases: [] };
  await ctx.dialect.lockKey(trx, pathsLockKey(workspaceId));
  // Read the clock only once the workspace is serialized, so lease times follow commit order.
  const now = ctx.clock.now();
  const conflicts = await findConflicts(trx, workspaceId, holder, keys, now);
  if (conflicts.length > 0) return { acquired: false, conflicts };
  const rows: PathLeaseRow[] = [];
  for (const chunk of chunked(keys, LIST_CHUNK)) {
    const stored = chunk.map(encodePathLeaseKey);
    // Expired leases of any holder on exactly these keys are garbage from now on.
    await PRUNE_EXPIRED.run(trx, { workspaceId, stored, holder, now }, stored.length);
    try {
      rows.push(
        ...(await INSERT_LEASES.execute(
          trx,
          { workspaceId, stored, holder, taskId, now, expiresAt: now + ttlMs },
          stored.length,
        )),
      );
    } catch (error) {
      if (ctx.dialect.classifyError(error) === 'foreign_key_violation')
        throw new NotFoundError('workspace', workspaceId);
      throw error;
    }
  }
  const order = new Map(keys.map((key, i) => [key, i]));
  return {
    acquired: true,
    leases: rows.map(toPathLease).sort((a, b) => order.get(a.key)! - order.get(b.key)!),
  };
}
