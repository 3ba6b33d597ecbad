import { afterAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import { BACKFILL_EXPECTED, defineLockSuite, runBackfillFixture } from '../suites/locks.suite.js';
import { postgresFixture, sqliteFixture } from '../support/dialects.js';
import { useUrlSchema } from '../support/schema.js';

defineLockSuite(postgresFixture);

describe('v52 backfill across dialects', () => {
  const sqlite = sqliteFixture();
  const postgres = postgresFixture();
  afterAll(async () => {
    await sqlite.cleanup();
    await postgres.cleanup();
  });

  it('SQLite and PostgreSQL set requires_filesystem identically, row for row', async () => {
    const [onSqlite, onPostgres] = [await runBackfillFixture(sqlite), await runBackfillFixture(postgres)];
    expect(onPostgres).toEqual(onSqlite);
    expect(onSqlite).toEqual(BACKFILL_EXPECTED);
  });
});

describe('workspace lock claims under READ COMMITTED (deterministic interleavings)', () => {
  const fx = postgresFixture();
  afterAll(() => fx.cleanup());

  /** Waits until a taskfence connection is blocked on a lock (not a timed assertion: it polls until seen). */
  async function waitUntilBlocked(admin: pg.Client): Promise<void> {
    for (let i = 0; i < 2000; i++) {
      // `admin` is inside a transaction, where pg_stat_activity is a snapshot taken at first read.
      await admin.query('select pg_stat_clear_snapshot()');
      const { rows } = await admin.query(
        `select count(*)::int as n from pg_stat_activity where application_name = 'taskfence' and wait_event_type = 'Lock' and datname = current_database()`,
      );
      if (rows[0].n > 0) return;
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    throw new Error('the claim never blocked on the row lock');
  }

  it('a claim blocked behind an in-flight release re-checks the latest row and wins with the next token', async () => {
    const url = await fx.freshUrl();
    const store = await fx.open(url);
    await store.migrate();
    const company = (await store.org.createCompany({ name: 'Acme' })).id;
    const ws = (await store.org.createWorkspace({ companyId: company, name: 'repo' })).id;
    const first = await store.locks.claimWorkspaceLock(ws, { holder: 'a', runId: 'ra', ttlMs: 60_000 });
    expect(first).toMatchObject({ status: 'acquired', lease: { token: 1 } });

    const other = new pg.Client({ connectionString: url });
    await other.connect();
    await useUrlSchema(other, url);
    try {
      // Transaction A: the holder's release, row-locked and not yet committed.
      await other.query('begin');
      await other.query(
        `update workspace_locks set holder = null, run_id = null where workspace_id = $1 and token = 1`,
        [ws],
      );
      const claim = store.locks.claimWorkspaceLock(ws, { holder: 'b', runId: 'rb', ttlMs: 60_000 });
      await waitUntilBlocked(other);
      await other.query('commit');
      // Evaluated on the committed version, not on the snapshot from before the wait.
      expect(await claim).toMatchObject({ status: 'acquired', lease: { token: 2 } });
    } finally {
      await other.end();
    }
  });

  it('a claim blocked behind a competing claim sees the new holder and reports busy', async () => {
    const url = await fx.freshUrl();
    const store = await fx.open(url);
    await store.migrate();
    const company = (await store.org.createCompany({ name: 'Acme' })).id;
    const ws = (await store.org.createWorkspace({ companyId: company, name: 'repo' })).id;
    const first = await store.locks.claimWorkspaceLock(ws, { holder: 'a', runId: 'ra', ttlMs: 60_000 });
    if (first.status !== 'acquired') throw new Error('expected a claim');
    await store.locks.releaseWorkspaceLock(ws, { token: first.lease.token });

    const other = new pg.Client({ connectionString: url });
    await other.connect();
    await useUrlSchema(other, url);
    try {
      // Transaction A: another process's claim of the free lock, not yet committed.
      await other.query('begin');
      await other.query(
        `update workspace_locks set holder = 'c', run_id = 'rc', token = token + 1, expires_at = $2 where workspace_id = $1`,
        [ws, Date.now() + 60_000],
      );
      const claim = store.locks.claimWorkspaceLock(ws, { holder: 'b', runId: 'rb', ttlMs: 60_000 });
      await waitUntilBlocked(other);
      await other.query('commit');
      expect(await claim).toMatchObject({ status: 'busy', heldBy: { holder: 'c', runId: 'rc', token: 2 } });
      expect(await store.db.selectFrom('workspace_locks').select(['holder', 'token']).execute()).toEqual([
        { holder: 'c', token: 2 },
      ]);
    } finally {
      await other.end();
    }
  });
});

describe('the workspace lock claim function (schema 0109, PostgreSQL)', () => {
  const fx = postgresFixture();
  afterAll(() => fx.cleanup());

  it('before 0109 a claim fails with SCHEMA_OUT_OF_DATE and writes nothing; migrated, it is granted token 1, and a second holder is told who holds it', async () => {
    const store = await fx.freshStore({ to: 108 });
    const companyId = (await store.org.createCompany({ name: 'Claim 0109' })).id;
    const workspaceId = (await store.org.createWorkspace({ companyId, name: 'claim-0109' })).id;
    const claim = (holder: string) =>
      store.locks.claimWorkspaceLock(workspaceId, { holder, runId: 'r', ttlMs: 60_000 });
    await expect(claim('a')).rejects.toMatchObject({ code: 'SCHEMA_OUT_OF_DATE', currentVersion: 108 });
    expect(await store.locks.getWorkspaceLock(workspaceId)).toBeNull();
    await store.migrate();
    expect(await claim('a')).toMatchObject({ status: 'acquired', lease: { holder: 'a', token: 1 } });
    expect(await claim('b')).toMatchObject({ status: 'busy', heldBy: { holder: 'a', runId: 'r', token: 1 } });
  });
});
