import type { MigrationDefinition } from './types.js';

/**
 * The audit trail (issue 26): one row per recorded act (an operator action from the dashboard,
 * and the lease and ownership acts that write it), written in the same transaction as the act,
 * so a row exists exactly when the act committed. Append-only; `prune` deletes rows older than
 * its cutoff (`audit_events_at_idx`), and `audit_events_subject_idx` serves "what happened to
 * this lease / run / resource". A new table only: online-safe on both dialects.
 */
export const migration0080: MigrationDefinition = {
  version: 80,
  name: 'audit_events',
  async up({ db, types }) {
    const ms = types.epochMs;
    await db.schema
      .createTable('audit_events')
      .addColumn('id', 'text', (c) => c.primaryKey())
      .addColumn('at', ms, (c) => c.notNull())
      .addColumn('actor', 'text', (c) => c.notNull())
      .addColumn('action', 'text', (c) => c.notNull())
      .addColumn('subject_kind', 'text', (c) => c.notNull())
      .addColumn('subject_id', 'text', (c) => c.notNull())
      .addColumn('token', ms)
      .addColumn('generation', ms)
      .addColumn('detail', 'text')
      .execute();
    await db.schema.createIndex('audit_events_at_idx').on('audit_events').column('at').execute();
    await db.schema
      .createIndex('audit_events_subject_idx')
      .on('audit_events')
      .columns(['subject_kind', 'subject_id', 'at'])
      .execute();
  },
  async down({ db }) {
    await db.schema.dropTable('audit_events').execute();
  },
};
