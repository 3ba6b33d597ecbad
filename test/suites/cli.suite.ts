/**
 * The CLI as a deploy pipeline runs it: the built binary (dist/cli.js) in a child process.
 * Run `npm run build` first.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { sql } from 'kysely';
import { MIGRATIONS, type Store } from '../../src/index.js';
import type { DialectFixture } from '../support/fixtures.js';
import { makeLegacyV5Database } from './legacy.js';
import { inStoreSchema, quotedTablePattern, schemaOfUrl, tbl } from '../support/schema.js';

export const CLI = fileURLToPath(new URL('../../dist/cli.js', import.meta.url));
const VERSIONS = MIGRATIONS.map((m) => m.version);

export interface CliResult {
  readonly code: number | null;
  readonly out: string;
  readonly err: string;
}

/** Runs dist/cli.js with stdin a closed pipe (not a terminal), without TASKFENCE_DATABASE_URL unless given. */
export function runCli(
  args: readonly string[],
  options: {
    env?: Record<string, string | undefined>;
    cwd?: string;
    onStdout?: (chunk: string) => void;
    asUser?: string;
  } = {},
): Promise<CliResult> {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries({ ...process.env, TASKFENCE_DATABASE_URL: undefined, ...options.env })) {
    if (v !== undefined) env[k] = v;
  }
  return new Promise((resolve, reject) => {
    const command = options.asUser
      ? ['runuser', '-u', options.asUser, '--', process.execPath, CLI, ...args]
      : [process.execPath, CLI, ...args];
    const child = spawn(command[0]!, command.slice(1), { env, cwd: options.cwd, stdio: ['pipe', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => {
      out += d;
      options.onStdout?.(d);
    });
    child.stderr.setEncoding('utf8').on('data', (d: string) => (err += d));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, out, err }));
    child.stdin.end();
  });
}

/** Exactly one line on stderr, and no stack trace. */
export function expectOneLine(result: CliResult): void {
  const lines = result.err.trimEnd().split('\n');
  expect(lines, result.err).toHaveLength(1);
  expect(lines[0]).toMatch(/^taskfence: /);
  expect(result.err).not.toMatch(/\n\s+at /);
}

async function tableNames(store: Store): Promise<string[]> {
  return Object.keys((await store.describeSchema()).tables).sort();
}

async function historyVersions(store: Store): Promise<number[]> {
  const rows = await store.db.selectFrom('taskfence_migrations').select('version').orderBy('version').execute();
  return rows.map((r) => Number(r.version));
}

/** Inserts `n` tasks (and their company) into a database at version 0008..0051. */
export async function insertManyTasks(store: Store, n: number): Promise<void> {
  await sql`insert into ${tbl(store.db, 'companies')} (id, name, created_at) values ('bulk', 'bulk', 1)`.execute(
    store.db,
  );
  if (store.dialect.kind === 'postgres') {
    await sql`insert into ${tbl(store.db, 'tasks')} (id, company_id, title, status, created_at, updated_at)
      select 't' || lpad(i::text, 8, '0'), 'bulk', 't', 'todo', 1, 1 from generate_series(1, ${n}) as i`.execute(
      store.db,
    );
  } else {
    await sql`with recursive s(i) as (select 1 union all select i + 1 from s where i < ${n})
      insert into ${tbl(store.db, 'tasks')} (id, company_id, title, status, created_at, updated_at)
      select 't' || printf('%08d', i), 'bulk', 't', 'todo', 1, 1 from s`.execute(store.db);
  }
}

