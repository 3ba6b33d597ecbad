import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createServer, type Server, type Socket } from 'node:net';
import { sql } from 'kysely';
import pg from 'pg';
import { LATEST_VERSION, MIGRATIONS, type Store } from '../../src/index.js';
import { defineCliSuite, expectOneLine, insertManyTasks, runCli } from '../suites/cli.suite.js';
import { postgresFixture } from '../support/dialects.js';
import type { DialectFixture } from '../support/fixtures.js';
import { tbl } from '../support/schema.js';

defineCliSuite(postgresFixture);

const VERSIONS = MIGRATIONS.map((m) => m.version);

async function historyVersions(store: Store): Promise<number[]> {
  const rows = await store.db.selectFrom('taskfence_migrations').select('version').orderBy('version').execute();
  return rows.map((r) => Number(r.version));
}

describe('CLI faults on PostgreSQL', () => {
  let fx: DialectFixture;
  beforeAll(() => {
    fx = postgresFixture();
  });
  afterAll(() => fx.cleanup());

  it('against a host that accepts TCP and never answers, every command exits 1 with one line within about 15 s', async () => {
    const sockets: Socket[] = [];
    const server: Server = createServer((socket) => {
      sockets.push(socket); // accept, read, never answer
      socket.on('error', () => {});
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const port = (server.address() as { port: number }).port;
    try {
      const started = Date.now();
      const results = await Promise.all(
        ['status', 'migrate', 'plan'].map((c) => runCli([c, '--db', `postgres://postgres@127.0.0.1:${port}/silent`])),
      );
      const elapsed = Date.now() - started;
      for (const result of results) {
        expect(result.code).toBe(1);
        expectOneLine(result);
        expect(result.err).toMatch(/Cannot reach the database at postgres:\/\/postgres@127\.0\.0\.1:\d+\/silent/);
      }
      // Bounded, not hung: each command gives up after its 10 s connect timeout. The bound is loose
      // on purpose (three CLI processes on a loaded 2-core CI machine took 23 s); a command that
      // waited forever would still fail it, and the figure is not a speed claim.
      expect(elapsed).toBeLessThan(90_000);
    } finally {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });

  it('a migrator whose own backend is terminated mid-backfill prints one line and exits 1; a re-run completes with each version once', async () => {
    const url = await fx.freshUrl();
    const store = await fx.open(url);
    await store.migrate({ to: 8 });
    await insertManyTasks(store, 300_000);
    const database = new URL(url).pathname.slice(1);
    let stop = false;
    let terminated = 0;
    // Once 0052 runs, terminate every taskfence backend of this database until the CLI gives up
    // (its retries on fresh connections end after --lock-wait). The killer is a plain client with
    // an application name of its own, and finds and terminates in one statement, which never
    // names its own backend: through a transaction-mode pooler, a second statement could run on
    // the very server connection the first one listed.
    const killerClient = new pg.Client({ connectionString: url, application_name: 'taskfence-test-killer' });
    killerClient.on('error', () => {});
    await killerClient.connect();
    const killer = (async () => {
      const ours = `datname = $1 and application_name = 'taskfence' and pid <> pg_backend_pid()`;
      while (!stop) {
        const { rows } = await killerClient.query<{ n: number }>(
          terminated > 0
            ? `select count(*) filter (where pg_terminate_backend(pid))::int as n from pg_stat_activity where ${ours}`
            : `select count(*) filter (where pg_terminate_backend(pid))::int as n from pg_stat_activity
               where ${ours} and exists (select 1 from pg_stat_activity where ${ours} and query ~ 'requires_filesystem')`,
          [database],
        );
        terminated += rows[0]!.n;
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    })();
    let result;
    try {
      // A pause between 0052's batches keeps its backfill running for seconds, so a killer slowed by
      // a loaded machine still finds it there rather than several migrations later.
      result = await runCli(['migrate', '--db', url, '--lock-wait', '3000', '--pause-ms', '1000']);
    } finally {
      stop = true;
      await killer.finally(() => killerClient.end());
    }
    expect(terminated).toBeGreaterThan(0);
    expect(result.code, result.out + result.err).toBe(1);
    expectOneLine(result);
    expect(result.err).toMatch(/Cannot reach the database|terminat/i);
    // Each transaction the migrator runs (a migration's DDL, a backfill batch) is retried on a
    // fresh connection until --lock-wait runs out, and a short one can slip between two kills, so
    // where the run stops is not fixed: killed in 0052's DDL step (nothing of 0052 recorded), in one
    // of its backfill batches, which run after the DDL committed (0052 recorded, backfill
    // 'running', resumed by the re-run), or in a later migration once a retry got through (0052
    // complete, a later prefix recorded; one CI run stopped after 0053). Either way the history is
    // a prefix of the chain, each version once, and only the last recorded migration may be
    // unfinished.
    const history = await historyVersions(store);
    expect(history).toEqual(VERSIONS.slice(0, history.length));
    expect(history.length).toBeGreaterThanOrEqual(VERSIONS.indexOf(8) + 1);
    if (history.includes(52)) {
      const { rows } = await sql<{
        backfill: string | null;
      }>`select backfill from ${tbl(store.db, 'taskfence_migration_state')} where version = 52`.execute(store.db);
      expect(history.at(-1) === 52 ? ['running', 'complete'] : ['complete']).toContain(rows[0]?.backfill);
    }
    const rerun = await runCli(['migrate', '--db', url]);
    expect(rerun.code, rerun.err).toBe(0);
    expect(await historyVersions(store)).toEqual(VERSIONS);
  });

  it('--ddl-lock-timeout bounds how long migration DDL waits for a table an application transaction uses; the refusal changes nothing', async () => {
    const url = await fx.freshUrl();
    const app = await fx.open(url);
    await app.migrate({ to: 8 });
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let reading!: () => void;
    const isReading = new Promise<void>((resolve) => (reading = resolve));
    const transaction = app.dialect.writeTransaction(async (trx) => {
      await sql`select count(*) from ${tbl(trx, 'tasks')}`.execute(trx); // holds ACCESS SHARE on tasks until it ends
      reading();
      await held;
    });
    await isReading;
    // The reader ends after 30 s by itself, so a migrator that waits without any lock_timeout
    // gets the lock then and succeeds (caught by the exit code); one that used the default 10 s
    // instead of --ddl-lock-timeout fails naming 10000 ms (caught by the message). Not sooner:
    // on a loaded machine, through a pooler, 0009–0051 alone took over 5 s before 0052's DDL
    // first met the reader, and an earlier release let that migrate succeed.
    const ends = setTimeout(() => release(), 30_000);
    try {
      const result = await runCli(['migrate', '--db', url, '--ddl-lock-timeout', '500']);
      expect(result.code).toBe(1);
      expectOneLine(result);
      expect(result.err).toMatch(
        /Migration 0052 requires_filesystem failed \(up\): its DDL waited longer than ddlLockTimeoutMs \(500 ms, --ddl-lock-timeout\)/,
      );
      expect(await historyVersions(app)).toEqual(VERSIONS.filter((v) => v <= 8));
    } finally {
      clearTimeout(ends);
      release();
      await transaction;
    }
    expect((await runCli(['migrate', '--db', url])).code).toBe(0);
  });

  it('while waiting for the migration lock, prints who holds it (pid, application, since) every few seconds, then times out with one line', async () => {
    const url = await fx.freshUrl();
    const holder = await fx.open(url);
    await holder.migrate({ to: 8 });
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let locked!: (pid: number) => void;
    const isLocked = new Promise<number>((resolve) => (locked = resolve));
    const holding = holder.dialect.withMigrationLock(
      async (trx) => {
        const { rows } = await sql<{ pid: number }>`select pg_backend_pid() as pid`.execute(trx);
        locked(rows[0]!.pid);
        await held;
      },
      { waitMs: 10_000 },
    );
    const pid = await isLocked;
    try {
      const result = await runCli(['migrate', '--db', url, '--lock-wait', '7000']);
      expect(result.code).toBe(1);
      expectOneLine(result);
      expect(result.err).toMatch(/held the migration lock for more than 7000 ms/);
      const waiting = result.out.split('\n').filter((l) => l.startsWith('waiting'));
      expect(waiting.length).toBeGreaterThanOrEqual(2);
      expect(waiting[0]).toMatch(
        new RegExp(
          `^waiting \\d+ s for the migration lock, held by pid ${pid} \\(application "taskfence".*, since \\d{4}-`,
        ),
      );
    } finally {
      release();
      await holding;
    }
    expect((await holder.migrate()).toVersion).toBe(LATEST_VERSION);
  });
});
