/**
 * A least-privilege application role, with the README's grants (USAGE on the schema, SELECT,
 * INSERT, UPDATE, DELETE on taskfence's tables, USAGE on its sequences) and nothing else: every
 * area works, `doctor`'s probes the role may not run warn and name the privilege, the report
 * passes and the CLI exits 0. Without the sequence grant, a create is PERMISSION_DENIED naming it.
 */
import { afterAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import { PermissionDeniedError } from '../../src/index.js';
import { runCleanupDemo } from '../../examples/cleanup-worker/main.js';
import { runOrchestratorDemo } from '../../examples/orchestrator/main.js';
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

/** The README's grants to a fresh login role on the migrated database at `url`; `sequences: false` leaves out USAGE on the sequences. */
async function applicationRole(url: string, options: { sequences: boolean }) {
  const role = `tf_app_${Math.random().toString(36).slice(2, 8)}`;
  const admin = new pg.Client({ connectionString: url.replace(/\?.*$/, '') });
  await admin.connect();
  const schema = new URL(url).searchParams.get('schema') ?? 'public';
  await admin.query(`create role ${role} login`);
  await admin.query(`revoke create on schema public from public`);
  await admin.query(`grant usage on schema ${schema} to ${role}`);
  await admin.query(`grant select, insert, update, delete on all tables in schema ${schema} to ${role}`);
  if (options.sequences) await admin.query(`grant usage on all sequences in schema ${schema} to ${role}`);
  const limited = new URL(url);
  limited.username = role;
  return {
    url: limited.toString(),
    grantSequences: () => admin.query(`grant usage on all sequences in schema ${schema} to ${role}`),
    drop: async () => {
      await admin.query(`drop owned by ${role}`);
      await admin.query(`drop role ${role}`);
      await admin.end();
    },
  };
}

describe('the runtime under the documented grants', () => {
  it('without USAGE on the sequences a create is PERMISSION_DENIED naming the sequence; with it every create works', async () => {
    const url = await fx.freshUrl();
    await (await fx.open(url)).migrate();
    const role = await applicationRole(url, { sequences: false });
    try {
      const store = await fx.open(role.url);
      const companyId = (await store.org.createCompany({ name: 'acme' })).id;
      const error = await store.tasks
        .createTask({ companyId, targetKey: 't', title: 'needs nextval', requiresFilesystem: false })
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(PermissionDeniedError);
      expect(error).toMatchObject({
        code: 'PERMISSION_DENIED',
        privilege: 'USAGE',
        object: expect.stringMatching(/^sequence tasks_seq_seq$/),
        retrySafe: true,
      });
      expect((error as Error).message).toMatch(/GRANT USAGE ON SEQUENCE tasks_seq_seq TO <the role>/);
      await role.grantSequences();
      expect(
        await store.tasks.createTask({ companyId, targetKey: 't', title: 'now it works', requiresFilesystem: false }),
      ).toMatchObject({
        title: 'now it works',
      });
    } finally {
      await role.drop();
    }
  });

  it('every area: the orchestrator and cleanup examples, locks, paths, semaphores, gates, prune, status --check', async () => {
    const roles: Awaited<ReturnType<typeof applicationRole>>[] = [];
    try {
      for (const demo of ['orchestrator', 'cleanup'] as const) {
        const url = await fx.freshUrl();
        await (await fx.open(url)).migrate();
        const role = await applicationRole(url, { sequences: true });
        roles.push(role);
        if (demo === 'orchestrator') {
          const report = await runOrchestratorDemo({ url: role.url, log: () => {} });
          expect(report.run.status).toBe('completed');
        } else {
          await runCleanupDemo({ url: role.url, log: () => {} });
        }
      }
      const store = await fx.open(roles[0]!.url);
      const company = (await store.org.createCompany({ name: 'more' })).id;
      const workspaceId = (await store.org.createWorkspace({ companyId: company, name: 'repo' })).id;
      const claim = await store.locks.claimWorkspaceLock(workspaceId, { holder: 'h', runId: 'r', ttlMs: 60_000 });
      expect(claim.status).toBe('acquired');
      if (claim.status === 'acquired') await store.locks.releaseWorkspaceLock(workspaceId, claim.lease);
      const paths = await store.paths.tryAcquirePaths({ workspaceId, holder: 'p', paths: ['src'], ttlMs: 60_000 });
      expect(paths.status).toBe('acquired');
      const slot = await store.semaphores.acquire('builds', { holder: 's', limit: 1, ttlMs: 60_000 });
      expect(slot.status).toBe('acquired');
      const task = await store.tasks.createTask({
        companyId: company,
        targetKey: 'g',
        title: 'gated',
        requiresFilesystem: false,
      });
      const gate = await store.gates.openGate({ question: 'ship?', taskId: task.id });
      await store.gates.resolveGate(gate.id, 'yes');
      await store.maintenance.prune({ olderThanMs: 30 * 86_400_000 });
      const status = await runCli(['status', '--check', '--db', roles[0]!.url]);
      expect(status.code, status.out + status.err).toBe(0);
    } finally {
      for (const role of roles) await role.drop();
    }
  }, 300_000);
});
