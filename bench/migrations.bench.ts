import { execFileSync } from 'node:child_process';
import { copyFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import Database from 'better-sqlite3';
import pg from 'pg';
import { openStore } from './lib/taskfence.js';
import { BenchDatabases, databaseName } from './lib/databases.js';
import { median, round } from './lib/stats.js';

const CHILD_MIGRATE = fileURLToPath(new URL('./children/migrate.mjs', import.meta.url));
const CHILD_RAW = fileURLToPath(new URL('./children/raw-backfill.mjs', import.meta.url));

interface ChildResult {
  ms: number;
  maxRssMB: number;
  flagged: number | null;
}

function runChild(script: string, ...args: string[]): ChildResult {
  return JSON.parse(
    execFileSync(process.execPath, [script, ...args], { encoding: 'utf8' })
      .trim()
      .split('\n')
      .at(-1)!,
  );
}

const ROLES = [
  'CTO',
  'Director of Sales',
  'Senior Engineer',
  'developer advocate',
  'DevOps',
  'SRE lead',
  'CFO',
  'Head of People',
  'Designer',
  null,
];

/** Time from an empty database to the latest version (median of `runs`, in a child process each). */
export async function benchEmptyToLatest(dbs: BenchDatabases, runs: number) {
  const sqlite: number[] = [];
  const postgres: number[] = [];
  for (let r = 0; r < runs; r++) {
    sqlite.push(runChild(CHILD_MIGRATE, `sqlite:${dbs.sqliteFile()}`).ms);
    postgres.push(runChild(CHILD_MIGRATE, await dbs.postgresUrl()).ms);
  }
  return { sqliteMs: round(median(sqlite), 1), postgresMs: round(median(postgres), 1) };
}

/** A database at version 0008 holding `tasks` tasks over 1,000 agents with assorted roles, some in flight with leases. */
async function seedSqlite(file: string, tasks: number) {
  const store = await openStore(`sqlite:${file}`);
  await store.migrate({ to: 8 });
  await store.close();
  const db = new Database(file);
  db.transaction(() => {
    db.prepare(`insert into companies (id, name, created_at) values ('c', 'c', 0)`).run();
    const agent = db.prepare(
      `insert into agents (id, company_id, name, role, department, created_at) values (?, 'c', ?, ?, ?, 0)`,
    );
    for (let a = 0; a < 1000; a++)
      agent.run(`a${a}`, `agent ${a}`, ROLES[a % ROLES.length], a % 7 === 0 ? 'engineering' : 'ops');
    const task = db.prepare(
      `insert into tasks (id, company_id, assignee_agent_id, title, status, created_at, updated_at) values (?, 'c', ?, 't', ?, 0, 0)`,
    );
    const statuses = ['todo', 'backlog', 'in_progress', 'done', 'dispatched', 'ready'];
    const lease = db.prepare(
      `insert into task_leases (task_id, holder, token, acquired_at, expires_at) values (?, 'w', 1, 0, ?)`,
    );
    for (let t = 0; t < tasks; t++) {
      const id = `t${String(t).padStart(8, '0')}`;
      const status = statuses[t % statuses.length]!;
      task.run(id, t % 11 === 0 ? null : `a${t % 1000}`, status);
      if ((status === 'in_progress' || status === 'dispatched') && t % 5 === 0) lease.run(id, t % 10 === 0 ? 9e15 : 1);
    }
  })();
  db.pragma('wal_checkpoint(TRUNCATE)');
  db.close();
}

export async function seedPostgres(url: string, tasks: number) {
  const store = await openStore(url);
  await store.migrate({ to: 8 });
  await store.close();
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  await client.query(`insert into companies (id, name, created_at) values ('c', 'c', 0)`);
  await client.query(
    `insert into agents (id, company_id, name, role, department, created_at)
     select 'a' || g, 'c', 'agent ' || g, (array[${ROLES.map((r) => (r === null ? 'null' : `'${r}'`)).join(', ')}])[g % ${ROLES.length} + 1],
            case when g % 7 = 0 then 'engineering' else 'ops' end, 0
     from generate_series(0, 999) g`,
  );
  await client.query(
    `insert into tasks (id, company_id, assignee_agent_id, title, status, created_at, updated_at)
     select 't' || lpad(g::text, 8, '0'), 'c', case when g % 11 = 0 then null else 'a' || (g % 1000) end, 't',
            (array['todo', 'backlog', 'in_progress', 'done', 'dispatched', 'ready'])[g % 6 + 1], 0, 0
     from generate_series(0, ${tasks - 1}) g`,
  );
  await client.query(
    `insert into task_leases (task_id, holder, token, acquired_at, expires_at)
     select id, 'w', 1, 0, case when substr(id, 2)::int % 10 = 0 then 9000000000000000 else 1 end
     from tasks where status in ('in_progress', 'dispatched') and substr(id, 2)::int % 5 = 0`,
  );
  await client.query('vacuum analyze');
  await client.end();
}

/**
 * The 0052 backfill on `tasks` tasks through taskfence (batched, in a child process) against a
 * single raw UPDATE of the same rows, on identical copies of one seeded database. Both must flag
 * the same number of tasks.
 */
export async function benchBackfill(dbs: BenchDatabases, tasks: number, runs: number) {
  const result: Record<string, unknown> = {};
  // SQLite: one seeded file, copied per run.
  const seed = dbs.sqliteFile();
  await seedSqlite(seed, tasks);
  const sqliteRuns = { taskfence: [] as ChildResult[], raw: [] as ChildResult[] };
  for (let r = 0; r < runs; r++) {
    const a = dbs.sqliteFile();
    const b = dbs.sqliteFile();
    copyFileSync(seed, a);
    copyFileSync(seed, b);
    sqliteRuns.taskfence.push(runChild(CHILD_MIGRATE, `sqlite:${a}`, '52'));
    sqliteRuns.raw.push(runChild(CHILD_RAW, `sqlite:${b}`));
  }
  result.sqlite = summarize(sqliteRuns);
  // PostgreSQL: one seeded database, cloned as a template per run.
  const seedUrl = await dbs.postgresUrl();
  await seedPostgres(seedUrl, tasks);
  const pgRuns = { taskfence: [] as ChildResult[], raw: [] as ChildResult[] };
  for (let r = 0; r < runs; r++) {
    const a = await dbs.postgresUrl(databaseName(seedUrl));
    const b = await dbs.postgresUrl(databaseName(seedUrl));
    pgRuns.taskfence.push(runChild(CHILD_MIGRATE, a, '52'));
    pgRuns.raw.push(runChild(CHILD_RAW, b));
  }
  result.postgres = summarize(pgRuns);
  return { tasks, ...result };
}

function summarize(runs: { taskfence: ChildResult[]; raw: ChildResult[] }) {
  const flagged = new Set([...runs.taskfence, ...runs.raw].map((r) => r.flagged));
  if (flagged.size !== 1)
    throw new Error(`taskfence and the raw UPDATE flagged different rows: ${[...flagged].join(' vs ')}`);
  const tfMs = median(runs.taskfence.map((r) => r.ms));
  const rawMs = median(runs.raw.map((r) => r.ms));
  return {
    flagged: [...flagged][0],
    taskfenceMs: round(tfMs, 0),
    rawMs: round(rawMs, 0),
    ratioTaskfenceToRaw: round(tfMs / rawMs),
    taskfencePeakRssMB: round(Math.max(...runs.taskfence.map((r) => r.maxRssMB)), 0),
    rawPeakRssMB: round(Math.max(...runs.raw.map((r) => r.maxRssMB)), 0),
  };
}