export function defineCliSuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  let dir: string;
  beforeAll(() => {
    if (!existsSync(CLI)) throw new Error(`${CLI} is missing: run \`npm run build\` first`);
    fx = makeFixture();
    dir = mkdtempSync(join(tmpdir(), 'taskfence-cli-'));
  });
  afterAll(async () => {
    await fx.cleanup();
    rmSync(dir, { recursive: true, force: true });
  });

  describe('doctor and prune', () => {
    it('doctor exits 0 on a healthy database, 1 when an index was dropped, and prints JSON with --json', async () => {
      const url = await fx.freshUrl();
      const store = await fx.open(url);
      await store.migrate();
      const ok = await runCli(['doctor', '--db', url]);
      expect(ok.code, ok.out + ok.err).toBe(0);
      const json = await runCli(['doctor', '--db', url, '--json']);
      expect(JSON.parse(json.out)).toMatchObject({ ok: true });
      await sql`drop index ${tbl(store.db, 'coordinator_runs_one_running_per_target')}`.execute(store.db);
      const broken = await runCli(['doctor', '--db', url, '--json']);
      expect(broken.code).toBe(1);
      expect(JSON.parse(broken.out)).toMatchObject({ ok: false });
    });

    it('prune --dry-run counts and deletes nothing; prune deletes what is finished; it needs --older-than and, in automation, --db', async () => {
      const url = await fx.freshUrl();
      const store = await fx.open(url);
      await store.migrate();
      await store.messages.sendMessage({ allowUnknownRecipient: true, from: 'a', to: 'inbox', kind: 'k' });
      await store.messages.deliverPendingMessages('inbox');
      // Message ids are kept at least IDEMPOTENCY_WINDOW_MS: a fresh one outlives --older-than 0.
      const fresh = await runCli(['prune', '--db', url, '--older-than', '0', '--dry-run', '--json']);
      expect(JSON.parse(fresh.out)).toMatchObject({ dryRun: true, deleted: { messages: 0 } });
      const twoDaysAgo = Date.now() - 2 * 24 * 3600_000;
      await store.db.updateTable('messages').set({ created_at: twoDaysAgo, delivered_at: twoDaysAgo }).execute();
      const dry = await runCli(['prune', '--db', url, '--older-than', '0', '--dry-run', '--json']);
      expect(dry.code, dry.err).toBe(0);
      expect(JSON.parse(dry.out)).toMatchObject({ dryRun: true, deleted: { messages: 1 } });
      expect(await store.db.selectFrom('messages').select('id').execute()).toHaveLength(1);
      const real = await runCli(['prune', '--db', url, '--older-than', '0s']);
      expect(real.code, real.err).toBe(0);
      expect(real.out).toMatch(/messages\s+deleted 1/);
      expect(await store.db.selectFrom('messages').select('id').execute()).toHaveLength(0);
      expect((await runCli(['prune', '--db', url, '--older-than', '30d'])).out).toMatch(/messages\s+deleted 0/);
      expect((await runCli(['prune', '--db', url])).code).toBe(2);
      expect((await runCli(['prune', '--db', url, '--older-than', 'soon'])).code).toBe(2);
      expect((await runCli(['prune', '--older-than', '30d'], { env: { CI: 'true' } })).code).toBe(2);
    });
  });

  describe('gateable commands', () => {
    it('--version prints the package version', async () => {
      const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as {
        version: string;
      };
      const result = await runCli(['--version']);
      expect(result).toMatchObject({ code: 0, out: `taskfence ${pkg.version}\n` });
    });

    it('status --check exits 0 up to date, 3 pending, 4 baseline required, 5 edited, 6 unknown', async () => {
      const url = await fx.freshUrl();
      expect((await runCli(['status', '--db', url, '--check'])).code).toBe(3);
      expect((await runCli(['migrate', '--db', url])).code).toBe(0);
      expect((await runCli(['status', '--db', url, '--check'])).code).toBe(0);
      expect((await runCli(['status', '--db', url])).code).toBe(0);
      const store = await fx.open(url);
      await store.db
        .updateTable('taskfence_migrations')
        .set({ checksum: 'f'.repeat(64) })
        .where('version', '=', 53)
        .execute();
      expect((await runCli(['status', '--db', url, '--check'])).code).toBe(5);
      await store.db
        .insertInto('taskfence_migrations')
        .values({ version: 9999, name: 'future', checksum: 'x', applied_at: 1, duration_ms: 0 })
        .execute();
      const unknown = await runCli(['status', '--db', url, '--check', '--json']);
      expect(unknown.code).toBe(6);
      expect(JSON.parse(unknown.out)).toMatchObject({ upToDate: false, unknown: [{ version: 9999 }] });

      const legacyUrl = await fx.freshUrl();
      await makeLegacyV5Database(await fx.open(legacyUrl));
      expect((await runCli(['status', '--db', legacyUrl, '--check'])).code).toBe(4);
    });

    it('plan --json lists the steps; plan refuses a database that needs a baseline, changing nothing', async () => {
      const url = await fx.freshUrl();
      const plan = await runCli(['plan', '--db', url, '--to', '7', '--json']);
      expect(plan.code).toBe(0);
      const parsed = JSON.parse(plan.out);
      expect(parsed.steps.map((s: { version: number }) => s.version)).toEqual([5, 6, 7]);
      expect(parsed.steps[0].statements[0]).toMatch(
        new RegExp(`^create table ${quotedTablePattern(schemaOfUrl(url), 'companies')}`),
      );

      const legacyUrl = await fx.freshUrl();
      const legacy = await fx.open(legacyUrl);
      await makeLegacyV5Database(legacy);
      const before = await tableNames(legacy);
      const refused = await runCli(['plan', '--db', legacyUrl]);
      expect(refused.code).toBe(1);
      expectOneLine(refused);
      expect(refused.err).toMatch(/no taskfence migration history.*--baseline 5/);
      expect(await tableNames(legacy)).toEqual(before);
    });

    it('plan shows the 0052 backfill with the values it will run with: real roles, real time, and says the time is the run time', async () => {
      const url = await fx.freshUrl();
      const store = await fx.open(url);
      await store.migrate({ to: 8 });
      await sql`insert into ${tbl(store.db, 'companies')} (id, name, created_at) values ('c', 'c', 1)`.execute(
        store.db,
      );
      await sql`insert into ${tbl(store.db, 'agents')} (id, company_id, name, role, created_at) values ('a', 'c', 'a', 'Staff Software Engineer', 1), ('b', 'c', 'b', 'CFO', 1)`.execute(
        store.db,
      );
      const before = Date.now();
      const result = await runCli(['plan', '--db', url, '--to', '52']);
      expect(result.code).toBe(0);
      expect(result.out).toMatch(/a\.role in \('Staff Software Engineer'\)/);
      expect(result.out).not.toMatch(/0 = 1/);
      const expiry = /"?expires_at"? > (\d+)/.exec(result.out);
      expect(Number(expiry?.[1])).toBeGreaterThanOrEqual(before);
      expect(result.out).toMatch(/note: uses the time migrate starts, known only at run time/);
      expect(result.out).toMatch(/note: values read from the database now/);
      expect(await historyVersions(store)).toEqual(VERSIONS.filter((v) => v <= 8));
    });
  });

  describe('explicit target in automation', () => {
    it('migrate without --db or TASKFENCE_DATABASE_URL refuses with exit 2 when stdin is not a terminal, or CI is set, and creates nothing', async () => {
      const cwd = mkdtempSync(join(dir, 'auto-'));
      for (const env of [{ CI: undefined }, { CI: 'true' }]) {
        const result = await runCli(['migrate'], { cwd, env });
        expect(result.code).toBe(2);
        expectOneLine(result);
        expect(result.err).toMatch(/no database given: pass --db URL or set TASKFENCE_DATABASE_URL/);
        expect(existsSync(join(cwd, 'taskfence.db'))).toBe(false);
      }
      // An explicit URL (flag or environment) is used as given.
      const url = `sqlite:${join(cwd, 'explicit.db')}`;
      expect((await runCli(['migrate'], { cwd, env: { CI: 'true', TASKFENCE_DATABASE_URL: url } })).code).toBe(0);
      expect(existsSync(join(cwd, 'explicit.db'))).toBe(true);
    });

    it('interactively (a terminal, CI unset) migrate says which default it used, as the README quick start runs it', async () => {
      const cwd = mkdtempSync(join(dir, 'tty-'));
      // `script` gives the child a pseudo-terminal as stdin.
      const result = await new Promise<CliResult>((resolve, reject) => {
        const env: Record<string, string> = {};
        for (const [k, v] of Object.entries(process.env))
          if (v !== undefined && k !== 'CI' && k !== 'TASKFENCE_DATABASE_URL') env[k] = v;
        const child = spawn(
          'script',
          ['-qec', `${JSON.stringify(process.execPath)} ${JSON.stringify(CLI)} migrate`, '/dev/null'],
          { cwd, env, stdio: ['pipe', 'pipe', 'pipe'] },
        );
        let out = '';
        child.stdout.setEncoding('utf8').on('data', (d: string) => (out += d));
        child.on('error', reject);
        child.on('close', (code) => resolve({ code, out, err: '' }));
      });
      expect(result.out).toMatch(/using the default sqlite:\.\/taskfence\.db/);
      expect(result.code).toBe(0);
      expect(existsSync(join(cwd, 'taskfence.db'))).toBe(true);
    });
  });

  describe('data-loss guard', () => {
    it('a down step dropping tables or columns with rows is refused (nothing changes, steps and row counts named); plan marks it; --allow-data-loss goes ahead', async () => {
      const url = await fx.freshUrl();
      expect((await runCli(['migrate', '--db', url])).code).toBe(0);
      const store = await fx.open(url);
      await sql`insert into ${tbl(store.db, 'companies')} (id, name, created_at) values ('c', 'c', 1)`.execute(
        store.db,
      );
      await sql`insert into ${tbl(store.db, 'tasks')} (id, company_id, title, status, created_at, updated_at) values ('t1', 'c', 't', 'todo', 1, 1), ('t2', 'c', 't', 'todo', 1, 1)`.execute(
        store.db,
      );
      const schema = await store.describeSchema();

      // --force: the store above is open, and this test is about the data-loss guard, not running releases.
      const refused = await runCli(['migrate', '--db', url, '--to', '8', '--force']);
      expect(refused.code).toBe(1);
      expectOneLine(refused);
      expect(refused.err).toMatch(
        /^taskfence: Refusing to drop data: .*0052 requires_filesystem drops column tasks\.requires_filesystem \(2 rows\)/,
      );
      expect(refused.err).not.toMatch(/tasks\.parent_id/); // a column that holds no values loses nothing
      expect(refused.err).toMatch(/--allow-data-loss/);
      expect(await historyVersions(store)).toEqual(VERSIONS);
      expect(await store.describeSchema()).toEqual(schema);

      const zero = await runCli(['migrate', '--db', url, '--to', '0', '--force']);
      expect(zero.code).toBe(1);
      expect(zero.err).toMatch(/0005 baseline drops .*table tasks \(2 rows\)/);
      expect(zero.err).toMatch(/0005 baseline drops .*table companies \(1 row\)/);
      expect(await store.describeSchema()).toEqual(schema);

      const plan = await runCli(['plan', '--db', url, '--to', '8']);
      expect(plan.code).toBe(0);
      expect(plan.out).toMatch(
        /-- 0052 requires_filesystem \(down\) DESTRUCTIVE: drops column tasks\.requires_filesystem \(2 rows\)/,
      );
      expect(plan.out).toMatch(/-- 0054 ownership_generations \(down\)\n/); // its tables are empty: not destructive
      const planJson = JSON.parse((await runCli(['plan', '--db', url, '--to', '8', '--json'])).out);
      expect(planJson.destructive).toBe(true);

      const allowed = await runCli(['migrate', '--db', url, '--to', '8', '--allow-data-loss', '--force']);
      expect(allowed.code).toBe(0);
      expect(await historyVersions(store)).toEqual(VERSIONS.filter((v) => v <= 8));
      // Empty tables and columns are no data loss: down and up again without the flag.
      expect((await runCli(['migrate', '--db', url, '--to', '52'])).code).toBe(0);
    });
  });

  describe('refusals leave the database exactly as it was', () => {
    it('baseline required, wrong baseline and another application’s tasks table: exit 1, one line, no history table', async () => {
      const legacyUrl = await fx.freshUrl();
      const legacy = await fx.open(legacyUrl);
      await makeLegacyV5Database(legacy);
      const before = await tableNames(legacy);
      const required = await runCli(['migrate', '--db', legacyUrl]);
      expect(required.code).toBe(1);
      expectOneLine(required);
      expect(required.err).toMatch(
        /already has tables \(agents, .*tasks.*\).*match taskfence schema version 0005.*--baseline 5/,
      );
      const wrong = await runCli(['migrate', '--db', legacyUrl, '--baseline', '8']);
      expect(wrong.code).toBe(1);
      expectOneLine(wrong);
      expect(wrong.err).toMatch(/does not match schema version 0008/);
      expect(await tableNames(legacy)).toEqual(before);
      expect(before).not.toContain('taskfence_migrations');

      const otherUrl = await fx.freshUrl();
      const other = await fx.open(otherUrl);
      await inStoreSchema(other.db, async (db) => {
        await sql`create table ${tbl(other.db, 'tasks')} (id integer primary key, body text)`.execute(db);
        await sql`create table ${tbl(other.db, 'invoices')} (id integer primary key)`.execute(db);
      });
      if (fx.kind === 'sqlite') await sql`pragma user_version = 3`.execute(other.db);
      const foreign = await runCli(['migrate', '--db', otherUrl]);
      expect(foreign.code).toBe(1);
      expectOneLine(foreign);
      expect(foreign.err).toMatch(/already has tables \(invoices, tasks\)/);
      expect(foreign.err).toMatch(/match no taskfence schema version/);
      expect(foreign.err).not.toMatch(/--baseline \d/);
      expect(await tableNames(other)).toEqual(['invoices', 'tasks']);
      const foreignPlan = await runCli(['plan', '--db', otherUrl]);
      expect(foreignPlan.code).toBe(1);
      expect(await tableNames(other)).toEqual(['invoices', 'tasks']);
    });

    it('a refused migrate leaves another application’s SQLite file in its journal mode, never WAL', async () => {
      if (fx.kind !== 'sqlite') return; // journal modes are SQLite's
      const otherUrl = await fx.freshUrl();
      const file = otherUrl.slice('sqlite:'.length);
      const { default: Sqlite } = await import('better-sqlite3');
      const raw = new Sqlite(file);
      raw.exec('create table tasks (id integer primary key, body text)');
      raw.pragma('user_version = 3');
      expect(raw.pragma('journal_mode', { simple: true })).toBe('delete');
      raw.close();
      const refused = await runCli(['migrate', '--db', otherUrl]);
      expect(refused.code).toBe(1);
      expect(refused.err).toMatch(/Nothing was changed/);
      const after = new Sqlite(file, { readonly: true });
      expect(after.pragma('journal_mode', { simple: true })).toBe('delete');
      after.close();
    });

    it('a damaged history table gives one line naming what is wrong', async () => {
      const url = await fx.freshUrl();
      expect((await runCli(['migrate', '--db', url, '--to', '7'])).code).toBe(0);
      const store = await fx.open(url);
      await sql`alter table ${tbl(store.db, 'taskfence_migrations')} rename column checksum to checksum_old`.execute(
        store.db,
      );
      for (const command of ['migrate', 'status', 'plan']) {
        const result = await runCli([command, '--db', url]);
        expect(result.code, command).toBe(1);
        expectOneLine(result);
        expect(result.err).toMatch(/history table taskfence_migrations is damaged: column checksum is missing/);
      }
      await sql`alter table ${tbl(store.db, 'taskfence_migrations')} rename column checksum_old to checksum`.execute(
        store.db,
      );
      if (fx.kind === 'postgres') {
        await sql`alter table ${tbl(store.db, 'taskfence_migrations')} alter column checksum drop not null`.execute(
          store.db,
        );
      } else {
        // SQLite keeps NOT NULL; an empty checksum is the damage it can hold.
      }
      await sql`update ${tbl(store.db, 'taskfence_migrations')} set checksum = ${fx.kind === 'postgres' ? null : ''} where version = 6`.execute(
        store.db,
      );
      const result = await runCli(['migrate', '--db', url]);
      expect(result.code).toBe(1);
      expectOneLine(result);
      expect(result.err).toMatch(
        fx.kind === 'postgres'
          ? /the row for version 6 has a NULL checksum/
          : /the row for version 6 has an invalid checksum/,
      );
      expect(await historyVersions(store)).toEqual([5, 6, 7]);
    });
  });

  describe('progress', () => {
    it('migrate --json emits every event as a JSON line, with backfill progress (done, total)', async () => {
      const url = await fx.freshUrl();
      const store = await fx.open(url);
      await store.migrate({ to: 8 });
      await insertManyTasks(store, 120_000);
      const result = await runCli(['migrate', '--db', url, '--to', '52', '--json']);
      expect(result.code, result.err).toBe(0);
      const events = result.out
        .trimEnd()
        .split('\n')
        .map((l) => JSON.parse(l) as { type: string; done?: number; total?: number });
      const progress = events.filter((e) => e.type === 'progress' && e.done !== undefined);
      expect(progress.length).toBeGreaterThanOrEqual(2);
      expect(progress.every((e) => e.total === 120_000)).toBe(true);
      expect(events.at(-1)).toMatchObject({ type: 'done', toVersion: 52, applied: [52] });
    });

    it('without a terminal, progress is plain periodic lines with percent and rows/s', async () => {
      const url = await fx.freshUrl();
      const store = await fx.open(url);
      await store.migrate({ to: 8 });
      await insertManyTasks(store, 120_000);
      const result = await runCli(['migrate', '--db', url, '--to', '52']);
      expect(result.code, result.err).toBe(0);
      expect(result.out).toMatch(/ {2}0052 backfill: \d+%, \d+\/120000 rows, \d+ rows\/s, ETA \d+ s\n/);
      expect(result.out).not.toMatch(/\r/);
    });
  });

  describe('a PostgreSQL schema of its own (?schema=, --schema)', () => {
    it('migrate, status and plan work in the schema the URL or --schema names; plan shows schema-qualified SQL; SQLite refuses --schema', async () => {
      if (fx.kind === 'sqlite') {
        const refused = await runCli(['plan', '--db', await fx.freshUrl(), '--schema', 'tf_cli']);
        expect(refused.code).toBe(2);
        expect(refused.err).toMatch(/--schema is a PostgreSQL option/);
        return;
      }
      const bare = new URL(await fx.freshUrl());
      bare.searchParams.delete('schema');
      const inSchema = new URL(bare);
      inSchema.searchParams.set('schema', 'tf_cli');
      const migrated = await runCli(['migrate', '--db', inSchema.toString(), '--to', '53']);
      expect(migrated.code, migrated.err).toBe(0);
      // Everything went into tf_cli, nothing into public.
      const admin = await fx.open(bare.toString());
      const schemasOf = async (table: string) =>
        (
          await sql<{ s: string }>`select table_schema as s from information_schema.tables
            where table_name = ${table} order by 1`.execute(admin.db)
        ).rows.map((r) => r.s);
      expect(await schemasOf('taskfence_migrations')).toEqual(['tf_cli']);
      expect(await schemasOf('task_environments')).toEqual(['tf_cli']);
      // --schema and ?schema= mean the same; they may not disagree.
      const status = await runCli(['status', '--db', bare.toString(), '--schema', 'tf_cli', '--json']);
      expect(status.code, status.err).toBe(0);
      expect(JSON.parse(status.out)).toMatchObject({ schema: 'tf_cli', currentVersion: 53 });
      const disagree = await runCli(['status', '--db', inSchema.toString(), '--schema', 'other']);
      expect(disagree.code).toBe(2);
      // plan names the schema on every table it touches, as migrate will send it.
      const plan = await runCli(['plan', '--db', bare.toString(), '--schema', 'tf_cli', '--json']);
      expect(plan.code, plan.err).toBe(0);
      const parsed = JSON.parse(plan.out) as { schema: string; steps: { version: number; statements: string[] }[] };
      expect(parsed.schema).toBe('tf_cli');
      expect(parsed.steps.map((s) => s.version)).toEqual(VERSIONS.filter((v) => v > 53));
      const statements = parsed.steps.flatMap((s) => s.statements);
      const tableStatements = statements.filter((q) => /^(create|alter|drop) table\b/i.test(q));
      expect(tableStatements.length).toBeGreaterThan(0);
      for (const q of tableStatements) expect(q).toMatch(/^(create|alter|drop) table (if not exists )?"tf_cli"\./);
      const text = await runCli(['plan', '--db', inSchema.toString()]);
      expect(text.out).toMatch(/^-- in schema tf_cli: every table below is qualified with it$/m);
      expect(text.out).toMatch(/^create table "tf_cli"\."cleanup_snapshots"/m);
      // And migrate applies exactly that in tf_cli.
      const rest = await runCli(['migrate', '--db', bare.toString(), '--schema', 'tf_cli']);
      expect(rest.code, rest.err).toBe(0);
      expect(await schemasOf('cleanup_snapshots')).toEqual(['tf_cli']);
    });
  });

  describe('faults are one line', () => {
    it('an unreachable database and a bad URL: exit 1, one line', async () => {
      const url =
        fx.kind === 'postgres'
          ? 'postgres://postgres@127.0.0.1:1/nowhere'
          : `sqlite:${join(dir, 'no-such-dir', 'x.db')}`;
      for (const command of ['migrate', 'status', 'plan']) {
        const result = await runCli([command, '--db', url]);
        expect(result.code).toBe(1);
        expectOneLine(result);
      }
      const bad = await runCli(['status', '--db', 'mysql://localhost/x']);
      expect(bad.code).toBe(1);
      expectOneLine(bad);
    });
  });
}
