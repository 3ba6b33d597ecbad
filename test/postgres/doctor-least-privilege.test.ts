/**
 * `doctor` run as a least-privilege application role (SELECT/INSERT/UPDATE/DELETE on taskfence's
 * tables, nothing else): probes the role may not run warn and name the privilege; the report
 * passes and the CLI exits 0, because the runtime works fully under that role.
 */
import { afterAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import { postgresFixture } from '../support/dialects.js';
import { runCli } from '../suites/cli.suite.js';

const fx = postgresFixture();
afterAll(() => fx.cleanup());

describe('doctor under least privilege', () => {
  it('warns naming the missing privilege instead of failing, and exits 0', async () => {
    const url = await fx.freshUrl();
    await (await fx.open(url)).migrate();
    const role = `tf_app_${Math.random().toString(36).slice(2, 8)}`;
    const admin = new pg.Client({ connectionString: url.replace(/\?.*$/, '') });
    await admin.connect();
    const schema = new URL(url).searchParams.get('schema') ?? 'public';
    try {
      await admin.query(`create role ${role} login`);
      await admin.query(`revoke create on schema public from public`);
      await admin.query(`grant usage on schema ${schema} to ${role}`);
      await admin.query(`grant select, insert, update, delete on all tables in schema ${schema} to ${role}`);
      const limited = new URL(url);
      limited.username = role;
      const store = await fx.open(limited.toString());
      // The runtime works under the role …
      const company = (await store.org.createCompany({ name: 'acme' })).id;
      const ws = (await store.org.createWorkspace({ companyId: company, name: 'repo' })).id;
      expect((await store.locks.claimWorkspaceLock(ws, { holder: 'h', runId: 'r', ttlMs: 60_000 })).status).toBe(
        'acquired',
      );
      // … and doctor says what it could not probe, and why.
      const report = await store.doctor();
      expect(report.checks.filter((c) => c.status === 'fail')).toEqual([]);
      expect(report.ok).toBe(true);
      const warned = report.checks.filter((c) => c.status === 'warn' && /lacks CREATE on schema/.test(c.detail));
      expect(warned.map((c) => c.id)).toEqual(expect.arrayContaining(['guarantee.transactional-ddl']));
      for (const c of warned)
        expect(c.detail).toMatch(/not probed: this role lacks CREATE on schema \S+, which only the probe needs/);
      const cli = await runCli(['doctor', '--db', limited.toString()]);
      expect(cli.code, cli.out).toBe(0);
      expect(cli.out).toMatch(/lacks CREATE on schema/);
    } finally {
      await admin.query(`drop owned by ${role}`);
      await admin.query(`drop role ${role}`);
      await admin.end();
    }
  });
});
