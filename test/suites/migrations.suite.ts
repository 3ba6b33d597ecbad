import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql, type CompiledQuery } from 'kysely';
import { inlineParameters } from '../../src/migrator/recording-driver.js';
import {
  BaselineMismatchError,
  BaselineRequiredError,
  DataLossError,
  LATEST_VERSION,
  MIGRATIONS,
  MigrationChecksumMismatchError,
  MigrationLockTimeoutError,
  Migrator,
  UnknownMigrationsError,
  UnknownVersionError,
  type MigrationDefinition,
  type SchemaDescription,
  type Store,
} from '../../src/index.js';
import { main } from '../../src/cli.js';
import type { DialectFixture } from '../support/fixtures.js';
import { holdWriteLock } from '../support/hold-write-lock.js';
import { Contenders, ContenderExitedError, type Outcome } from '../support/race.js';
import { makeLegacyV5Database } from './legacy.js';
import { ops as OPS } from './migrations.ops.js';
import { quotedTablePattern, schemaOfUrl, tbl } from '../support/schema.js';
import { schemaOf } from '../../src/query/schema.js';

const VERSIONS = MIGRATIONS.map((m) => m.version);

/** Runs the CLI in-process and captures what it prints. */
async function cli(...argv: string[]) {
  const out: string[] = [];
  const err: string[] = [];
  const code = await main(
    argv,
    (l) => out.push(l),
    (l) => err.push(l),
  );
  return { code, out: out.join('\n'), err: err.join('\n') };
}

async function historyVersions(store: Store): Promise<number[]> {
  const rows = await store.db.selectFrom('taskfence_migrations').select('version').orderBy('version').execute();
  return rows.map((r) => Number(r.version));
}

/** Describes the schema without the history and state tables (which exist at "version 0" too). */
async function describeTables(store: Store): Promise<SchemaDescription> {
  const {
    taskfence_migrations: _history,
    taskfence_migration_state: _state,
    taskfence_releases: _releases,
    taskfence_migration_steps: _steps,
    ...tables
  } = (await store.describeSchema()).tables;
  return { tables };
}

