import { afterAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import {
  Kysely,
  PostgresAdapter,
  PostgresIntrospector,
  PostgresQueryCompiler,
  sql,
  type DatabaseConnection,
  type Driver,
} from 'kysely';
import { runDoctor, type Database, type DoctorReport } from '../../src/index.js';
import { runDoctorCommand } from '../../src/doctor/cli.js';
import { defineDoctorSuite } from '../suites/doctor.suite.js';
import { postgresFixture } from '../support/dialects.js';
import { dialectWith, doctorTarget } from '../support/doctor-target.js';
import { qualifiedName, tbl } from '../support/schema.js';

defineDoctorSuite(postgresFixture);

const failing = (report: DoctorReport) => report.checks.filter((c) => c.status === 'fail').map((c) => c.id);
const find = (report: DoctorReport, id: string) => report.checks.find((c) => c.id === id);

/**
 * A Kysely whose statements go round-robin over two server sessions, one per statement, as a
 * transaction-mode pooler hands out whichever server connection is free: session state set by
 * one statement is gone by the next.
 */
function transactionPooledKysely(clients: pg.Client[]): Kysely<Database> {
  let next = 0;
  const connection: DatabaseConnection = {
    async executeQuery(query) {
      const client = clients[next++ % clients.length]!;
      const result = await client.query(query.sql, [...query.parameters]);
      return { rows: result.rows };
    },
    async *streamQuery() {},
  };
  const driver: Driver = {
    async init() {},
    async acquireConnection() {
      return connection;
    },
    async beginTransaction() {},
    async commitTransaction() {},
    async rollbackTransaction() {},
    async releaseConnection() {},
    async destroy() {},
  };
  return new Kysely<Database>({
    dialect: {
      createAdapter: () => new PostgresAdapter(),
      createDriver: () => driver,
      createIntrospector: (db) => new PostgresIntrospector(db),
      createQueryCompiler: () => new PostgresQueryCompiler(),
    },
  });
}

describe('doctor on PostgreSQL sessions', () => {
  const fx = postgresFixture();
  afterAll(() => fx.cleanup());

  it('reports a REPEATABLE READ database default as a warning naming withTransaction, exit 0', async () => {
    const seed = await fx.freshStore();
    const name = new URL(seed.location.url).pathname.slice(1);
    await sql`alter database ${sql.id(name)} set default_transaction_isolation = 'repeatable read'`.execute(seed.db);
    // New sessions pick the setting up; taskfence's own transactions still state READ COMMITTED.
    const store = await fx.open(seed.location.url);
    const report = await store.doctor();
    expect(failing(report)).toEqual([]);
    expect(report.ok).toBe(true);
    expect(find(report, 'guarantee.read-committed')).toMatchObject({
      status: 'warn',
      detail: expect.stringMatching(
        /default_transaction_isolation is 'repeatable read'.*store\.withTransaction runs at the host's level/,
      ),
    });
    const lines: string[] = [];
    expect(await runDoctorCommand({ db: seed.location.url, json: false }, (l) => lines.push(l))).toBe(0);
    expect(lines.join('\n')).toMatch(/^WARN +guarantee\.read-committed /m);
  });

  it('catches snapshot isolation: write transactions that run at REPEATABLE READ fail the probe', async () => {
    const store = await fx.freshStore();
    const real = store.dialect;
    const snapshot = dialectWith(real, {
      writeTransaction: (fn) => real.db.transaction().setIsolationLevel('repeatable read').execute(fn),
    });
    const report = await runDoctor(doctorTarget(store, snapshot));
    expect(failing(report)).toEqual(['guarantee.read-committed']);
    expect(find(report, 'guarantee.read-committed')?.detail).toMatch(
      /write transactions run at REPEATABLE READ, not READ COMMITTED; a statement did not see a row/,
    );
  });

  it('catches a write-transaction lock that outlives its transaction (a session advisory lock)', async () => {
    const store = await fx.freshStore();
    const sessionLock = dialectWith(store.dialect, {
      lockKey: async (trx, key) => {
        await sql`select pg_advisory_lock(hashtextextended(${key}, 0))`.execute(trx);
      },
    });
    const report = await runDoctor(doctorTarget(store, sessionLock));
    expect(failing(report)).toEqual(['guarantee.advisory-lock']);
    expect(find(report, 'guarantee.advisory-lock')?.detail).toMatch(/still held after its transaction ended/);
  });

  it('reports a transaction-mode pooler (session state lost between statements) as a warning', async () => {
    const store = await fx.freshStore();
    const clients = [new pg.Client(store.location.url), new pg.Client(store.location.url)];
    for (const c of clients) await c.connect();
    const pooled = transactionPooledKysely(clients);
    try {
      const report = await runDoctor(doctorTarget(store, dialectWith(store.dialect, { db: pooled })));
      const pooler = find(report, 'environment.pooler');
      expect(pooler?.status).toBe('warn');
      expect(pooler?.detail).toMatch(/^a transaction-mode pooler sits in the path \(.*session setting was gone/);
    } finally {
      await pooled.destroy();
      for (const c of clients) await c.end();
    }
  });

  it('warns instead of hanging when the pool has a single connection (no second session to probe with)', async () => {
    const seed = await fx.freshStore();
    const store = await fx.open(seed.location.url, { poolSize: 1 });
    const report = await store.doctor({ connectionWaitMs: 300 });
    expect(report.ok).toBe(true);
    for (const id of ['guarantee.advisory-lock', 'guarantee.read-committed']) {
      expect(find(report, id), id).toMatchObject({
        status: 'warn',
        detail: expect.stringMatching(/^not probed: no second connection/),
      });
    }
    // The abandoned request got its connection later and released it: the store still works.
    await store.org.createCompany({ id: 'c1', name: 'after doctor' });
    expect(await store.db.selectFrom('companies').select('id').execute()).toEqual([{ id: 'c1' }]);
  });

  it('names a changed and a missing foreign key', async () => {
    const store = await fx.freshStore();
    const fk = async (table: string) =>
      (
        await sql<{
          conname: string;
        }>`select conname from pg_constraint where conrelid = ${qualifiedName(store.db, table)}::regclass and contype = 'f'`.execute(
          store.db,
        )
      ).rows.map((r) => r.conname);
    const [leaseFk] = await fk('path_leases');
    await sql`alter table ${tbl(store.db, 'path_leases')} drop constraint ${sql.id(leaseFk!)}`.execute(store.db);
    await sql`alter table ${tbl(store.db, 'path_leases')} add foreign key (workspace_id) references ${tbl(store.db, 'workspaces')} (id) on delete restrict`.execute(
      store.db,
    );
    for (const name of await fk('task_leases'))
      await sql`alter table ${tbl(store.db, 'task_leases')} drop constraint ${sql.id(name)}`.execute(store.db);
    const drift = find(await store.doctor(), 'drift.schema');
    expect(drift?.status).toBe('fail');
    expect(drift?.items).toEqual([
      'changed foreign key path_leases(workspace_id) → workspaces: (id) on delete cascade → (id) on delete restrict',
      'missing foreign key task_leases(task_id) → tasks(id) on delete cascade',
    ]);
  });

  it('builds the reference in a rolled-back scratch schema on the live database when asked (PostgreSQL-only installs do by themselves)', async () => {
    const schemas = async (db: Kysely<Database>) =>
      (await sql<{ n: string }>`select nspname as n from pg_namespace order by nspname`.execute(db)).rows.map(
        (r) => r.n,
      );
    const store = await fx.freshStore();
    const before = await schemas(store.db);
    const clean = await store.doctor({ referenceSource: 'database' });
    expect(failing(clean)).toEqual([]);
    expect(find(clean, 'drift.schema')?.status).toBe('pass');
    expect(await schemas(store.db)).toEqual(before);

    await sql`drop index ${tbl(store.db, 'path_leases_task_idx')}`.execute(store.db);
    await sql`create table ${tbl(store.db, 'path_leases_copy')} (x integer)`.execute(store.db);
    const drifted = find(await store.doctor({ referenceSource: 'database' }), 'drift.schema');
    expect(drifted?.items).toEqual([
      'missing index path_leases_task_idx on path_leases (task_id)',
      "extra table path_leases_copy: not taskfence's (ignored)",
    ]);

    const older = await fx.freshStore({ to: 53 });
    await sql`alter table ${tbl(older.db, 'task_environments')} drop column root_path`.execute(older.db);
    const atOlder = find(await older.doctor({ referenceSource: 'database' }), 'drift.schema');
    expect(atOlder).toMatchObject({ status: 'fail', items: ['missing column task_environments.root_path'] });
  });

  it('warns about a probe table a crashed doctor left behind, without failing', async () => {
    const store = await fx.freshStore();
    await sql`create table ${tbl(store.db, 'taskfence_doctor_0badc0ffee00')} (x integer)`.execute(store.db);
    const report = await store.doctor();
    expect(report.ok).toBe(true);
    expect(find(report, 'drift.schema')).toMatchObject({
      status: 'warn',
      items: ["extra table taskfence_doctor_0badc0ffee00: a doctor probe's leftover, safe to drop"],
    });
  });
});
