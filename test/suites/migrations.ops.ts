/** Contender operations for the migration suite (run in child processes by the race helper). */
import { sql } from 'kysely';
import { Migrator, MIGRATIONS, type MigrationDefinition, type Store } from '../../src/index.js';
import type { ContenderTools } from '../support/contender.js';

/** Migrates to the latest version (or `to`), reporting what this process applied. */
export async function migrate(store: Store, args: { to?: number }) {
  const result = await store.migrate({ ...(args.to !== undefined ? { to: args.to } : {}), lockTimeoutMs: 120_000 });
  return { applied: result.applied, reverted: result.reverted, toVersion: result.toVersion };
}

/**
 * Migrates with an extra version 9000 whose `up` signals and then hangs inside its transaction,
 * so the parent can SIGKILL this process mid-migration.
 */
export async function migrateAndHang(store: Store, _args: unknown, tools: ContenderTools) {
  const hanging: MigrationDefinition = {
    version: 9000,
    name: 'hangs_midway',
    async up({ db }) {
      await db.schema.createTable('half_applied').addColumn('id', 'text').execute();
      await sql`insert into tasks (id, company_id, title, created_at, updated_at) select 'never', id, 'x', 0, 0 from companies`.execute(db);
      tools.signal('inside');
      await new Promise(() => {}); // never resolves: killed here
    },
    async down({ db }) {
      await db.schema.dropTable('half_applied').execute();
    },
  };
  await new Migrator(store.dialect, [...MIGRATIONS, hanging]).migrate();
}