export function defineMigrationSuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  beforeAll(() => {
    fx = makeFixture();
  });
  afterAll(() => fx.cleanup());

  describe('the chain', () => {
    it('has increasing versions, each with up and down', () => {
      expect(VERSIONS).toEqual([...VERSIONS].sort((a, b) => a - b));
      for (const m of MIGRATIONS) {
        expect(typeof m.up, `${m.version} up`).toBe('function');
        expect(typeof m.down, `${m.version} down`).toBe('function');
      }
    });

    it('refuses a chain with a migration that has no down', async () => {
      const store = await fx.freshStore({ to: 0 });
      const noDown = { version: 9001, name: 'no_down', up: async () => {} } as unknown as MigrationDefinition;
      expect(() => new Migrator(store.dialect, [...MIGRATIONS, noDown])).toThrow(/must define both up and down/);
    });
  });

  describe('migrate', () => {
    it('migrates an empty database to the latest version and records each migration once with its checksum', async () => {
      const store = await fx.freshStore();
      const rows = await store.db.selectFrom('taskfence_migrations').selectAll().orderBy('version').execute();
      expect(rows.map((r) => Number(r.version))).toEqual(VERSIONS);
      for (const r of rows) {
        expect(r.checksum).toMatch(/^[0-9a-f]{64}$/);
        expect(Number(r.applied_at)).toBeGreaterThan(0);
        expect(Number(r.duration_ms)).toBeGreaterThanOrEqual(0);
      }
      const status = await store.migrationStatus();
      expect(status).toMatchObject({
        currentVersion: LATEST_VERSION,
        pending: [],
        modified: [],
        unknown: [],
        baselineRequired: false,
      });
      expect((await store.migrate()).applied).toEqual([]);
    });

    it('goes down and up to any version with --to, and up→down→up leaves the schema of a single up', async () => {
      const store = await fx.freshStore({ to: 0 });
      const snapshots = new Map<number, SchemaDescription>([[0, await describeTables(store)]]);
      for (const v of VERSIONS) {
        await store.migrate({ to: v });
        expect(await historyVersions(store)).toEqual(VERSIONS.filter((x) => x <= v));
        snapshots.set(v, await describeTables(store));
      }
      const descending = [0, ...VERSIONS].reverse();
      for (let i = 1; i < descending.length; i++) {
        await store.migrate({ to: descending[i]! });
        expect(await describeTables(store), `down to ${descending[i]}`).toEqual(snapshots.get(descending[i]!));
      }
      expect(await describeTables(store)).toEqual({ tables: {} });
      for (const v of VERSIONS) {
        await store.migrate({ to: v });
        expect(await describeTables(store), `up again to ${v}`).toEqual(snapshots.get(v));
      }
    });

    it('reads its status without waiting for, or failing on, a writer that holds the write lock', async () => {
      const writer = await fx.freshStore();
      const reader = await fx.open(writer.location.url, { busyTimeoutMs: 20 });
      const lock = await holdWriteLock(writer, (trx) =>
        trx.insertInto('companies').values({ id: 'held', name: 'held', created_at: 1 }).execute(),
      );
      try {
        // Resolves while the lock is still held: a read snapshot needs no write lock.
        const status = await reader.migrationStatus();
        expect(status).toMatchObject({ currentVersion: LATEST_VERSION, pending: [], baselineRequired: false });
      } finally {
        await lock.release();
      }
    });

    it('rejects a target version that is not in the chain', async () => {
      const store = await fx.freshStore({ to: 0 });
      await expect(store.migrate({ to: 7000 })).rejects.toBeInstanceOf(UnknownVersionError);
    });
  });

  describe('checksums', () => {
    it('refuses to run when an applied migration was edited, naming it', async () => {
      const store = await fx.freshStore({ to: 8 });
      const edited = MIGRATIONS.map((m) =>
        m.version !== 6
          ? m
          : {
              ...m,
              async up(ctx: Parameters<MigrationDefinition['up']>[0]) {
                await m.up(ctx);
                await ctx.db.schema.createIndex('sneaky_idx').on('tasks').column('title').execute();
              },
            },
      );
      const migrator = new Migrator(store.dialect, edited);
      const error = await migrator.migrate().catch((e: unknown) => e);
      expect(error).toBeInstanceOf(MigrationChecksumMismatchError);
      expect(error).toMatchObject({ version: 6, migrationName: 'coordinator_run_id' });
      expect((error as Error).message).toMatch(/0006 coordinator_run_id was edited after it was applied/);
      expect((await migrator.status()).modified.map((m) => m.version)).toEqual([6]);
      // Nothing was applied past the edited migration.
      expect(await historyVersions(store)).toEqual(VERSIONS.filter((v) => v <= 8));
    });

    it('is stable: the same code gives the same checksums', async () => {
      const a = await fx.freshStore();
      const b = await fx.freshStore();
      const sums = async (s: Store) =>
        await s.db.selectFrom('taskfence_migrations').select(['version', 'checksum']).orderBy('version').execute();
      expect(await sums(a)).toEqual(await sums(b));
    });

    it('refuses migrations in the database that the code does not know', async () => {
      const store = await fx.freshStore();
      await store.db
        .insertInto('taskfence_migrations')
        .values({ version: 9999, name: 'from_the_future', checksum: 'x', applied_at: 1, duration_ms: 0 })
        .execute();
      await expect(store.migrate()).rejects.toBeInstanceOf(UnknownMigrationsError);
      expect((await store.migrationStatus()).unknown).toEqual([{ version: 9999, name: 'from_the_future' }]);
    });
  });

  describe('baseline adoption', () => {
    it('refuses a database with taskfence tables but no history, and adopts the older app’s v5 database with --baseline 5', async () => {
      const url = await fx.freshUrl();
      const legacy = await fx.open(url);
      await makeLegacyV5Database(legacy);
      const refused = await legacy.migrate().catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(BaselineRequiredError);
      if (fx.kind === 'sqlite') expect((refused as Error).message).toMatch(/user_version = 5.*--baseline 5/);
      expect((await legacy.migrationStatus()).baselineRequired).toBe(true);

      await expect(legacy.migrate({ baseline: 8 })).rejects.toBeInstanceOf(BaselineMismatchError);
      expect((await legacy.migrate({ baseline: 5 })).toVersion).toBe(LATEST_VERSION);

      const fresh = await fx.freshStore();
      expect(await legacy.describeSchema()).toEqual(await fresh.describeSchema());
      const flags = await legacy.db.selectFrom('tasks').select(['id', 'requires_filesystem']).orderBy('id').execute();
      expect(flags).toEqual([
        { id: 't-cfo', requires_filesystem: 0 },
        { id: 't-eng', requires_filesystem: 1 },
      ]);
    });
  });

  describe('plan', () => {
    it('prints the exact SQL of the pending migrations for this dialect and applies nothing', async () => {
      const store = await fx.freshStore({ to: 8 });
      const steps = await store.plan();
      expect(steps.map((s) => [s.version, s.direction])).toEqual(VERSIONS.filter((v) => v > 8).map((v) => [v, 'up']));
      const all = steps.flatMap((s) => s.statements).join('\n');
      expect(all).toMatch(
        new RegExp(
          `alter table ${quotedTablePattern(schemaOf(store.db), 'tasks')} add column "requires_filesystem" integer default 0 not null`,
        ),
      );
      expect(all).toMatch(fx.kind === 'postgres' ? /"expires_at" bigint not null/ : /"expires_at" integer not null/);
      expect(await historyVersions(store)).toEqual(VERSIONS.filter((v) => v <= 8));
      const down = await store.plan({ to: 6 });
      expect(down.map((s) => [s.version, s.direction])).toEqual([
        [8, 'down'],
        [7, 'down'],
      ]);
    });
  });

  describe('plan is what migrate runs', () => {
    it('every statement plan shows is one migrate then sends, byte for byte (PostgreSQL: in a schema of its own, qualified with it)', async () => {
      const url = new URL(await fx.freshUrl());
      if (fx.kind === 'postgres') url.searchParams.set('schema', 'tf_plan');
      const sent: string[] = [];
      const store = await fx.open(url.toString(), {
        onQuery: (q) => sent.push(inlineParameters(fx.kind, { sql: q.sql, parameters: q.parameters } as CompiledQuery)),
      });
      await store.migrate({ to: 53 });
      const steps = await store.plan();
      expect(steps.map((s) => s.version)).toEqual(VERSIONS.filter((v) => v > 53));
      const planned = steps.flatMap((s) => s.statements);
      if (fx.kind === 'postgres') {
        expect(planned.join('\n')).toMatch(/^create table "tf_plan"\."cleanup_snapshots"/m);
        expect(planned.join('\n')).not.toMatch(/(table|on|references) "(?!tf_plan")[a-z_]+"\s/);
      }
      sent.length = 0;
      await store.migrate();
      for (const statement of planned) expect(sent, statement).toContain(statement);
    });
  });

  describe('concurrent deploys', () => {
    it('six processes migrating one database at once all succeed and each migration is applied once', async () => {
      for (let round = 0; round < 3; round++) {
        const url = await fx.freshUrl();
        const contenders = await Contenders.start(6, { url, ops: OPS });
        try {
          const outcomes = await contenders.race('migrate');
          for (const o of outcomes)
            expect(o, JSON.stringify(o)).toMatchObject({ ok: true, value: { toVersion: LATEST_VERSION } });
          const appliedEverywhere = outcomes.flatMap((o) => (o.ok ? o.value.applied : []));
          expect(appliedEverywhere.sort((a, b) => a - b)).toEqual(VERSIONS);
        } finally {
          await contenders.close();
        }
        const store = await fx.open(url);
        expect(await historyVersions(store)).toEqual(VERSIONS);
      }
      // Each contender may wait up to 300 s for the lock (migrations.ops.ts): a waiter that keeps
      // losing the polled lock to the others waits for the whole migration, which under CI load
      // took over 120 s once (MIGRATION_LOCK_TIMEOUT at the former 120 s).
    }, 1_000_000);
  });

  describe('crashes', () => {
    it('a migrator killed with SIGKILL mid-migration leaves the previous version intact, and a re-run completes', async () => {
      const url = await fx.freshUrl();
      const store = await fx.open(url);
      await store.migrate({ to: 8 });
      const before = await describeTables(store);
      const contenders = await Contenders.start(1, { url, ops: OPS });
      try {
        const running = contenders.start(0, 'migrateAndHangInside0052');
        await contenders.waitForSignal(0, 'inside-0052');
        await contenders.kill(0);
        await expect(running).rejects.toBeInstanceOf(ContenderExitedError);
      } finally {
        await contenders.close();
      }
      // PostgreSQL notices the dead backend and rolls back; SQLite's WAL never saw a commit.
      expect(await historyVersions(store)).toEqual(VERSIONS.filter((v) => v <= 8));
      expect(await describeTables(store)).toEqual(before);
      expect(await store.db.selectFrom('companies').select('id').where('id', '=', 'ghost').execute()).toEqual([]);
      const rerun = await store.migrate({ lockTimeoutMs: 60_000 });
      expect(rerun.applied).toEqual(VERSIONS.filter((v) => v > 8));
      expect(await historyVersions(store)).toEqual(VERSIONS);
    });
  });

  describe('data-loss guard', () => {
    it('a down step dropping rows throws DataLossError and changes nothing; allowDataLoss: true goes ahead', async () => {
      const store = await fx.freshStore();
      await sql`insert into ${tbl(store.db, 'companies')} (id, name, created_at) values ('c', 'c', 1)`.execute(
        store.db,
      );
      const schema = await store.describeSchema();
      const refused = await store.migrate({ to: 0 }).catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(DataLossError);
      expect((refused as DataLossError).losses).toEqual([
        { version: 5, name: 'baseline', table: 'companies', rows: 1 },
      ]);
      expect(await store.describeSchema()).toEqual(schema);
      expect(await historyVersions(store)).toEqual(VERSIONS);
      // Empty tables go without the flag; the one with rows needs it.
      expect((await store.migrate({ to: 5 })).reverted).toEqual(VERSIONS.filter((v) => v > 5).reverse());
      expect((await store.migrate({ to: 0, allowDataLoss: true })).reverted).toEqual([5]);
      expect(await describeTables(store)).toEqual({ tables: {} });
    });
  });

  describe('lost lock session', () => {
    it('a migrator that loses its connection mid-0052 while a second deploy waits: each version is recorded once and the schema is right', async () => {
      const url = await fx.freshUrl();
      const store = await fx.open(url);
      await store.migrate({ to: 8 });
      const contenders = await Contenders.start(2, { url, ops: OPS });
      let first: Outcome<{ applied: number[] }> | undefined;
      try {
        const firstRun = contenders.start(0, 'migrateSlowly0052');
        await contenders.waitForSignal(0, 'inside-0052');
        // The second deploy starts while the first holds the lock mid-0052; on PostgreSQL it
        // reports the holder while it waits.
        const second = contenders.start(1, 'migrateReportingWait');
        if (fx.kind === 'postgres') {
          await contenders.waitForSignal(1, 'waiting');
          const admin = await fx.open(url);
          const { rows } = await sql<{ pid: number }>`
            select pg_terminate_backend(l.pid) as terminated, l.pid from pg_locks l
            where l.locktype = 'advisory' and l.granted
              and l.database = (select oid from pg_database where datname = current_database())`.execute(admin.db);
          expect(rows).toHaveLength(1);
          first = await firstRun;
        } else {
          await contenders.kill(0);
          await expect(firstRun).rejects.toBeInstanceOf(ContenderExitedError);
        }
        const done = await second;
        expect(done, JSON.stringify(done)).toMatchObject({ ok: true, value: { toVersion: LATEST_VERSION } });
      } finally {
        await contenders.close();
      }
      // The first either completed (its retry found the versions applied, or applied them) or
      // failed with one typed line; never both deploys applying one version.
      if (first && !first.ok) {
        expect(first.error.code, JSON.stringify(first.error)).toBe('DATABASE_UNAVAILABLE');
        expect(first.error.message).not.toMatch(/\n/);
      }
      expect(await historyVersions(store)).toEqual(VERSIONS);
      const fresh = await fx.freshStore();
      expect(await store.describeSchema()).toEqual(await fresh.describeSchema());
    });
  });

  describe('CLI', () => {
    it('migrates, reports status as JSON and plans, with exit code 0', async () => {
      const url = await fx.freshUrl();
      const planned = await cli('plan', '--db', url, '--to', '0006');
      expect(planned.code).toBe(0);
      expect(planned.out).toMatch(
        new RegExp(`-- 0005 baseline \\(up\\)\ncreate table ${quotedTablePattern(schemaOfUrl(url), 'companies')}`),
      );
      expect(planned.out).toMatch(/-- 0006 coordinator_run_id \(up\)/);
      expect((await cli('migrate', '--db', url, '--to', '7')).code).toBe(0);
      const status = await cli('status', '--db', url, '--json');
      expect(status.code).toBe(0);
      const parsed = JSON.parse(status.out);
      expect(parsed.applied.map((a: { version: number }) => a.version)).toEqual([5, 6, 7]);
      expect(parsed.pending.map((p: { version: number }) => p.version)).toEqual(VERSIONS.filter((v) => v > 7));
      expect(parsed).toMatchObject({ modified: [], unknown: [], currentVersion: 7 });
      const done = await cli('migrate', '--db', url);
      expect(done).toMatchObject({ code: 0 });
      expect(done.out).toMatch(new RegExp(`migrated from 0007 to ${String(LATEST_VERSION).padStart(4, '0')}`));
      // plan shows the compatibility window status reports, as a line and in --json.
      // (No shipped migration narrows the window yet: test/unit/plan-rendering.test.ts covers the other form.)
      const window = JSON.parse((await cli('status', '--db', url, '--json')).out).window;
      expect(window).toEqual({
        oldestWriterRelease: null,
        setByVersion: null,
        newestAppliedByRelease: expect.any(String),
      });
      const planJson = await cli('plan', '--db', url, '--json');
      expect(planJson.code).toBe(0);
      expect(JSON.parse(planJson.out).window).toEqual(window);
      const planText = await cli('plan', '--db', url);
      expect(planText.code).toBe(0);
      expect(planText.out.split('\n').find((line) => line.startsWith('-- compatibility window:'))).toBe(
        `-- compatibility window: every taskfence release that knows this schema may write; last migrated by taskfence ${window.newestAppliedByRelease}`,
      );
    });

    it('exits 2 on usage errors', async () => {
      expect((await cli('launch')).code).toBe(2);
      expect((await cli('migrate', '--to', 'five')).code).toBe(2);
      expect((await cli('status', '--to', '5')).code).toBe(2);
      expect((await cli('migrate', '--db')).code).toBe(2);
      expect((await cli('--help')).code).toBe(0);
    });

    it('exits 1 with a one-line error that says what to do, for a bad URL, an edited migration and an unknown database state', async () => {
      const bad = await cli('status', '--db', 'mysql://localhost/x');
      expect(bad.code).toBe(1);
      expect(bad.err).toMatch(/^taskfence: Invalid database URL .*Use sqlite:<path>/);
      expect(bad.err.split('\n')).toHaveLength(1);

      const url = await fx.freshUrl();
      expect((await cli('migrate', '--db', url)).code).toBe(0);
      const store = await fx.open(url);
      await store.db
        .updateTable('taskfence_migrations')
        .set({ checksum: 'f'.repeat(64) })
        .where('version', '=', 53)
        .execute();
      const edited = await cli('migrate', '--db', url);
      expect(edited.code).toBe(1);
      expect(edited.err).toMatch(
        /^taskfence: Migration 0053 task_environments was edited after it was applied.*new migration\.$/,
      );
      const status = JSON.parse((await cli('status', '--db', url, '--json')).out);
      expect(status.modified.map((m: { version: number }) => m.version)).toEqual([53]);

      const legacyUrl = await fx.freshUrl();
      await makeLegacyV5Database(await fx.open(legacyUrl));
      const refused = await cli('migrate', '--db', legacyUrl);
      expect(refused.code).toBe(1);
      expect(refused.err).toMatch(/--baseline/);
      expect((await cli('migrate', '--db', legacyUrl, '--baseline', '0005')).code).toBe(0);
    });

    it('exits 1 with a lock-timeout error while another migrator holds the lock', async () => {
      const url = await fx.freshUrl();
      const holder = await fx.open(url);
      await holder.migrate({ to: 8 });
      let release!: () => void;
      const held = new Promise<void>((resolve) => (release = resolve));
      let locked!: () => void;
      const isLocked = new Promise<void>((resolve) => (locked = resolve));
      const holding = holder.dialect.withMigrationLock(
        async (trx) => {
          await sql`update ${tbl(trx, 'companies')} set name = name`.execute(trx);
          locked();
          await held;
        },
        { waitMs: 10_000 },
      );
      await isLocked;
      try {
        const result = await cli('migrate', '--db', url, '--lock-timeout', '300');
        expect(result.code).toBe(1);
        expect(result.err).toMatch(/^taskfence: Another process held the migration lock for more than 300 ms/);
      } finally {
        release();
        await holding;
      }
      const migrated = await holder.migrate();
      expect(migrated.toVersion).toBe(LATEST_VERSION);
      void MigrationLockTimeoutError;
    });

    it('exits 1 when the database cannot be reached', async () => {
      const url =
        fx.kind === 'postgres' ? 'postgres://postgres@127.0.0.1:1/nowhere' : 'sqlite:/nonexistent-dir/deeper/x.db';
      const result = await cli('status', '--db', url);
      expect(result.code).toBe(1);
      expect(result.err).toMatch(
        fx.kind === 'postgres'
          ? /^taskfence: Cannot reach the database at .*Check that/
          : /^taskfence: cannot open sqlite:.*the directory .* does not exist/,
      );
    });
  });
}
