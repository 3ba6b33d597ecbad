/**
 * One exclusion rule per workspace (issue 21): the exclusive workspace lock is the
 * whole-workspace path key `""`. Path acquisitions (`store.paths`) treat a live lock as a
 * conflict, and `claimWorkspaceLock` (`store.locks`, so `dispatchRun`) treats a live path lease as
 * the holder; both run under the workspace's paths key (protocol.ts, level 7), so neither can
 * commit between the other's check and write.
 */
import type { Transaction } from 'kysely';
import { decodePathLeaseKey, WHOLE_WORKSPACE_KEY } from '../../domain/write-paths.js';
import type { Database } from '../../schema/database.js';
import { prepared } from '../../query/prepared.js';

/** What blocks a claim in the workspace (the shape of `PathLeaseConflict`). */
export interface WorkspaceBlocker {
  readonly key: string;
  readonly holder: string;
  readonly expiresAt: number;
  readonly token: number | null;
  readonly kind?: 'workspace_lock';
}

const LIVE_WORKSPACE_LOCK = prepared((db, p: { workspaceId: string; now: number }) =>
  db
    .selectFrom('workspace_locks')
    .select(['holder', 'token', 'expires_at'])
    .where('workspace_id', '=', p.workspaceId)
    .where('holder', 'is not', null)
    .where('expires_at', '>', p.now),
);

const ANY_LIVE_PATH_LEASE = prepared((db, p: { workspaceId: string; now: number }) =>
  db
    .selectFrom('path_leases')
    .select(['lease_key', 'holder', 'token', 'expires_at'])
    .where('workspace_id', '=', p.workspaceId)
    .where('expires_at', '>', p.now)
    .limit(1),
);

/** The workspace's exclusive lock as a conflict on the whole-workspace key, if it is live. */
export async function liveWorkspaceLock(
  trx: Transaction<Database>,
  workspaceId: string,
  now: number,
): Promise<WorkspaceBlocker | null> {
  const row = await LIVE_WORKSPACE_LOCK.first(trx, { workspaceId, now });
  if (!row) return null;
  return {
    key: WHOLE_WORKSPACE_KEY,
    holder: row.holder!,
    expiresAt: Number(row.expires_at),
    token: Number(row.token),
    kind: 'workspace_lock',
  };
}

/**
 * A live path lease of the workspace, if any (for `claimWorkspaceLock`, which holds the
 * workspace's paths key while it looks, so no acquisition can commit meanwhile).
 */
export async function anyLivePathLease(
  trx: Transaction<Database>,
  workspaceId: string,
  now: number,
): Promise<WorkspaceBlocker | null> {
  const row = await ANY_LIVE_PATH_LEASE.first(trx, { workspaceId, now });
  if (!row) return null;
  return {
    key: decodePathLeaseKey(row.lease_key),
    holder: row.holder,
    expiresAt: Number(row.expires_at),
    token: row.token === null ? null : Number(row.token),
  };
}
