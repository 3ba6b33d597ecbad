import { afterAll, describe, expect, it } from 'vitest';
import { BACKFILL_EXPECTED, defineLockSuite, runBackfillFixture } from '../suites/locks.suite.js';
import { postgresFixture, sqliteFixture } from '../support/dialects.js';

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
