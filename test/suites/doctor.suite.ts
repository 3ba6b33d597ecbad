import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from 'kysely';
import { LATEST_VERSION, runDoctor, type DoctorReport, type Store } from '../../src/index.js';
import { formatVersion } from '../../src/errors.js';
import { runDoctorCommand } from '../../src/doctor/cli.js';
import type { DialectFixture } from '../support/fixtures.js';
import { doctorTarget, withoutWriteLock } from '../support/doctor-target.js';
import { tbl } from '../support/schema.js';

const failing = (report: DoctorReport) => report.checks.filter((c) => c.status === 'fail').map((c) => c.id);
const byId = (report: DoctorReport, id: string) => {
  const found = report.checks.find((c) => c.id === id);
  if (!found) throw new Error(`no check ${id} in ${report.checks.map((c) => c.id).join(', ')}`);
  return found;
};

const GUARANTEES = {
  postgres: [
    'guarantee.advisory-lock',
    'guarantee.read-committed',
    'guarantee.transactional-ddl',
    'guarantee.bytewise-collation',
    'guarantee.one-running-run',
  ],
  sqlite: [
    'guarantee.wal',
    'guarantee.busy-timeout',
    'guarantee.foreign-keys',
    'guarantee.durability',
    'guarantee.begin-immediate',
    'guarantee.one-running-run',
  ],
};

