import { sql } from 'kysely';
import type { MigrationDefinition } from './types.js';

// Frozen with this version: later status changes need their own migration.
const TASK_STATUSES = [
  'backlog',
  'todo',
  'ready',
  'dispatched',
  'in_progress',
  'blocked',
  'done',
  'failed',
  'cancelled',
] as const;
const inList = (values: readonly string[]) => sql.raw(values.map((v) => `'${v}'`).join(', '));

/** The v5 schema the older app shipped: everything the later versions build on. */
export const migration0005: MigrationDefinition = {
  version: 5,
  name: 'baseline',
  async up({ db, types }) {
    const ms = types.epochMs;
    await db.schema
      .createTable('companies')
      .addColumn('id', 'text', (c) => c.primaryKey())
      .addColumn('name', 'text', (c) => c.notNull())
      .addColumn('created_at', ms, (c) => c.notNull())
      .execute();
    await db.schema
      .createTable('workspaces')
      .addColumn('id', 'text', (c) => c.primaryKey())
      .addColumn('company_id', 'text', (c) => c.notNull().references('companies.id').onDelete('cascade'))
      .addColumn('name', 'text', (c) => c.notNull())
      .addColumn('root_path', 'text')
      .addColumn('created_at', ms, (c) => c.notNull())
      .execute();
    await db.schema.createIndex('workspaces_company_idx').on('workspaces').column('company_id').execute();
    await db.schema
      .createTable('agents')
      .addColumn('id', 'text', (c) => c.primaryKey())
      .addColumn('company_id', 'text', (c) => c.notNull().references('companies.id').onDelete('cascade'))
      .addColumn('name', 'text', (c) => c.notNull())
      .addColumn('role', 'text')
      .addColumn('department', 'text')
      .addColumn('workspace_id', 'text', (c) => c.references('workspaces.id').onDelete('set null'))
      .addColumn('created_at', ms, (c) => c.notNull())
      .execute();
    await db.schema.createIndex('agents_company_idx').on('agents').column('company_id').execute();
    await db.schema
      .createTable('projects')
      .addColumn('id', 'text', (c) => c.primaryKey())
      .addColumn('company_id', 'text', (c) => c.notNull().references('companies.id').onDelete('cascade'))
      .addColumn('name', 'text', (c) => c.notNull())
      .addColumn('primary_workspace_id', 'text', (c) => c.references('workspaces.id').onDelete('set null'))
      .addColumn('created_at', ms, (c) => c.notNull())
      .execute();
    await db.schema.createIndex('projects_company_idx').on('projects').column('company_id').execute();
    await db.schema
      .createTable('tasks')
      .addColumn('id', 'text', (c) => c.primaryKey())
      .addColumn('company_id', 'text', (c) => c.notNull().references('companies.id').onDelete('cascade'))
      .addColumn('project_id', 'text', (c) => c.references('projects.id').onDelete('set null'))
      .addColumn('assignee_agent_id', 'text', (c) => c.references('agents.id').onDelete('set null'))
      .addColumn('workspace_id', 'text', (c) => c.references('workspaces.id').onDelete('set null'))
      .addColumn('title', 'text', (c) => c.notNull())
      .addColumn('description', 'text')
      .addColumn('status', 'text', (c) => c.notNull().defaultTo('backlog'))
      .addColumn('created_at', ms, (c) => c.notNull())
      .addColumn('updated_at', ms, (c) => c.notNull())
      .addCheckConstraint('tasks_status_check', sql`status in (${inList(TASK_STATUSES)})`)
      .execute();
    await db.schema.createIndex('tasks_company_status_idx').on('tasks').columns(['company_id', 'status']).execute();
    await db.schema.createIndex('tasks_status_idx').on('tasks').column('status').execute();
    await db.schema.createIndex('tasks_assignee_idx').on('tasks').column('assignee_agent_id').execute();
    await db.schema.createIndex('tasks_project_idx').on('tasks').column('project_id').execute();
    await db.schema
      .createTable('task_leases')
      .addColumn('task_id', 'text', (c) => c.primaryKey().references('tasks.id').onDelete('cascade'))
      .addColumn('holder', 'text')
      .addColumn('token', 'integer', (c) => c.notNull().defaultTo(0))
      .addColumn('acquired_at', ms)
      .addColumn('expires_at', ms)
      .execute();
    await db.schema
      .createTable('workspace_locks')
      .addColumn('workspace_id', 'text', (c) => c.primaryKey().references('workspaces.id').onDelete('cascade'))
      .addColumn('holder', 'text')
      .addColumn('run_id', 'text')
      .addColumn('token', 'integer', (c) => c.notNull().defaultTo(0))
      .addColumn('acquired_at', ms)
      .addColumn('expires_at', ms)
      .execute();
    await db.schema
      .createTable('coordinator_runs')
      .addColumn('id', 'text', (c) => c.primaryKey())
      .addColumn('coordinator_handle', 'text', (c) => c.notNull())
      .addColumn('status', 'text', (c) => c.notNull())
      .addColumn('spec', 'text')
      .addColumn('started_at', ms, (c) => c.notNull())
      .addColumn('ended_at', ms)
      .addCheckConstraint(
        'coordinator_runs_status_check',
        sql`status in ('running', 'completed', 'failed', 'cancelled')`,
      )
      .execute();
    await db.schema
      .createIndex('coordinator_runs_handle_idx')
      .on('coordinator_runs')
      .column('coordinator_handle')
      .unique()
      .execute();
    await db.schema
      .createIndex('coordinator_runs_status_idx')
      .on('coordinator_runs')
      .columns(['status', 'started_at'])
      .execute();
    await db.schema
      .createTable('dispatch_contexts')
      .addColumn('id', 'text', (c) => c.primaryKey())
      .addColumn('task_id', 'text', (c) => c.notNull().references('tasks.id').onDelete('cascade'))
      .addColumn('agent_id', 'text', (c) => c.references('agents.id').onDelete('set null'))
      .addColumn('terminal_handle', 'text', (c) => c.notNull())
      .addColumn('status', 'text', (c) => c.notNull())
      .addColumn('error', 'text')
      .addColumn('created_at', ms, (c) => c.notNull())
      .addColumn('updated_at', ms, (c) => c.notNull())
      .addColumn('ended_at', ms)
      .addCheckConstraint(
        'dispatch_contexts_status_check',
        sql`status in ('active', 'completed', 'failed', 'cancelled')`,
      )
      .execute();
    await db.schema
      .createIndex('dispatch_contexts_terminal_idx')
      .on('dispatch_contexts')
      .columns(['terminal_handle', 'status'])
      .execute();
    await db.schema
      .createIndex('dispatch_contexts_task_idx')
      .on('dispatch_contexts')
      .columns(['task_id', 'status'])
      .execute();
    await db.schema
      .createTable('decision_gates')
      .addColumn('id', 'text', (c) => c.primaryKey())
      .addColumn('task_id', 'text', (c) => c.references('tasks.id').onDelete('cascade'))
      .addColumn('question', 'text', (c) => c.notNull())
      .addColumn('status', 'text', (c) => c.notNull())
      .addColumn('resolution', 'text')
      .addColumn('created_at', ms, (c) => c.notNull())
      .addColumn('resolved_at', ms)
      .addCheckConstraint('decision_gates_status_check', sql`status in ('open', 'resolved')`)
      .execute();
    await db.schema.createIndex('decision_gates_task_idx').on('decision_gates').column('task_id').execute();
    await db.schema
      .createTable('messages')
      .addColumn('id', 'text', (c) => c.primaryKey())
      .addColumn('from_handle', 'text', (c) => c.notNull())
      .addColumn('to_handle', 'text', (c) => c.notNull())
      .addColumn('kind', 'text', (c) => c.notNull())
      .addColumn('payload', 'text')
      .addColumn('status', 'text', (c) => c.notNull())
      .addColumn('created_at', ms, (c) => c.notNull())
      .addColumn('delivered_at', ms)
      .addCheckConstraint('messages_status_check', sql`status in ('pending', 'delivered')`)
      .execute();
    await db.schema
      .createIndex('messages_inbox_idx')
      .on('messages')
      .columns(['to_handle', 'status', 'created_at', 'id'])
      .execute();
  },
  async down({ db }) {
    for (const table of [
      'messages',
      'decision_gates',
      'dispatch_contexts',
      'coordinator_runs',
      'workspace_locks',
      'task_leases',
      'tasks',
      'projects',
      'agents',
      'workspaces',
      'companies',
    ]) {
      await db.schema.dropTable(table).execute();
    }
  },
};
