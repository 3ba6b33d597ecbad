/** Contender operations for the dialect suite. */
import { sql } from 'kysely';
import type { Store } from '../../src/index.js';
import { defineOperations } from '../support/operations.js';
import { tbl } from '../support/schema.js';

/**
 * Read-modify-write of one counter row, `times` times, each in its own write transaction that
 * first takes `lockKey`. Without the serialization the write transaction promises, concurrent
 * increments would be lost.
 */
export async function incrementCounter(store: Store, args: { times: number }) {
  for (let i = 0; i < args.times; i++) {
    await store.dialect.writeTransaction(async (trx) => {
      await store.dialect.lockKey(trx, 'counter');
      const row = await trx
        .selectFrom('companies')
        .select('created_at')
        .where('id', '=', 'counter')
        .executeTakeFirstOrThrow();
      await sql`update ${tbl(trx, 'companies')} set created_at = ${Number(row.created_at) + 1} where id = 'counter'`.execute(
        trx,
      );
    });
  }
  return { retries: store.dialect.stats.retries };
}

/** The operations this module's contenders run (see test/support/operations.ts). */
export const ops = defineOperations(import.meta.url, { incrementCounter });
