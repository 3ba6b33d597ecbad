import { inject } from 'vitest';
import { PostgresFixture, SqliteFixture, type DialectFixture, type PostgresFixtureOptions } from './fixtures.js';

/** For `test/sqlite/*.test.ts`: SQLite files in a temp folder. */
export const sqliteFixture = (): DialectFixture => new SqliteFixture();

/** For `test/postgres/*.test.ts`: a database per fixture call on the server the global setup chose. */
export const postgresFixture = (options?: PostgresFixtureOptions): DialectFixture =>
  new PostgresFixture(inject('pgAdminUrl'), options);
