import { sql } from 'kysely';
import type { MigrationDefinition } from './types.js';

const OWNED = ['task_environments', 'workspace_groups'] as const;

/**
 * Ownership generations (seed 004): every environment and group carries
 * `ownership_generation` (existing rows start at 1) and a generation-scoped cleanup claim;
 * the task cleanup barrier records admissions; cleanup snapshots persist the inventory
 * (resource, owner task, generation) so teardown can be retried after a restart.
 */
export const migration0054: MigrationDefinition = {
  version: 54,
  name: 'ownership_generations',
  async up({ db, types }) {
    const ms = types.epochMs;
    for (const table of OWNED) {
      await db.schema
        .alterTable(table)
        .addColumn('ownership_generation', 'integer', (c) => c.notNull().defaultTo(1))
        .execute();
      await db.schema.alterTable(table).addColumn('cleanup_claimed_by', 'text').execute();
      await db.schema.alterTable(table).addColumn('cleanup_claim_generation', 'integer').execute();
      await db.schema.alterTable(table).addColumn('cleanup_claim_expires_at', ms).execute();
    }
    await db.schema
      .createTable('task_cleanup_admissions')
      .addColumn('task_id', 'text', (c) => c.primaryKey())
      .addColumn('kind', 'text', (c) => c.notNull())
      .addColumn('admitted_at', ms, (c) => c.notNull())
      .addCheckConstraint('task_cleanup_admissions_kind_check', sql`kind in ('archive', 'delete')`)
      .execute();
    await db.schema
      .createTable('cleanup_snapshots')
      .addColumn('id', 'text', (c) => c.primaryKey())
      .addColumn('task_id', 'text', (c) => c.notNull())
      .addColumn('resource_kind', 'text', (c) => c.notNull())
      .addColumn('resource_id', 'text', (c) => c.notNull())
      .addColumn('owner_task_id', 'text', (c) => c.notNull())
      .addColumn('ownership_generation', 'integer', (c) => c.notNull())
      .addColumn('state', 'text', (c) => c.notNull().defaultTo('pending'))
      .addColumn('attempts', 'integer', (c) => c.notNull().defaultTo(0))
      .addColumn('claimed_by', 'text')
      .addColumn('claim_expires_at', ms)
      .addColumn('last_error', 'text')
      .addColumn('created_at', ms, (c) => c.notNull())
      .addColumn('updated_at', ms, (c) => c.notNull())
      .addCheckConstraint('cleanup_snapshots_kind_check', sql`resource_kind in ('environment', 'group')`)
      .addCheckConstraint(
        'cleanup_snapshots_state_check',
        sql`state in ('pending', 'claimed', 'completed', 'failed', 'stale')`,
      )
      .execute();
    await db.schema
      .createIndex('cleanup_snapshots_resource_idx')
      .on('cleanup_snapshots')
      .columns(['task_id', 'resource_kind', 'resource_id'])
      .unique()
      .execute();
    await db.schema
      .createIndex('cleanup_snapshots_state_idx')
      .on('cleanup_snapshots')
      .columns(['state', 'created_at'])
      .execute();
  },
  async down({ db }) {
    await db.schema.dropTable('cleanup_snapshots').execute();
    await db.schema.dropTable('task_cleanup_admissions').execute();
    for (const table of OWNED) {
      for (const column of [
        'cleanup_claim_expires_at',
        'cleanup_claim_generation',
        'cleanup_claimed_by',
        'ownership_generation',
      ]) {
        await db.schema.alterTable(table).dropColumn(column).execute();
      }
    }
  },
};
