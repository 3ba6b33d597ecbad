/**
 * The deploy scenario of issue 25, shared by `npm run bench:deploy` (1,000,000 tasks, figures)
 * and test/suites/deploy.suite.ts (a smaller count, correctness only): a database at 0008 with
 * `tasks` tasks; a writer of the previous release (it knows only the 0008 columns) inserts a task
 * and updates one every `intervalMs`, on its own connection, while `taskfence migrate` runs in a
 * child process and brings the database to the latest version. Every write's latency is recorded.
 */
import { spawn } from 'node:child_process';
import Database from 'better-sqlite3';
import pg from 'pg';
import { openStore } from '../../src/index.js';

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
const STATUSES = ['todo', 'backlog', 'in_progress', 'done', 'dispatched', 'ready'];

/** `?schema=` of a PostgreSQL URL, if any (raw SQL below then runs with that search_path). */
function schemaOfUrl(url: string): string | undefined {
  return new URL(url).searchParams.get('schema') ?? undefined;
}

async function pgClient(url: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  const schema = schemaOfUrl(url);
  if (schema !== undefined) await client.query(`select set_config('search_path', $1, false)`, [schema]);
  return client;
}

/** A database at 0008 holding `tasks` tasks over 1,000 agents with assorted roles, some in flight with leases. */
export async function seedAt0008(url: string, tasks: number): Promise<void> {
  const store = await openStore(url);
  await store.migrate({ to: 8 });
  await store.close();
  if (url.startsWith('sqlite:')) {
    const db = new Database(url.slice('sqlite:'.length));
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
      const lease = db.prepare(
        `insert into task_leases (task_id, holder, token, acquired_at, expires_at) values (?, 'w', 1, 0, ?)`,
      );
      for (let t = 0; t < tasks; t++) {
        const id = `t${String(t).padStart(8, '0')}`;
        const status = STATUSES[t % STATUSES.length]!;
        task.run(id, t % 11 === 0 ? null : `a${t % 1000}`, status);
        if ((status === 'in_progress' || status === 'dispatched') && t % 5 === 0)
          lease.run(id, t % 10 === 0 ? 9e15 : 1);
      }
    })();
    db.pragma('wal_checkpoint(TRUNCATE)');
    db.close();
    return;
  }
  const client = await pgClient(url);
  try {
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
  } finally {
    await client.end();
  }
}

/** The previous release's two writes, on its own connection. */
interface OldReleaseWriter {
  insert(id: string): Promise<void>;
  update(id: string, title: string): Promise<void>;
  close(): Promise<void>;
}

async function openWriter(url: string): Promise<OldReleaseWriter> {
  if (url.startsWith('sqlite:')) {
    const db = new Database(url.slice('sqlite:'.length));
    db.pragma('busy_timeout = 30000');
    const insert = db.prepare(
      `insert into tasks (id, company_id, assignee_agent_id, title, status, created_at, updated_at) values (?, 'c', null, 'new', 'todo', 1, 1)`,
    );
    const update = db.prepare(`update tasks set title = ?, updated_at = 2 where id = ?`);
    return {
      insert: async (id) => void insert.run(id),
      update: async (id, title) => void update.run(title, id),
      close: async () => void db.close(),
    };
  }
  const client = await pgClient(url);
  return {
    insert: async (id) =>
      void (await client.query(
        `insert into tasks (id, company_id, assignee_agent_id, title, status, created_at, updated_at) values ($1, 'c', null, 'new', 'todo', 1, 1)`,
        [id],
      )),
    update: async (id, title) =>
      void (await client.query(`update tasks set title = $1, updated_at = 2 where id = $2`, [title, id])),
    close: () => client.end(),
  };
}

export interface DeployRun {
  /** Wall time of the migrate child, ms. */
  readonly migrateMs: number;
  readonly exitCode: number | null;
  readonly stderr: string;
  /** Every write's latency (an insert or an update), ms. */
  readonly latencies: readonly number[];
  /** When each write of `latencies` started (epoch ms, as the CLI's JSON events' `at`). */
  readonly startedAt: readonly number[];
  /** Ids the writer inserted, each acknowledged. */
  readonly inserted: readonly string[];
  /** When each insert was acknowledged (epoch ms, as the CLI's JSON events' `at`). */
  readonly insertedAt: readonly number[];
  /** The last acknowledged title per updated seeded task. */
  readonly updated: ReadonlyMap<string, string>;
  /** The migrate child's JSON events. */
  readonly events: readonly Record<string, unknown>[];
}

/**
 * Runs `migrateArgv` (a `taskfence migrate --db URL --json` command line: the built CLI or the
 * sources through tsx) while the previous release writes every `intervalMs`, and returns what
 * both did. `seeded` is how many tasks the seed made (the writer updates those).
 */
export async function runDeploy(
  url: string,
  options: { readonly migrateArgv: readonly string[]; readonly seeded: number; readonly intervalMs?: number },
): Promise<DeployRun> {
  const intervalMs = options.intervalMs ?? 10;
  const writer = await openWriter(url);
  const latencies: number[] = [];
  const startedAt: number[] = [];
  const inserted: string[] = [];
  const insertedAt: number[] = [];
  const updated = new Map<string, string>();
  let running = true;
  let n = 0;
  const writing = (async () => {
    let next = performance.now();
    while (running) {
      const id = `w${String(n).padStart(8, '0')}`;
      let t = performance.now();
      startedAt.push(Date.now());
      await writer.insert(id);
      latencies.push(performance.now() - t);
      inserted.push(id);
      insertedAt.push(Date.now());
      const target = `t${String((n * 7919) % options.seeded).padStart(8, '0')}`;
      const title = `v${n}`;
      t = performance.now();
      startedAt.push(Date.now());
      await writer.update(target, title);
      latencies.push(performance.now() - t);
      updated.set(target, title);
      n++;
      next += intervalMs;
      const wait = next - performance.now();
      if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
      else next = performance.now();
    }
  })();
  // Let the writer run alone for a moment, so its figures include the time before migrate too.
  await new Promise((resolve) => setTimeout(resolve, 200));
  const started = performance.now();
  const [command, ...args] = options.migrateArgv;
  const child = spawn(command!, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const exitCode = await new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  const migrateMs = performance.now() - started;
  await new Promise((resolve) => setTimeout(resolve, 200));
  running = false;
  await writing;
  await writer.close();
  const events = stdout
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as Record<string, unknown>);
  return { migrateMs, exitCode, stderr, latencies, startedAt, inserted, insertedAt, updated, events };
}

/** The `p`-th percentile (0–100) of `values`, nearest rank. */
export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return 0;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))]!;
}

/**
 * The `count` worst stalls, each with what the migrator had last reported when the write started
 * (its latest JSON event: `applying`, a step's or a backfill's `progress`, …), so a stall can be
 * traced to the statement that caused it.
 */
export function worstStalls(run: DeployRun, count = 5): { ms: number; during: string }[] {
  const order = run.latencies.map((ms, i) => ({ ms, at: run.startedAt[i]! })).sort((a, b) => b.ms - a.ms);
  const timed = run.events.filter((e) => typeof e['at'] === 'number') as (Record<string, unknown> & { at: number })[];
  return order.slice(0, count).map(({ ms, at }) => {
    const last = timed.filter((e) => e.at <= at).at(-1);
    const during = last
      ? [last['type'], last['version'], last['message'] ?? last['name']]
          .filter((x): x is string | number => typeof x === 'string' || typeof x === 'number')
          .join(' ')
      : 'before the first event';
    return { ms: Math.round(ms * 10) / 10, during };
  });
}
