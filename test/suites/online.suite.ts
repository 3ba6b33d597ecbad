/**
 * Online migrations (issue 25): DDL that steps out of a busy table's lock queue instead of
 * stalling the application behind it (PostgreSQL), backfills after the DDL commits in batches of
 * their own transactions, resumable from the recorded cursor after a SIGKILL, and databases that
 * applied 0052 under the earlier migrator (its backfill inside the DDL transaction) accepted.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from 'kysely';
import pg from 'pg';
import {
  MIGRATIONS,
  MigrationChecksumMismatchError,
  Migrator,
  ReleaseOutsideWindowError,
  ReleaseStillRunningError,
  TASKFENCE_RELEASE,
  openStore,
  type MigrationDefinition,
  type MigrationEvent,
  type Store,
} from '../../src/index.js';
import { backfillRequiresFilesystem, migration0052 } from '../../src/migrations/0052_requires_filesystem.js';
import { migrationChecksum } from '../../src/migrator/checksum.js';
import { main } from '../../src/cli.js';
import type { DialectFixture } from '../support/fixtures.js';
import { Contenders, ContenderExitedError } from '../support/race.js';
import { qualifiedName, tbl, useUrlSchema } from '../support/schema.js';
import {
  BACKFILL_EXPECTED,
  BACKFILL_NOW,
  ManualClock,
  insertBackfillFixture,
  readRequiresFilesystem,
} from './locks.suite.js';
import { ops as OPS } from './online.ops.js';
import { migration0053 as OLD_0053 } from '../fixtures/before-concurrent-steps/0053_task_environments.js';
import { migration0070 as OLD_0070 } from '../fixtures/before-concurrent-steps/0070_message_delivery.js';
import { migration0090 as OLD_0090 } from '../fixtures/before-concurrent-steps/0090_work_lifecycle.js';

const LATEST = MIGRATIONS.at(-1)!.version;

/**
 * 0052 as taskfence shipped it before the online migrator: the column and the whole backfill in
 * the one DDL transaction. Its checksum is the one `acceptedChecksums` lists.
 */
const LEGACY_0052: MigrationDefinition = {
  version: 52,
  name: 'requires_filesystem',
  async up(ctx) {
    await migration0052.up({ ...ctx, types: { ...ctx.types, concurrentDdl: false } });
    await backfillRequiresFilesystem(ctx.db, { now: ctx.now, progress: ctx.progress, batchSize: 50_000 });
  },
  down: (ctx) => migration0052.down(ctx),
};

/** A task row as the release at 0008 writes it (it knows none of the later columns). */
async function insertOldReleaseTask(store: Store, id: string): Promise<void> {
  await sql`insert into ${tbl(store.db, 'tasks')} (id, company_id, assignee_agent_id, title, status, created_at, updated_at)
    values (${id}, 'co', null, ${id}, 'todo', 1, 1)`.execute(store.db);
}

/** Tasks by id with their seq, in seq order. */
async function taskSeqs(store: Store): Promise<{ id: string; seq: number }[]> {
  const { rows } = await sql<{
    id: string;
    seq: number | string | null;
  }>`select id, seq from ${tbl(store.db, 'tasks')} order by seq, id`.execute(store.db);
  return rows.map((r) => ({ id: r.id, seq: Number(r.seq) }));
}

/** Legacy tasks written by the release at 0008, created_at out of id order so the old order is not the id order. */
async function insertLegacyTasks(store: Store, count: number): Promise<string[]> {
  await sql`insert into ${tbl(store.db, 'companies')} (id, name, created_at) values ('co', 'co', 0)`.execute(store.db);
  const ids: string[] = [];
  for (let i = 0; i < count; i++) {
    const id = `legacy-${String(i).padStart(2, '0')}`;
    // created_at falls as the id rises, with pairs sharing a created_at (then id decides).
    await sql`insert into ${tbl(store.db, 'tasks')} (id, company_id, assignee_agent_id, title, status, created_at, updated_at)
      values (${id}, 'co', null, ${id}, 'todo', ${1000 - Math.floor(i / 2)}, 1)`.execute(store.db);
    ids.push(id);
  }
  // The old order, (created_at, id).
  return ids.sort((a, b) => {
    const ca = 1000 - Math.floor(Number(a.slice(7)) / 2);
    const cb = 1000 - Math.floor(Number(b.slice(7)) / 2);
    return ca - cb || (a < b ? -1 : 1);
  });
}

