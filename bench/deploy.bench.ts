/**
 * `npm run bench:deploy [-- --tasks N] [-- --only sqlite|postgres]`: the deploy of issue 25. A
 * database at 0008 with N tasks (default 1,000,000) is brought to the latest version by the
 * built `taskfence migrate` (a child process) while a writer of the previous release inserts a
 * task and updates one every 10 ms on its own connection. Reports the writer's worst stall, p99
 * and p50 per write, and the migration's wall time, per dialect; writes
 * bench/results/<date>-deploy.{json,md}. Targets: worst stall < 250 ms on PostgreSQL, < 1 s on SQLite.
 */
import { writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { BenchDatabases } from './lib/databases.js';
import { percentile, runDeploy, seedAt0008, worstStalls } from './lib/deploy.js';

const CLI = fileURLToPath(new URL('../dist/cli.js', import.meta.url));
const adminUrl = process.env.BENCH_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const arg = (name: string) => {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : undefined;
};
const tasks = Number(arg('--tasks') ?? 1_000_000);
const only = arg('--only');
const batchSize = arg('--batch-size');

const dbs = new BenchDatabases(adminUrl);
const results: Record<string, unknown> = {};
try {
  for (const dialect of ['postgres', 'sqlite'] as const) {
    if (only && only !== dialect) continue;
    const url = dialect === 'sqlite' ? `sqlite:${dbs.sqliteFile()}` : await dbs.postgresUrl();
    const seedStarted = performance.now();
    await seedAt0008(url, tasks);
    const seedMs = performance.now() - seedStarted;
    const run = await runDeploy(url, {
      seeded: tasks,
      migrateArgv: [
        process.execPath,
        CLI,
        'migrate',
        '--db',
        url,
        '--json',
        ...(batchSize ? ['--batch-size', batchSize] : []),
      ],
    });
    if (run.exitCode !== 0) throw new Error(`migrate failed on ${dialect}: ${run.stderr}`);
    const retries = run.events.filter((e) => e.type === 'lock-retry').length;
    const result = {
      tasks,
      seedMs: Math.round(seedMs),
      migrateMs: Math.round(run.migrateMs),
      writes: run.latencies.length,
      worstStallMs: Math.round(Math.max(...run.latencies) * 10) / 10,
      p99Ms: Math.round(percentile(run.latencies, 99) * 10) / 10,
      p50Ms: Math.round(percentile(run.latencies, 50) * 100) / 100,
      lockRetries: retries,
      worstStalls: worstStalls(run),
    };
    results[dialect] = result;
    console.log(dialect, JSON.stringify(result));
  }
} finally {
  await dbs.dropAll();
}
const date = new Date().toISOString().slice(0, 10);
const base = fileURLToPath(new URL(`./results/${date}-deploy`, import.meta.url));
writeFileSync(`${base}.json`, JSON.stringify({ date, results }, null, 2) + '\n');
const rows = Object.entries(results).map(([dialect, r]) => {
  const x = r as {
    tasks: number;
    migrateMs: number;
    writes: number;
    worstStallMs: number;
    p99Ms: number;
    p50Ms: number;
    lockRetries: number;
  };
  return `| ${dialect} | ${x.tasks.toLocaleString('en')} | ${(x.migrateMs / 1000).toFixed(1)} s | ${x.writes} | ${x.worstStallMs} ms | ${x.p99Ms} ms | ${x.p50Ms} ms | ${x.lockRetries} |`;
});
writeFileSync(
  `${base}.md`,
  [
    `# Deploy benchmark, ${date}`,
    '',
    'A database at 0008 brought to the latest version by `taskfence migrate` while a writer of the previous release inserts and updates a task every 10 ms (`npm run bench:deploy`).',
    '',
    '| dialect | tasks | migrate | writes | worst stall | p99 | p50 | DDL lock retries |',
    '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
    ...rows,
    '',
  ].join('\n'),
);
console.log(`wrote ${base}.{json,md}`);
