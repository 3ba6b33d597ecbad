import type { Transaction } from 'kysely';
import type { Database, Store } from '../../src/index.js';

/**
 * Opens a write transaction on `store`, runs `inside` in it, and keeps it open (on SQLite that
 * holds the database's write lock) until `release()`; resolves once the transaction is open.
 */
export async function holdWriteLock(
  store: Store,
  inside: (trx: Transaction<Database>) => Promise<unknown>,
): Promise<{ release(): Promise<void> }> {
  let release!: () => void;
  const held = new Promise<void>((resolve) => (release = resolve));
  let locked!: () => void;
  const isLocked = new Promise<void>((resolve) => (locked = resolve));
  const holding = store.dialect.writeTransaction(async (trx) => {
    await inside(trx);
    locked();
    await held;
  });
  await Promise.race([isLocked, holding]);
  return {
    async release() {
      release();
      await holding;
    },
  };
}
