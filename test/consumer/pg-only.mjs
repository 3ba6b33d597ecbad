// A PostgreSQL-only app (better-sqlite3 not installed): migrates and works on PostgreSQL, and a
// `sqlite:` URL fails at once with DriverNotInstalledError saying what to install.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { openStore, DriverNotInstalledError } from 'taskfence';

await assert.rejects(openStore('sqlite:./never.sqlite'), (error) => {
  assert.ok(error instanceof DriverNotInstalledError, `got ${error}`);
  assert.equal(error.code, 'DRIVER_NOT_INSTALLED');
  assert.match(error.message, /npm install better-sqlite3/);
  assert.doesNotMatch(error.message, /\n/);
  return true;
});

const admin = new pg.Client({ connectionString: process.env.TEST_PG_URL });
await admin.connect();
const name = `tf_consumer_${randomBytes(4).toString('hex')}`;
await admin.query(`create database ${name}`);
try {
  const url = new URL(process.env.TEST_PG_URL);
  url.pathname = `/${name}`;
  const store = await openStore(url.toString());
  try {
    await store.migrate();
    const company = await store.org.createCompany({ name: 'Acme' });
    const row = await store.db
      .selectFrom('companies')
      .select('name')
      .where('id', '=', company.id)
      .executeTakeFirstOrThrow();
    assert.equal(row.name, 'Acme');
    // store.transaction on PostgreSQL: a thrown callback leaves neither the host write nor the claim.
    const ws = await store.org.createWorkspace({ companyId: company.id, name: 'main' });
    const run = await store.runs.startCoordinatorRun({ targetKey: null });
    await assert.rejects(
      store.transaction(async (tx) => {
        await tx.db.updateTable('companies').set({ name: 'rolled back' }).where('id', '=', company.id).execute();
        await tx.locks.claimWorkspaceLock(ws.id, { holder: 'app', runId: run.id, ttlMs: 60_000 });
        throw new Error('host rollback');
      }),
      /host rollback/,
    );
    assert.equal(await store.locks.getWorkspaceLock(ws.id), null);
    assert.equal(
      (await store.db.selectFrom('companies').select('name').where('id', '=', company.id).executeTakeFirstOrThrow())
        .name,
      'Acme',
    );
    // The CLI from the installed package: `inspect --json` has every section.
    const inspected = JSON.parse(
      execFileSync('node_modules/.bin/taskfence', ['inspect', '--db', url.toString(), '--json'], { encoding: 'utf8' }),
    );
    for (const key of ['runs', 'dispatches', 'locks', 'paths', 'semaphores', 'inbox', 'ownership', 'readyQueue'])
      assert.ok(key in inspected, `inspect --json has no ${key}`);
    assert.equal(inspected.runs.running.total, 1);
    console.log(
      `PostgreSQL-only app: ok (schema ${(await store.migrationStatus()).currentVersion}, sqlite: URL -> DRIVER_NOT_INSTALLED, inspect --json)`,
    );
  } finally {
    await store.close();
  }
} finally {
  await admin.query(`drop database if exists ${name}`);
  await admin.end();
}
