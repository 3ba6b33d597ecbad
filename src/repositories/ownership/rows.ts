/** Reads of `store.ownership`'s rows, mapped to the public types, in a transaction or on the store. */
import { sql, type Kysely, type Transaction } from 'kysely';
import { NotFoundError } from '../../errors.js';
import { prepared } from '../../query/prepared.js';
import type { CleanupSnapshotRow, Database } from '../../schema/database.js';
import type { CleanupSnapshot, ResourceCleanupClaim, TaskEnvironment, WorkspaceGroup } from './types.js';

type Executor = Transaction<Database> | Kysely<Database>;

function storedClaim(row: {
  cleanup_claimed_by: string | null;
  cleanup_claim_generation: number | null;
  cleanup_claim_expires_at: number | null;
}): ResourceCleanupClaim | null {
  if (row.cleanup_claimed_by === null) return null;
  return {
    claimant: row.cleanup_claimed_by,
    generation: Number(row.cleanup_claim_generation),
    expiresAt: Number(row.cleanup_claim_expires_at),
  };
}

/** Maps a `cleanup_snapshots` row to the public shape. */
export function toCleanupSnapshot(row: CleanupSnapshotRow): CleanupSnapshot {
  return {
    id: row.id,
    taskId: row.task_id,
    resourceKind: row.resource_kind,
    resourceId: row.resource_id,
    ownerTaskId: row.owner_task_id,
    generation: Number(row.ownership_generation),
    state: row.state,
    attempts: Number(row.attempts),
    claimedBy: row.claimed_by,
    claimExpiresAt: row.claim_expires_at === null ? null : Number(row.claim_expires_at),
    lastError: row.last_error,
    createdAt: Number(row.created_at),
    updatedAt: Number(row.updated_at),
  };
}

export async function loadEnvironment(executor: Executor, id: string): Promise<TaskEnvironment | null> {
  const row = await executor.selectFrom('task_environments').selectAll().where('id', '=', id).executeTakeFirst();
  if (!row) return null;
  return {
    id: row.id,
    ownerTaskId: row.task_id,
    groupId: row.group_id,
    rootPath: row.root_path,
    status: row.status,
    generation: Number(row.ownership_generation),
    cleanupClaim: storedClaim(row),
  };
}

export async function loadGroup(executor: Executor, id: string): Promise<WorkspaceGroup | null> {
  const row = await executor.selectFrom('workspace_groups').selectAll().where('id', '=', id).executeTakeFirst();
  if (!row) return null;
  const members = await executor
    .selectFrom('workspace_group_members')
    .select(['task_id', 'role'])
    .where('group_id', '=', id)
    .orderBy('task_id')
    .execute();
  return {
    id: row.id,
    stewardTaskId: row.steward_task_id,
    status: row.status,
    generation: Number(row.ownership_generation),
    cleanupClaim: storedClaim(row),
    members: members.map((m) => ({ taskId: m.task_id, role: m.role })),
  };
}

export async function loadSnapshot(executor: Executor, id: string): Promise<CleanupSnapshot | null> {
  const row = await executor.selectFrom('cleanup_snapshots').selectAll().where('id', '=', id).executeTakeFirst();
  return row ? toCleanupSnapshot(row) : null;
}

/** A task's snapshots in inventory order: environments first, then groups, each by id. */
export async function snapshotsOf(executor: Executor, taskId: string): Promise<CleanupSnapshot[]> {
  const rows = await executor
    .selectFrom('cleanup_snapshots')
    .selectAll()
    .where('task_id', '=', taskId)
    .orderBy(sql`case resource_kind when 'environment' then 0 else 1 end`)
    .orderBy('resource_id')
    .execute();
  return rows.map(toCleanupSnapshot);
}

const SELECT_TASK_ID = prepared((db, p: { id: string }) => db.selectFrom('tasks').select('id').where('id', '=', p.id));

export async function requireTaskExists(trx: Transaction<Database>, taskId: string): Promise<void> {
  if (!(await SELECT_TASK_ID.first(trx, { id: taskId }))) throw new NotFoundError('task', taskId);
}
