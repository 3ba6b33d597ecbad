// Child process: the raw-driver baseline for the 0052 backfill — the same column and the same
// rows, set by one UPDATE in one transaction (roles matched in JS once per distinct role, as
// SQLite has no regex operator).
import Database from 'better-sqlite3';
import pg from 'pg';

const PATTERN = /cto|engineer|developer|devops|sre/i;
const [url] = process.argv.slice(2);
const now = Date.now();
const update = (roleList, p) => `
  update tasks set requires_filesystem = 1 where
    (status in ('dispatched', 'in_progress') and exists (select 1 from task_leases l
       where l.task_id = tasks.id and l.holder is not null and l.expires_at > ${p(0)}))
    or (status in ('todo', 'backlog') and exists (select 1 from agents a
       where a.id = tasks.assignee_agent_id and (a.role in (${roleList}) or a.department = 'engineering')))`;
const t0 = performance.now();
let flagged;
if (url.startsWith('sqlite:')) {
  const db = new Database(url.slice('sqlite:'.length));
  const roles = db
    .prepare('select distinct role from agents where role is not null')
    .all()
    .map((r) => r.role)
    .filter((r) => PATTERN.test(r));
  db.transaction(() => {
    db.exec(
      'alter table tasks add column requires_filesystem integer default 0 not null check (requires_filesystem in (0, 1))',
    );
    db.prepare(update(roles.map(() => '?').join(', ') || 'null', () => '?')).run(now, ...roles);
  }).immediate();
  flagged = db.prepare('select count(*) as n from tasks where requires_filesystem = 1').get().n;
  db.close();
} else {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  const roles = (await client.query('select distinct role from agents where role is not null')).rows
    .map((r) => r.role)
    .filter((r) => PATTERN.test(r));
  await client.query('begin');
  await client.query(
    'alter table tasks add column requires_filesystem integer default 0 not null check (requires_filesystem in (0, 1))',
  );
  await client.query(
    update(roles.map((_, i) => `$${i + 2}`).join(', ') || 'null', () => '$1'),
    [now, ...roles],
  );
  await client.query('commit');
  flagged = Number((await client.query('select count(*) as n from tasks where requires_filesystem = 1')).rows[0].n);
  await client.end();
}
console.log(JSON.stringify({ ms: performance.now() - t0, maxRssMB: process.resourceUsage().maxRSS / 1024, flagged }));