async function stepsDone(store: Store): Promise<{ version: number; step: number }[]> {
  const { rows } = await sql<{
    version: number | string;
    step: number | string;
  }>`select version, step from ${tbl(store.db, 'taskfence_migration_steps')} order by version, step`.execute(store.db);
  return rows.map((r) => ({ version: Number(r.version), step: Number(r.step) }));
}

async function backfillState(store: Store, version: number) {
  const { rows } = await sql<{
    backfill: string | null;
    backfill_cursor: string | null;
    backfill_done: number | string;
  }>`select backfill, backfill_cursor, backfill_done from ${tbl(store.db, 'taskfence_migration_state')} where version = ${version}`.execute(
    store.db,
  );
  return rows[0];
}

export function defineOnlineMigrationSuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  beforeAll(() => {
    fx = makeFixture();
  });
  afterAll(() => fx.cleanup());

  describe('checksums of migrations applied before the online migrator', () => {
    it('a database that applied 0052 with its backfill inside the DDL transaction is accepted and migrates on', async () => {
      const kind = fx.kind;
      // The legacy definition reproduces the checksum that taskfence recorded then.
      expect(migration0052.acceptedChecksums?.[kind]).toContain(await migrationChecksum(LEGACY_0052, kind));
      expect(await migrationChecksum(migration0052, kind)).not.toBe(await migrationChecksum(LEGACY_0052, kind));
      const store = await fx.freshStore({ clock: new ManualClock(BACKFILL_NOW), to: 8 });
      await insertBackfillFixture(store);
      const legacyChain = MIGRATIONS.map((m) => (m.version === 52 ? LEGACY_0052 : m));
      await new Migrator(store.dialect, legacyChain).migrate({ to: 52, now: BACKFILL_NOW });
      expect(await readRequiresFilesystem(store)).toEqual(BACKFILL_EXPECTED);
      const status = await store.migrationStatus();
      expect(status.modified).toEqual([]);
      expect(status.backfills).toEqual([]);
      const result = await store.migrate();
      expect(result.applied).toEqual(MIGRATIONS.filter((m) => m.version > 52).map((m) => m.version));
      expect(await readRequiresFilesystem(store)).toEqual(BACKFILL_EXPECTED);
      // Any other checksum is still an edited migration.
      const edited = MIGRATIONS.map((m) => (m.version === 52 ? { ...m, acceptedChecksums: {} } : m));
      await expect(new Migrator(store.dialect, edited).status().then((s) => s.modified)).resolves.toHaveLength(1);
      await expect(new Migrator(store.dialect, edited).migrate()).rejects.toBeInstanceOf(
        MigrationChecksumMismatchError,
      );
    });
  });

  describe('checksums of migrations applied before concurrent steps', () => {
    it('a database that applied 0053, 0070 and 0090 with their indexes, CHECKs and numbering in the DDL transaction is accepted; the steps find their work done', async () => {
      const kind = fx.kind;
      const old = new Map([OLD_0053, OLD_0070, OLD_0090].map((m) => [m.version, m]));
      for (const m of old.values()) {
        const current = MIGRATIONS.find((c) => c.version === m.version)!;
        expect(current.acceptedChecksums?.[kind], `${m.version}`).toContain(await migrationChecksum(m, kind));
        expect(await migrationChecksum(current, kind)).not.toBe(await migrationChecksum(m, kind));
      }
      const store = await fx.freshStore({ to: 8 });
      const legacy = await insertLegacyTasks(store, 6);
      const oldChain = MIGRATIONS.map((m) => old.get(m.version) ?? m);
      await new Migrator(store.dialect, oldChain).migrate();
      const numbered = await taskSeqs(store);
      expect(numbered).toEqual(legacy.map((id, i) => ({ id, seq: i + 1 })));
      const status = await store.migrationStatus();
      expect(status.modified).toEqual([]);
      expect(status.currentVersion).toBe(LATEST);
      // Applied by a migrator that recorded no steps (0052, today's, ran its step): the next migrate runs them, finds each index
      // valid and each CHECK validated (the backfill indexes alone are new), and records them.
      expect(status.steps.map((p) => p.version)).toEqual([53, 70, 90]);
      const events: MigrationEvent[] = [];
      await store.migrate({ onEvent: (e) => events.push(e) });
      const messages = events.flatMap((e) => (e.type === 'progress' ? [e.message] : []));
      expect(messages).toContain('0053: index tasks_parent_idx on tasks: already there');
      expect(messages).toContain('0090: index tasks_seq_idx on tasks: already there');
      expect((await store.migrationStatus()).steps).toEqual([]);
      expect(await taskSeqs(store)).toEqual(numbered);
    });
  });

  describe('concurrent steps and online numbering', () => {
    it('numbers legacy tasks 1, 2, … in (created_at, id) order after the DDL commits; a task the old release inserts meanwhile is numbered above them all', async () => {
      const url = await fx.freshUrl();
      const store = await fx.open(url);
      await store.migrate({ to: 8 });
      const legacy = await insertLegacyTasks(store, 7);
      await store.migrate({ to: 56 });
      const app = await fx.open(url);
      let inserted = false;
      const events: MigrationEvent[] = [];
      await store.migrate({
        to: 90,
        batchSize: 2,
        onEvent: (event) => {
          events.push(event);
          // Between two batches of 0090's numbering, the release at 0056 inserts a task.
          if (!inserted && event.type === 'progress' && event.version === 90 && event.done !== undefined) {
            inserted = true;
            void insertOldReleaseTask(app, 'new-mid-backfill');
          }
        },
      });
      await new Promise((resolve) => setTimeout(resolve, 50));
      expect(inserted).toBe(true);
      const seqs = await taskSeqs(store);
      expect(seqs.slice(0, legacy.length)).toEqual(legacy.map((id, i) => ({ id, seq: i + 1 })));
      expect(seqs.at(-1)).toMatchObject({ id: 'new-mid-backfill' });
      expect(seqs.at(-1)!.seq).toBeGreaterThan(legacy.length);
      // A task inserted now by the new release's path (the default or trigger) comes after it.
      await insertOldReleaseTask(app, 'after');
      expect((await taskSeqs(store)).at(-1)).toMatchObject({ id: 'after' });
      expect((await taskSeqs(store)).at(-1)!.seq).toBeGreaterThan(seqs.at(-1)!.seq);
      // The steps ran after each DDL and are recorded; the plan lists none left.
      expect(await stepsDone(store)).toEqual(
        MIGRATIONS.filter((m) => m.version <= 90).flatMap((m) =>
          (m.concurrent ?? []).map((_, step) => ({ version: m.version, step })),
        ),
      );
      expect(
        events.some((e) => e.type === 'progress' && e.message.startsWith('0090: index tasks_seq_idx on tasks: done')),
      ).toBe(true);
      await app.close();
    });
  });

  describe('backfills after the DDL commits', () => {
    it('an application write commits between two backfill batches, with the backfill still running', async () => {
      const url = await fx.freshUrl();
      const store = await fx.open(url, { clock: new ManualClock(BACKFILL_NOW) });
      await store.migrate({ to: 8 });
      await insertBackfillFixture(store);
      const app = await fx.open(url);
      let firstBatch!: () => void;
      const batchCommitted = new Promise<void>((resolve) => (firstBatch = resolve));
      const events: MigrationEvent[] = [];
      const migrating = store.migrate({
        to: 52,
        batchSize: 5,
        pauseMs: 500,
        onEvent: (event) => {
          events.push(event);
          if (event.type === 'progress' && event.done !== undefined) firstBatch();
        },
      });
      await batchCommitted;
      // The old release writes while the migration is under way: it waits for one batch at most.
      await insertOldReleaseTask(app, 'written-mid-backfill');
      expect((await backfillState(app, 52))?.backfill).toBe('running');
      await migrating;
      expect((await backfillState(app, 52))?.backfill).toBe('complete');
      const flags = await readRequiresFilesystem(store);
      expect(flags).toEqual({ ...BACKFILL_EXPECTED, 'written-mid-backfill': 0 });
      const progress = events.filter((e) => e.type === 'progress' && e.version === 52 && e.done !== undefined);
      expect(progress.length).toBe(Math.floor(Object.keys(BACKFILL_EXPECTED).length / 5));
      expect(progress.at(-1)).toMatchObject({ total: Object.keys(BACKFILL_EXPECTED).length });
    });

    it('rejects a batch size or pause that is not a positive integer or a non-negative number, changing nothing', async () => {
      const store = await fx.freshStore({ to: 8 });
      await expect(store.migrate({ batchSize: 0 })).rejects.toMatchObject({
        code: 'INVALID_ARGUMENT',
        field: 'batchSize',
      });
      await expect(store.migrate({ pauseMs: -1 })).rejects.toMatchObject({
        code: 'INVALID_ARGUMENT',
        field: 'pauseMs',
      });
      expect((await store.migrationStatus()).currentVersion).toBe(8);
    });
  });

  describe('crashes', () => {
    it("a migrator SIGKILLed between 0053's DDL and its concurrent step resumes: the next migrate builds the index and applies the rest", async () => {
      const url = await fx.freshUrl();
      const store = await fx.open(url);
      await store.migrate({ to: 8 });
      await insertLegacyTasks(store, 3);
      const contenders = await Contenders.start(1, { url, ops: OPS });
      try {
        const running = contenders.start(0, 'migrateAndHangBeforeStep', { hangAt: 2 });
        await contenders.waitForSignal(0, 'before-step', 60_000);
        await contenders.kill(0);
        await expect(running).rejects.toBeInstanceOf(ContenderExitedError);
      } finally {
        await contenders.close();
      }
      const status = await store.migrationStatus();
      expect(status.currentVersion).toBe(53);
      expect(status.steps).toEqual([{ version: 53, name: 'task_environments', done: 0, total: 2 }]);
      expect(await store.dialect.indexState(store.db, 'tasks_parent_idx')).toBe('missing');
      const rerun = await store.migrate();
      expect(rerun.toVersion).toBe(LATEST);
      expect(await store.dialect.indexState(store.db, 'tasks_parent_idx')).toBe('valid');
      expect((await store.migrationStatus()).steps).toEqual([]);
      expect((await stepsDone(store)).filter((d) => d.version === 53)).toEqual([
        { version: 53, step: 0 },
        { version: 53, step: 1 },
      ]);
      expect(await store.dialect.constraintValidated(store.db, 'tasks', 'tasks_workspace_mode_check')).toBe(true);
    });

    it('a migrator SIGKILLed inside a backfill batch resumes from the recorded cursor and flags exactly the rows of a run without the crash', async () => {
      const url = await fx.freshUrl();
      const store = await fx.open(url, { clock: new ManualClock(BACKFILL_NOW) });
      await store.migrate({ to: 8 });
      await insertBackfillFixture(store);
      const contenders = await Contenders.start(1, { url, ops: OPS });
      try {
        const running = contenders.start(0, 'migrateAndHangInBackfill', { now: BACKFILL_NOW, batchSize: 5, hangIn: 3 });
        await contenders.waitForSignal(0, 'inside-batch', 60_000);
        await contenders.kill(0);
        await expect(running).rejects.toBeInstanceOf(ContenderExitedError);
      } finally {
        await contenders.close();
      }
      // The DDL and two batches committed; the third (in flight) rolled back.
      const status = await store.migrationStatus();
      expect(status.currentVersion).toBe(52);
      expect(status.backfills).toEqual([
        { version: 52, name: 'requires_filesystem', done: 10, changed: expect.any(Number) },
      ]);
      const state = await backfillState(store, 52);
      expect(state?.backfill).toBe('running');
      expect(state?.backfill_cursor).not.toBeNull();
      // A later migrate resumes with the recorded `now` (not its own), then applies the rest.
      const events: MigrationEvent[] = [];
      const rerun = await store.migrate({ batchSize: 5, now: BACKFILL_NOW + 9e15, onEvent: (e) => events.push(e) });
      expect(events).toContainEqual({
        type: 'progress',
        version: 52,
        message: '0052: resuming the backfill after 10 rows',
      });
      expect(rerun.applied).toEqual(MIGRATIONS.filter((m) => m.version > 52).map((m) => m.version));
      expect(rerun.toVersion).toBe(LATEST);
      expect(await readRequiresFilesystem(store)).toEqual(BACKFILL_EXPECTED);
      expect((await store.migrationStatus()).backfills).toEqual([]);
    });
  });
}