export function defineDoctorSuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  beforeAll(() => {
    fx = makeFixture();
  });
  afterAll(() => fx.cleanup());

  describe('doctor', () => {
    it('passes every check on a freshly migrated database, and leaves nothing behind', async () => {
      const store = await fx.freshStore();
      const before = await store.describeSchema();
      const report = await store.doctor();
      expect(failing(report)).toEqual([]);
      expect(report.ok).toBe(true);
      expect(report.schemaVersion).toBe(LATEST_VERSION);
      for (const id of ['drift.history', 'drift.schema', ...GUARANTEES[fx.kind], 'environment.server-version']) {
        expect(byId(report, id), id).toMatchObject({ status: 'pass' });
      }
      for (const c of report.checks) expect(['drift', 'guarantee', 'environment']).toContain(c.area);
      // The probes rolled back or dropped what they made: no scratch table, no probe run.
      expect(await store.describeSchema()).toEqual(before);
      expect(await store.db.selectFrom('coordinator_runs').select('id').execute()).toEqual([]);
      // And the store still writes (no lock left held).
      await store.org.createCompany({ id: 'c1', name: 'after doctor' });
    });

    it("names a dropped index and an extra column as drift and fails; a table that is not taskfence's only warns", async () => {
      const store = await fx.freshStore();
      await sql`drop index ${tbl(store.db, 'path_leases_task_idx')}`.execute(store.db);
      await sql`alter table ${tbl(store.db, 'tasks')} add column hand_added text`.execute(store.db);
      await sql`create table ${tbl(store.db, 'host_app_settings')} (k text primary key)`.execute(store.db);
      const report = await store.doctor();
      expect(report.ok).toBe(false);
      expect(failing(report)).toEqual(['drift.schema']);
      const drift = byId(report, 'drift.schema');
      expect(drift.detail).toBe(`2 differences from the schema of version ${formatVersion(LATEST_VERSION)}`);
      expect(drift.items).toEqual([
        'missing index path_leases_task_idx on path_leases (task_id)',
        'extra column tasks.hand_added',
        "extra table host_app_settings: not taskfence's (ignored)",
      ]);
    });

    it('names a missing table and a changed column', async () => {
      const store = await fx.freshStore();
      await sql`drop table ${tbl(store.db, 'path_leases')}`.execute(store.db);
      await sql`alter table ${tbl(store.db, 'tasks')} drop column writes`.execute(store.db);
      await sql`alter table ${tbl(store.db, 'tasks')} add column writes integer`.execute(store.db);
      const drift = byId(await store.doctor(), 'drift.schema');
      expect(drift.status).toBe('fail');
      expect(drift.items).toEqual(['missing table path_leases', 'changed column tasks.writes: type text → integer']);
    });

    it('names a stored function dropped by hand as drift (PostgreSQL; SQLite has none to drop)', async () => {
      const store = await fx.freshStore();
      if (fx.kind === 'sqlite') {
        expect(failing(await store.doctor())).toEqual([]);
        return;
      }
      await sql`drop function ${tbl(store.db, 'taskfence_complete_dispatch_v2')}`.execute(store.db);
      const report = await store.doctor();
      expect(failing(report)).toEqual(['drift.schema']);
      // Mutant "doctor-ignores-functions" (no function check) passes this database.
      expect(byId(report, 'drift.schema').items).toEqual([
        'missing function taskfence_complete_dispatch_v2 (installed by 0102 complete_and_next)',
      ]);
    });

    it('fails the guard check when the one-running-run index is gone (drift names it too)', async () => {
      const store = await fx.freshStore();
      await sql`drop index ${tbl(store.db, 'coordinator_runs_one_running_per_target')}`.execute(store.db);
      const report = await store.doctor();
      expect(failing(report)).toEqual(['drift.schema', 'guarantee.one-running-run']);
      expect(byId(report, 'drift.schema').items?.[0]).toMatch(
        /^missing index coordinator_runs_one_running_per_target on coordinator_runs unique \(coalesce/,
      );
    });

    it('catches a write lock that does not exclude a second connection (a no-op advisory lock; a deferred BEGIN)', async () => {
      const store = await fx.freshStore();
      const report = await runDoctor(doctorTarget(store, withoutWriteLock(store)));
      const id = fx.kind === 'postgres' ? 'guarantee.advisory-lock' : 'guarantee.begin-immediate';
      expect(failing(report)).toEqual([id]);
      expect(report.ok).toBe(false);
      expect(byId(report, id).detail).toMatch(
        fx.kind === 'postgres' ? /took no advisory lock/ : /second connection took the write lock/,
      );
    });

    it('compares against the recorded version, and warns about pending migrations', async () => {
      const store = await fx.freshStore({ to: 8 });
      const report = await store.doctor();
      expect(report.ok).toBe(true);
      expect(report.schemaVersion).toBe(8);
      expect(byId(report, 'drift.schema')).toMatchObject({
        status: 'pass',
        detail: expect.stringContaining('version 0008'),
      });
      const history = byId(report, 'drift.history');
      expect(history.status).toBe('warn');
      expect(history.items).toContain('pending migration 0055 path_leases');
    });

    it('warns, and fails nothing, on a database nothing was migrated on (or everything was reverted on)', async () => {
      for (const store of [await fx.open(await fx.freshUrl()), await fx.freshStore({ to: 0 })]) {
        const report = await store.doctor();
        expect(failing(report)).toEqual([]);
        expect(report.schemaVersion).toBe(0);
        expect(byId(report, 'drift.history')).toMatchObject({
          status: 'warn',
          detail: expect.stringMatching(/^no migration applied yet/),
        });
        expect(byId(report, 'drift.schema').status).toBe('pass');
        expect(byId(report, 'guarantee.one-running-run')).toMatchObject({
          status: 'warn',
          detail: expect.stringMatching(/^not probed/),
        });
      }
    });

    it('fails drift when the history holds a migration this code does not know', async () => {
      const store = await fx.freshStore();
      await store.db
        .insertInto('taskfence_migrations')
        .values({ version: 9999, name: 'from_the_future', checksum: 'x', applied_at: 0, duration_ms: 0 })
        .execute();
      const report = await store.doctor();
      expect(failing(report)).toEqual(['drift.history', 'drift.schema']);
      expect(byId(report, 'drift.history').items).toEqual(['unknown migration 9999 from_the_future']);
    });
  });

  describe('in a PostgreSQL schema of its own', () => {
    it('examines the configured schema, not current_schema(), migrated or not, and leaves nothing behind; SQLite refuses a schema', async () => {
      if (fx.kind === 'sqlite') {
        const lines: string[] = [];
        const db = await fx.freshUrl();
        expect(await runDoctorCommand({ db, json: false, schema: 'tf_doctor' }, (l) => lines.push(l))).toBe(1);
        expect(lines.join('\n')).toMatch(/schemas are a PostgreSQL option/);
        return;
      }
      // A database without a public schema: current_schema() is null there, so anything that
      // falls back to it instead of the configured schema fails.
      const bare = new URL(await fx.freshUrl());
      bare.searchParams.delete('schema');
      const admin = await fx.open(bare.toString());
      await sql`drop schema public cascade`.execute(admin.db);
      const schemas = async () =>
        (await sql<{ n: string }>`select nspname as n from pg_namespace order by nspname`.execute(admin.db)).rows.map(
          (r) => r.n,
        );
      const inSchema = new URL(bare);
      inSchema.searchParams.set('schema', 'tf_doctor');
      const store = await fx.open(inSchema.toString());
      // Nothing migrated yet, and tf_doctor does not exist: the probes that need a scratch table there say so.
      const fresh = await store.doctor();
      expect(failing(fresh)).toEqual([]);
      for (const id of ['guarantee.read-committed', 'guarantee.transactional-ddl']) {
        expect(byId(fresh, id), id).toMatchObject({
          status: 'warn',
          detail: 'not probed: the schema tf_doctor does not exist yet (migrate creates it)',
        });
      }
      await store.migrate();
      const before = await schemas();
      const tables = await store.describeSchema();
      for (const referenceSource of ['sqlite', 'database'] as const) {
        const report = await store.doctor({ referenceSource });
        expect(failing(report), referenceSource).toEqual([]);
        expect(byId(report, 'drift.schema').status, referenceSource).toBe('pass');
      }
      // Nothing left behind: no scratch schema, no probe table.
      expect(await schemas()).toEqual(before);
      expect(await store.describeSchema()).toEqual(tables);
      await sql`drop index tf_doctor.path_leases_task_idx`.execute(admin.db);
      for (const referenceSource of ['sqlite', 'database'] as const) {
        expect(byId(await store.doctor({ referenceSource }), 'drift.schema').items, referenceSource).toEqual([
          'missing index path_leases_task_idx on path_leases (task_id)',
        ]);
      }
      // taskfence doctor --schema examines the same schema.
      const lines: string[] = [];
      const code = await runDoctorCommand({ db: bare.toString(), json: true, schema: 'tf_doctor' }, (l) =>
        lines.push(l),
      );
      expect(code).toBe(1);
      const report = JSON.parse(lines.join('\n')) as DoctorReport;
      expect(failing(report)).toEqual(['drift.schema']);
    });
  });

  describe('runDoctorCommand (taskfence doctor)', () => {
    const run = async (db: string, json: boolean) => {
      const lines: string[] = [];
      const code = await runDoctorCommand({ db, json }, (line) => lines.push(line));
      return { code, text: lines.join('\n') };
    };

    it('exits 0 with a table when every check passes', async () => {
      const store: Store = await fx.freshStore();
      const { code, text } = await run(store.location.url, false);
      expect(code).toBe(0);
      expect(text).toMatch(
        new RegExp(`^ok +drift\\.schema +the schema matches version ${formatVersion(LATEST_VERSION)} `, 'm'),
      );
      expect(text).toMatch(/^OK: \d+ passed, 0 warnings, 0 failed$/m);
    });

    it('exits 1 and prints the JSON report when drift is found', async () => {
      const store = await fx.freshStore();
      await sql`drop index ${tbl(store.db, 'path_leases_task_idx')}`.execute(store.db);
      const { code, text } = await run(store.location.url, true);
      expect(code).toBe(1);
      const report = JSON.parse(text) as DoctorReport;
      expect(report).toMatchObject({ ok: false, dialect: fx.kind, schemaVersion: LATEST_VERSION });
      expect(report.checks.find((c) => c.id === 'drift.schema')).toMatchObject({
        area: 'drift',
        status: 'fail',
        items: ['missing index path_leases_task_idx on path_leases (task_id)'],
      });
    });

    it('exits 1 with one line when the database cannot be opened', async () => {
      const url =
        fx.kind === 'postgres' ? 'postgres://postgres@127.0.0.1:1/nowhere' : 'sqlite:/nonexistent-dir/deeper/x.db';
      const { code, text } = await run(url, false);
      expect(code).toBe(1);
      expect(text).toMatch(/^taskfence doctor: could not examine the database: /);
      const json = await run(url, true);
      expect(json.code).toBe(1);
      expect(JSON.parse(json.text)).toMatchObject({ ok: false, error: { code: 'DATABASE_UNAVAILABLE' } });
    });
  });
}
