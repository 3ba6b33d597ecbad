import { afterAll, describe, expect, it, vi } from 'vitest';
import { sql } from 'kysely';
import { postgresFixture } from '../support/dialects.js';
import { tbl } from '../support/schema.js';

// A PostgreSQL-only install: opening SQLite fails as it does without better-sqlite3. (Switched off
// only after migrating: this branch's migrator still finds a version's tables with SQLite.)
const driver = vi.hoisted(() => ({ installed: true }));
vi.mock('../../src/dialects/sqlite/sqlite-dialect.js', async (importOriginal) => {
  const real = await importOriginal<typeof import('../../src/dialects/sqlite/sqlite-dialect.js')>();
  return {
    ...real,
    openSqliteDialect: async (...args: Parameters<typeof real.openSqliteDialect>) => {
      if (driver.installed) return real.openSqliteDialect(...args);
      throw Object.assign(new Error("Cannot find package 'better-sqlite3'"), { code: 'ERR_MODULE_NOT_FOUND' });
    },
  };
});

describe('doctor on a PostgreSQL-only install (no better-sqlite3)', () => {
  const fx = postgresFixture();
  afterAll(() => fx.cleanup());

  it('builds the drift reference on the live database instead, and still names a dropped index', async () => {
    const store = await fx.freshStore();
    driver.installed = false;
    const clean = await store.doctor();
    expect(clean.checks.filter((c) => c.status === 'fail')).toEqual([]);
    expect(clean.checks.find((c) => c.id === 'drift.schema')?.status).toBe('pass');
    await sql`drop index ${tbl(store.db, 'path_leases_task_idx')}`.execute(store.db);
    const drifted = await store.doctor();
    expect(drifted.ok).toBe(false);
    expect(drifted.checks.find((c) => c.id === 'drift.schema')?.items).toEqual([
      'missing index path_leases_task_idx on path_leases (task_id)',
    ]);
  });
});
