/** Contender operations for the online-migration suite (run in child processes by the race helper). */
import { MIGRATIONS, Migrator, type MigrationDefinition, type Store } from '../../src/index.js';
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

/** The operations this module's contenders run (see test/support/operations.ts). */
export const ops = defineOperations(import.meta.url, { migrateAndHangInBackfill });
