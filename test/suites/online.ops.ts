/** Contender operations for the online-migration suite (run in child processes by the race helper). */
import { MIGRATIONS, Migrator, type MigrationDefinition, type Store } from '../../src/index.js';
import type { StoreDialect } from '../../src/dialects/types.js';
import type { ContenderTools } from '../support/contender.js';
import { defineOperations } from '../support/operations.js';

/**
 * Migrates to the latest version with `batchSize`, 0052's backfill wrapped so that its batch
 * number `hangIn` runs its real statements and then signals `inside-batch` and never returns (its
 * transaction still open, uncommitted): the parent SIGKILLs this process there. The checksum
 * recorder calls the batch with now = 0, so the hang only happens on the real run.
 */
export async function migrateAndHangInBackfill(
  store: Store,
  args: { now: number; batchSize: number; hangIn: number },
  tools: ContenderTools,
) {
  let batches = 0;
  const chain: MigrationDefinition[] = MIGRATIONS.map((m) =>
    m.version !== 52 || !m.backfill
      ? m
      : {
          ...m,
          backfill: {
            ...m.backfill,
            async batch(ctx, cursor) {
              const result = await m.backfill!.batch(ctx, cursor);
              if (ctx.now !== 0 && ++batches === args.hangIn) {
                tools.signal('inside-batch');
                await new Promise(() => {});
              }
              return result;
            },
          },
        },
  );
  await new Migrator(store.dialect, chain).migrate({ now: args.now, batchSize: args.batchSize });
}

/**
 * Migrates to the latest version through a dialect whose `withMigrationSession` (which runs each
 * concurrent step) signals `before-step` on its call number `hangAt` and never returns: the DDL of
 * that step's migration committed, the step not run. The parent SIGKILLs this process there.
 * (0052 has one step, so call 2 is 0053's first: tasks_parent_idx.)
 */
export async function migrateAndHangBeforeStep(store: Store, args: { hangAt: number }, tools: ContenderTools) {
  let calls = 0;
  const hanging: StoreDialect['withMigrationSession'] = (fn, options) => {
    if (++calls === args.hangAt) {
      tools.signal('before-step');
      return new Promise(() => {});
    }
    return store.dialect.withMigrationSession(fn, options);
  };
  const dialect = new Proxy(store.dialect, {
    get(target, key) {
      if (key === 'withMigrationSession') return hanging;
      const value: unknown = Reflect.get(target, key, target);
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
  await new Migrator(dialect).migrate();
}

/** The operations this module's contenders run (see test/support/operations.ts). */
export const ops = defineOperations(import.meta.url, { migrateAndHangInBackfill, migrateAndHangBeforeStep });
