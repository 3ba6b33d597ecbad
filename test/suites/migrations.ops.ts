/** Contender operations for the migration suite (run in child processes by the race helper). */
import { sql } from 'kysely';
import { Migrator, MIGRATIONS, type MigrationDefinition, type Store } from '../../src/index.js';
import type { ContenderTools } from '../support/contender.js';
import { defineOperations } from '../support/operations.js';
import { tbl } from '../support/schema.js';

/** Migrates to the latest version (or `to`), reporting what this process applied. */
export async function migrate(store: Store, args: { to?: number }) {
  const result = await store.migrate({ ...(args.to !== undefined ? { to: args.to } : {}), lockTimeoutMs: 300_000 });
  return { applied: result.applied, reverted: result.reverted, toVersion: result.toVersion };
}

/**
 * Migrates with migration 0052 wrapped so that, after its real `up` has run inside the
 * transaction (column added, backfill done, history row not yet written), it signals and hangs:
 * the parent SIGKILLs this process there. The checksum recorder calls `up` with now = 0, so the
 * hang only happens on the real run.
 */
export async function migrateAndHangInside0052(store: Store, _args: unknown, tools: ContenderTools) {
  const chain: MigrationDefinition[] = MIGRATIONS.map((m) =>
    m.version !== 52
      ? m
      : {
          ...m,
          async up(ctx) {
            await m.up(ctx);
            if (ctx.now === 0) return;
            await sql`insert into ${tbl(ctx.db, 'companies')} (id, name, created_at) values ('ghost', 'written mid-migration', 0)`.execute(
              ctx.db,
            );
            tools.signal('inside-0052');
            await new Promise(() => {});
          },
        },
  );
  await new Migrator(store.dialect, chain).migrate({ now: Date.now() });
}

/**
 * Migrates with 0052 wrapped so that, after its real `up` ran inside the transaction (column
 * added, backfill done, history row not yet written), it signals and then stays in the
 * transaction for a while (PostgreSQL: `pg_sleep` in the migration's own backend): the parent
 * terminates that backend, or SIGKILLs this process on SQLite, while a second deploy waits.
 */
export async function migrateSlowly0052(store: Store, _args: unknown, tools: ContenderTools) {
  let entered = 0;
  const chain: MigrationDefinition[] = MIGRATIONS.map((m) =>
    m.version !== 52
      ? m
      : {
          ...m,
          async up(ctx) {
            await m.up(ctx);
            if (ctx.now === 0) return;
            if (++entered === 1) {
              tools.signal('inside-0052');
              if (store.dialect.kind === 'postgres') await sql`select pg_sleep(20)`.execute(ctx.db);
              else await new Promise(() => {});
            }
          },
        },
  );
  const result = await new Migrator(store.dialect, chain).migrate({ now: Date.now(), migrationLockWaitMs: 120_000 });
  return { applied: result.applied, toVersion: result.toVersion };
}

/** Migrates, signalling `waiting` when it reports that it waits for the migration lock. */
export async function migrateReportingWait(store: Store, _args: unknown, tools: ContenderTools) {
  const result = await store.migrate({
    migrationLockWaitMs: 120_000,
    onEvent: (event) => {
      if (event.type === 'waiting') tools.signal('waiting');
    },
  });
  return { applied: result.applied, toVersion: result.toVersion };
}

/** The operations this module's contenders run (see test/support/operations.ts). */
export const ops = defineOperations(import.meta.url, {
  migrate,
  migrateAndHangInside0052,
  migrateSlowly0052,
  migrateReportingWait,
});
