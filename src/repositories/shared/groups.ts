/** The group lookup: which active shared workspace group a task belongs to (SPEC §6). */
import type { Transaction } from 'kysely';
import type { Database, GroupMemberRole } from '../../schema/database.js';

/**
 * The active workspace group `taskId` is a member (or the steward) of, with its role there, if
 * any. A task belongs to at most one active group (creating a shared task joins "the" group of
 * its parent; creating a group or moving a steward refuses a task that is in another one); should
 * two exist, the lowest group id is returned.
 */
export async function activeGroupOf(
  trx: Transaction<Database>,
  taskId: string,
): Promise<{ readonly id: string; readonly role: GroupMemberRole } | undefined> {
  return trx
    .selectFrom('workspace_group_members as m')
    .innerJoin('workspace_groups as g', 'g.id', 'm.group_id')
    .select(['g.id', 'm.role'])
    .where('m.task_id', '=', taskId)
    .where('g.status', '=', 'active')
    .orderBy('g.id')
    .executeTakeFirst();
}
