import { afterAll, describe, expect, it } from 'vitest';
import { sql } from 'kysely';
import { openStore, type DoctorReport } from '../../src/index.js';
import { defineDoctorSuite } from '../suites/doctor.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineDoctorSuite(sqliteFixture);

const statusOf = (report: DoctorReport, id: string) => report.checks.find((c) => c.id === id)?.status;

describe('doctor on SQLite connections', () => {
  const fx = sqliteFixture();
  afterAll(() => fx.cleanup());

  it('fails when foreign keys are off on the connection', async () => {
    const store = await fx.freshStore();
    await sql`pragma foreign_keys = off`.execute(store.db);
    const report = await store.doctor();
    expect(report.ok).toBe(false);
    expect(report.checks.filter((c) => c.status === 'fail').map((c) => c.id)).toEqual(['guarantee.foreign-keys']);
  });

  it("reports the durability in force: FULL passes, 'normal' warns about power loss, OFF fails", async () => {
    const full = await fx.freshStore();
    expect((await full.doctor()).checks.find((c) => c.id === 'guarantee.durability')).toMatchObject({
      status: 'pass',
      detail: expect.stringMatching(/synchronous is FULL/),
    });
    const normal = await fx.freshStore({ durability: 'normal' });
    const report = await normal.doctor();
    expect(report.ok).toBe(true);
    expect(report.checks.find((c) => c.id === 'guarantee.durability')).toMatchObject({
      status: 'warn',
      detail: expect.stringMatching(/synchronous is NORMAL .*power loss/),
    });
    await sql`pragma synchronous = off`.execute(normal.db);
    expect(statusOf(await normal.doctor(), 'guarantee.durability')).toBe('fail');
    await expect(fx.freshStore({ durability: 'fast' as 'full' })).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
  });

  it('fails when the file is not in WAL mode, or busy_timeout is 0', async () => {
    const store = await fx.freshStore();
    await sql`pragma journal_mode = delete`.execute(store.db);
    await sql`pragma busy_timeout = 0`.execute(store.db);
    const report = await store.doctor();
    expect(report.checks.filter((c) => c.status === 'fail').map((c) => c.id)).toEqual([
      'guarantee.wal',
      'guarantee.busy-timeout',
    ]);
  });

  it('warns (and still passes) on an in-memory database, where no second connection can look', async () => {
    const store = await openStore('sqlite::memory:');
    try {
      await store.migrate();
      const report = await store.doctor();
      expect(report.ok).toBe(true);
      expect(statusOf(report, 'guarantee.wal')).toBe('warn');
      expect(report.checks.find((c) => c.id === 'guarantee.begin-immediate')).toMatchObject({
        status: 'warn',
        detail: expect.stringMatching(/^not probed: an in-memory database/),
      });
      expect(statusOf(report, 'drift.schema')).toBe('pass');
    } finally {
      await store.close();
    }
  });
});
