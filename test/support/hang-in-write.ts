/**
 * A child process that opens a write transaction on the SQLite file FAULT_URL, writes two rows
 * (a company and its workspace), tells the parent, and hangs there — holding the write lock —
 * until it is SIGKILLed. For the SQLite fault tests.
 */
import { openStore } from '../../src/index.js';

const store = await openStore({ url: process.env.FAULT_URL! });
await store.dialect.writeTransaction(async (trx) => {
  await trx.insertInto('companies').values({ id: 'half', name: 'half-written', created_at: 1 }).execute();
  await trx
    .insertInto('workspaces')
    .values({ id: 'half-ws', company_id: 'half', name: 'ws', root_path: null, created_at: 1 })
    .execute();
  process.send!({ type: 'holding' });
  // Keep the event loop busy: with nothing pending, Node would exit (and SQLite release the lock) on its own.
  setInterval(() => {}, 1_000);
  await new Promise(() => {}); // never resolves: SIGKILLed here
});
