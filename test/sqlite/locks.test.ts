import { afterAll, describe, expect, it } from 'vitest';
import Database from 'better-sqlite3';
import { defineLockSuite } from '../suites/locks.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineLockSuite(sqliteFixture);

describe('workspace lock claims behind an open SQLite writer (deterministic interleaving)', () => {
  const fx = sqliteFixture();
  afterAll(() => fx.cleanup());

  it('a claim that waits on BEGIN IMMEDIATE sees the committed release and wins with the next token', async () => {
    const url = await fx.freshUrl();
    const store = await fx.open(url);
    await store.migrate();
    const company = (await store.org.createCompany({ name: 'Acme' })).id;
    const ws = (await store.org.createWorkspace({ companyId: company, name: 'repo' })).id;
    expect(await store.locks.claimWorkspaceLock(ws, { holder: 'a', runId: 'ra', ttlMs: 60_000 })).toMatchObject({
      status: 'acquired',
      lease: { token: 1 },
    });

    // Another connection holds the write lock with the holder's release not yet committed.
    const other = new Database(url.slice('sqlite:'.length));
    try {
      other.exec('BEGIN IMMEDIATE');
      other
        .prepare('update workspace_locks set holder = null, run_id = null where workspace_id = ? and token = 1')
        .run(ws);
      const retriesBefore = store.dialect.stats.retries;
      const claim = store.locks.claimWorkspaceLock(ws, { holder: 'b', runId: 'rb', ttlMs: 60_000 });
      // Commit only after the claim has met the write lock at least once (SQLITE_BUSY, then retried).
      while (store.dialect.stats.retries === retriesBefore) await new Promise((resolve) => setTimeout(resolve, 5));
      other.exec('COMMIT');
      expect(await claim).toMatchObject({ status: 'acquired', lease: { token: 2 } });
    } finally {
      other.close();
    }
  });
});