/**
 * PostgreSQL only: its DDL queues for table locks, and every later query on the table queues behind
 * it. (SQLite has no lock queue: WAL readers never wait, and a writer waits for one backfill batch
 * at most, tested above on both dialects.)
 */
export function defineLockQueueSuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  beforeAll(() => {
    fx = makeFixture();
  });
  afterAll(() => fx.cleanup());

  describe('concurrent steps on PostgreSQL', () => {
    it('an INVALID index left by a failed CREATE INDEX CONCURRENTLY is dropped and built again', async () => {
      const store = await fx.freshStore({ to: 53 });
      await sql`insert into ${tbl(store.db, 'companies')} (id, name, created_at) values ('co', 'co', 0)`.execute(
        store.db,
      );
      for (let i = 0; i < 3; i++) await insertOldReleaseTask(store, `t${i}`);
      // The state a killed or failed concurrent build leaves: the step unrecorded, the index INVALID
      // (here a unique build over duplicates, under the same name, on another column).
      await sql`drop index ${tbl(store.db, 'tasks_parent_idx')}`.execute(store.db);
      await sql`delete from ${tbl(store.db, 'taskfence_migration_steps')} where version = 53`.execute(store.db);
      await expect(
        sql`create unique index concurrently tasks_parent_idx on ${tbl(store.db, 'tasks')} (company_id)`.execute(
          store.db,
        ),
      ).rejects.toThrow();
      expect(await store.dialect.indexState(store.db, 'tasks_parent_idx')).toBe('invalid');
      const events: MigrationEvent[] = [];
      await store.migrate({ to: 53, onEvent: (e) => events.push(e) });
      expect(await store.dialect.indexState(store.db, 'tasks_parent_idx')).toBe('valid');
      const { rows } = await sql<{
        def: string;
      }>`select pg_get_indexdef(to_regclass(${qualifiedName(store.db, 'tasks_parent_idx')})) as def`.execute(store.db);
      expect(rows[0]?.def).toMatch(/\(parent_id\)$/);
      expect(events).toContainEqual(
        expect.objectContaining({
          type: 'progress',
          message: expect.stringContaining('an INVALID index left by an interrupted build was dropped first'),
        }),
      );
    });
  });

  describe('the DDL lock queue', () => {
    it('DDL blocked by a long application transaction retries under a short lock_timeout; application queries keep running', async () => {
      const url = await fx.freshUrl();
      const store = await fx.open(url);
      await store.migrate({ to: 8 });
      await sql`insert into ${tbl(store.db, 'companies')} (id, name, created_at) values ('co', 'co', 0)`.execute(
        store.db,
      );
      for (let i = 0; i < 5; i++) await insertOldReleaseTask(store, `t${i}`);
      const tasks = qualifiedName(store.db, 'tasks');
      // A long application transaction holds ACCESS SHARE on tasks (what any read takes).
      const holder = new pg.Client({ connectionString: url });
      const app = new pg.Client({ connectionString: url });
      const observer = new pg.Client({ connectionString: url });
      for (const c of [holder, app, observer]) {
        await c.connect();
        await useUrlSchema(c, url);
      }
      try {
        await holder.query('begin');
        await holder.query(`select count(*) from ${tasks}`);
        const holderPid = Number((await holder.query('select pg_backend_pid() as pid')).rows[0].pid);
        const appPid = Number((await app.query('select pg_backend_pid() as pid')).rows[0].pid);
        const events: MigrationEvent[] = [];
        const migrating = store.migrate({ ddlLockTimeoutMs: 600_000, onEvent: (e) => events.push(e) });
        migrating.catch(() => {});
        // The migration's ALTER TABLE waits for the holder: seen in pg_locks, blocked by the holder.
        let migratorPid: number | undefined;
        while (migratorPid === undefined) {
          const { rows } = await observer.query(
            `select l.pid, pg_blocking_pids(l.pid) as blockers from pg_locks l
             where l.relation = $1::regclass and not l.granted and l.mode = 'AccessExclusiveLock'`,
            [tasks],
          );
          if (rows[0]) {
            expect(rows[0].blockers.map(Number)).toContain(holderPid);
            migratorPid = Number(rows[0].pid);
          } else await new Promise((r) => setTimeout(r, 10));
        }
        // Meanwhile the application reads and writes tasks, each query finishing while the holder
        // still holds its lock and the migration has not got past it.
        for (let i = 0; i < 20; i++) {
          await app.query(`select count(*) from ${tasks}`);
          await app.query(`update ${tasks} set title = $1 where id = 't1'`, [`t1 v${i}`]);
          const { rows } = await observer.query(
            `select granted from pg_locks where pid = $1 and relation = $2::regclass`,
            [holderPid, tasks],
          );
          expect(rows).toEqual([{ granted: true }]);
          // The application's backend is not waiting for any lock now (the queries above returned).
          const blocked = await observer.query(`select pg_blocking_pids($1) as blockers`, [appPid]);
          expect(blocked.rows[0].blockers).toEqual([]);
        }
        expect((await store.migrationStatus()).currentVersion).toBe(8);
        // It stepped out of the queue and retried, with jittered pauses.
        while (!events.some((e) => e.type === 'lock-retry' && e.attempt >= 2))
          await new Promise((r) => setTimeout(r, 20));
        const retries = events.filter((e) => e.type === 'lock-retry');
        expect(retries.every((e) => e.type === 'lock-retry' && e.version === 52 && e.delayMs >= 0)).toBe(true);
        await holder.query('commit');
        const result = await migrating;
        expect(result.toVersion).toBe(LATEST);
      } finally {
        await holder.query('rollback').catch(() => {});
        for (const c of [holder, app, observer]) await c.end().catch(() => {});
      }
    });
  });
}

