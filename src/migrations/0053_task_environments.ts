import { sql } from 'kysely';
import { tableIn } from '../query/schema.js';
import type { MigrationDefinition } from './types.js';

/**
 * Task environments and shared workspace groups (seed 004): an environment is owned by one task;
 * a group has a steward task and members with roles (at most one `steward` per group, by a partial
 * unique index). Tasks gain a parent link and a workspace mode.
 * `tasks.parent_id` carries no foreign key for the same reason as 0006 (SQLite's DROP COLUMN).
 * The parent index and the validation of the workspace_mode CHECK are concurrent steps.
 */
export const migration0053: MigrationDefinition = {
  version: 53,
  name: 'task_environments',
  async up({ db, types }) {
    const ms = types.epochMs;
    await db.schema.alterTable('tasks').addColumn('parent_id', 'text').execute();
    if (types.concurrentDdl) {
      // Validated by the concurrent step, not over every task under the table lock (see 0052).
      await db.schema.alterTable('tasks').addColumn('workspace_mode', 'text').execute();
      await sql`alter table ${tableIn(db, 'tasks')} add constraint tasks_workspace_mode_check
        check (workspace_mode in ('isolated', 'shared')) not valid`.execute(db);
    } else {
      await db.schema
        .alterTable('tasks')
        .addColumn('workspace_mode', 'text', (c) => c.check(sql`workspace_mode in ('isolated', 'shared')`))
        .execute();
    }
    await db.schema
      .createTable('workspace_groups')
      .addColumn('id', 'text', (c) => c.primaryKey())
      .addColumn('steward_task_id', 'text', (c) => c.notNull().references('tasks.id'))
      .addColumn('status', 'text', (c) => c.notNull().defaultTo('active'))
      .addColumn('created_at', ms, (c) => c.notNull())
      .addColumn('updated_at', ms, (c) => c.notNull())
      .addCheckConstraint('workspace_groups_status_check', sql`status in ('active', 'removed')`)
      .execute();
    await db.schema
      .createIndex('workspace_groups_steward_idx')
      .on('workspace_groups')
      .column('steward_task_id')
      .execute();
    await db.schema
      .createTable('workspace_group_members')
      .addColumn('group_id', 'text', (c) => c.notNull().references('workspace_groups.id').onDelete('cascade'))
      .addColumn('task_id', 'text', (c) => c.notNull().references('tasks.id').onDelete('cascade'))
      .addColumn('role', 'text', (c) => c.notNull())
      .addColumn('joined_at', ms, (c) => c.notNull())
      .addPrimaryKeyConstraint('workspace_group_members_pkey', ['group_id', 'task_id'])
      .addCheckConstraint('workspace_group_members_role_check', sql`role in ('steward', 'member')`)
      .execute();
    await db.schema
      .createIndex('workspace_group_members_task_idx')
      .on('workspace_group_members')
      .column('task_id')
      .execute();
    // One steward per group, enforced by the database: stewardship moves by demoting first.
    await db.schema
      .createIndex('workspace_group_members_one_steward')
      .on('workspace_group_members')
      .column('group_id')
      .unique()
      .where(sql.ref('role'), '=', 'steward')
      .execute();
    await db.schema
      .createTable('task_environments')
      .addColumn('id', 'text', (c) => c.primaryKey())
      .addColumn('task_id', 'text', (c) => c.notNull().references('tasks.id'))
      .addColumn('group_id', 'text', (c) => c.references('workspace_groups.id'))
      .addColumn('root_path', 'text', (c) => c.notNull())
      .addColumn('status', 'text', (c) => c.notNull().defaultTo('active'))
      .addColumn('created_at', ms, (c) => c.notNull())
      .addColumn('updated_at', ms, (c) => c.notNull())
      .addCheckConstraint('task_environments_status_check', sql`status in ('active', 'removed')`)
      .execute();
    await db.schema.createIndex('task_environments_task_idx').on('task_environments').column('task_id').execute();
    await db.schema.createIndex('task_environments_group_idx').on('task_environments').column('group_id').execute();
  },
  // After the DDL commits: the parent index on tasks without blocking writes, and (PostgreSQL) the
  // workspace_mode CHECK validated under SHARE UPDATE EXCLUSIVE.
  concurrent: [
    {
      kind: 'create-index',
      index: 'tasks_parent_idx',
      table: 'tasks',
      build: (db) => db.schema.createIndex('tasks_parent_idx').on('tasks').column('parent_id'),
    },
    { kind: 'validate-constraint', table: 'tasks', constraint: 'tasks_workspace_mode_check' },
  ],
  // Until the concurrent steps, 0053 built tasks_parent_idx and validated its CHECK inside its
  // DDL transaction: the same schema (test/suites/online.suite.ts applies that definition).
  acceptedChecksums: {
    sqlite: ['72f52227c85c0052132dbe615edcfbe8e8857f429d4a5b941b58efc38088c36e'],
    postgres: ['0cf102d84cbaf362659b28f6282ea9abb8bc63e7b9daece15be665f4574ac979'],
  },
  async down({ db }) {
    await db.schema.dropTable('task_environments').execute();
    await db.schema.dropTable('workspace_group_members').execute();
    await db.schema.dropTable('workspace_groups').execute();
    // The concurrent step may not have run (a crash, then a revert).
    await db.schema.dropIndex('tasks_parent_idx').ifExists().execute();
    await db.schema.alterTable('tasks').dropColumn('workspace_mode').execute();
    await db.schema.alterTable('tasks').dropColumn('parent_id').execute();
  },
};
