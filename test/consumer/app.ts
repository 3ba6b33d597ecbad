// A consumer app, typechecked (strict, skipLibCheck off) against the installed tarball and the
// app's own kysely, then run. The app's own code takes `Kysely<Database>` from *its* kysely.
import { Kysely, sql, type Transaction } from 'kysely';
import { openStore, type Database, type Store, type StoreTransaction } from 'taskfence';

async function companyNames(db: Kysely<Database>): Promise<string[]> {
  const rows = await db.selectFrom('companies').select('name').orderBy('name').execute();
  return rows.map((r) => r.name);
}

async function renameInTransaction(db: Kysely<Database>, id: string, name: string): Promise<void> {
  await db.transaction().execute(async (trx: Transaction<Database>) => {
    await trx.updateTable('companies').set({ name }).where('id', '=', id).execute();
  });
}

const url = process.argv[2];
if (!url) throw new Error('usage: node out/app.js <database url>');
const store: Store = await openStore(url);
try {
  await store.migrate();
  const company = await store.org.createCompany({ name: 'Acme' });
  await renameInTransaction(store.db, company.id, 'Acme Corp');
  const names = await companyNames(store.db);
  if (names.join() !== 'Acme Corp') throw new Error(`unexpected companies: ${names.join()}`);
  // The host's write and taskfence's claim commit together, or not at all.
  const ws = await store.org.createWorkspace({ companyId: company.id, name: 'main' });
  const run = await store.runs.startCoordinatorRun({ targetKey: null });
  await store
    .transaction(async (tx: StoreTransaction) => {
      await tx.db.updateTable('companies').set({ name: 'rolled back' }).where('id', '=', company.id).execute();
      await tx.locks.claimWorkspaceLock(ws.id, { holder: 'app', runId: run.id, ttlMs: 60_000 });
      throw new Error('host rollback');
    })
    .catch((error: unknown) => {
      if (!(error instanceof Error) || error.message !== 'host rollback') throw error;
    });
  if ((await store.locks.getWorkspaceLock(ws.id)) !== null) throw new Error('a rolled-back claim is held');
  await store.transaction(async (tx: StoreTransaction) => {
    await tx.lockResources(['box:a']);
    await tx.db.updateTable('companies').set({ name: 'Acme Corp' }).where('id', '=', company.id).execute();
    const claim = await tx.locks.claimWorkspaceLock(ws.id, { holder: 'app', runId: run.id, ttlMs: 60_000 });
    if (claim.status !== 'acquired') throw new Error('claim busy');
  });
  if ((await store.locks.getWorkspaceLock(ws.id))?.holder !== 'app') throw new Error('the committed claim is missing');
  const one = await sql<{ one: number }>`select 1 as one`.execute(store.db);
  if (Number(one.rows[0]?.one) !== 1) throw new Error('raw sql through the app kysely failed');
  console.log(
    `consumer app on ${url.split(':')[0]}: ok, store.transaction commits and rolls back with the host (schema ${(await store.migrationStatus()).currentVersion})`,
  );
} finally {
  await store.close();
}