/** A migration only releases from 99.0.0 on may write after (the window moves past this taskfence). */
const NEEDS_NEWER: MigrationDefinition = {
  version: 9000,
  name: 'needs_newer_writers',
  up: async () => {},
  down: async () => {},
  minWriterRelease: '99.0.0',
};

/** The compatibility window, and `migrate --to` against the releases that are running. */
export function defineCompatibilityWindowSuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  beforeAll(() => {
    fx = makeFixture();
  });
  afterAll(() => fx.cleanup());

  it('openStore of a release older than the window refuses, typed, naming both releases; status and plan show the window', async () => {
    const url = await fx.freshUrl();
    const store = await fx.open(url);
    await store.migrate();
    expect((await store.migrationStatus()).window).toEqual({
      oldestWriterRelease: null,
      setByVersion: null,
      newestAppliedByRelease: TASKFENCE_RELEASE,
    });
    await new Migrator(store.dialect, [...MIGRATIONS, NEEDS_NEWER], { release: '99.0.0' }).migrate();
    const refused = await openStore(url).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(ReleaseOutsideWindowError);
    expect(refused).toMatchObject({
      code: 'RELEASE_OUTSIDE_WINDOW',
      release: TASKFENCE_RELEASE,
      oldestRelease: '99.0.0',
      version: 9000,
    });
    expect((refused as Error).message).toContain(`taskfence ${TASKFENCE_RELEASE}`);
    expect((refused as Error).message).toContain('taskfence 99.0.0 or newer');
    const newer = new Migrator(store.dialect, [...MIGRATIONS, NEEDS_NEWER]);
    expect((await newer.status()).window).toEqual({
      oldestWriterRelease: '99.0.0',
      setByVersion: 9000,
      newestAppliedByRelease: '99.0.0',
    });
    // Reverting it closes the window again.
    await newer.migrate({ to: LATEST });
    const reopened = await openStore(url);
    await reopened.close();
  });

  it('migrate --to below what an open store of a running release needs is refused, changing nothing, unless forced', async () => {
    const url = await fx.freshUrl();
    const migrating = await fx.open(url);
    await migrating.migrate();
    // Another process's store, opened on the migrated database, registers the version it needs.
    const running = await openStore(url);
    try {
      const refused = await migrating.migrate({ to: 8 }).catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(ReleaseStillRunningError);
      expect(refused).toMatchObject({ code: 'RELEASE_STILL_RUNNING', target: 8 });
      expect((refused as ReleaseStillRunningError).running).toEqual([
        expect.objectContaining({ release: TASKFENCE_RELEASE, needsVersion: LATEST, pid: process.pid }),
      ]);
      expect((await migrating.migrationStatus()).currentVersion).toBe(LATEST);
      const cli = await runCli(['migrate', '--db', url, '--to', '8']);
      expect(cli.code).toBe(1);
      expect(cli.err).toMatch(
        new RegExp(`Refusing to migrate down to 0008: taskfence .* needs ${String(LATEST).padStart(4, '0')}.*--force`),
      );
      expect((await migrating.migrationStatus()).currentVersion).toBe(LATEST);
      // Up is never refused, and neither is the migrating store's own registration.
      const forced = await runCli(['migrate', '--db', url, '--to', '52', '--force']);
      expect(forced.code).toBe(0);
      expect((await migrating.migrationStatus()).currentVersion).toBe(52);
      await migrating.migrate();
    } finally {
      await running.close();
    }
    // Once that store closed, nothing needs more than 0008.
    expect((await migrating.migrate({ to: 8 })).toVersion).toBe(8);
  });
}

async function runCli(argv: string[]): Promise<{ code: number; out: string; err: string }> {
  const out: string[] = [];
  const err: string[] = [];
  const code = await main(
    argv,
    (l) => out.push(l),
    (l) => err.push(l),
  );
  return { code, out: out.join('\n'), err: err.join('\n') };
}
