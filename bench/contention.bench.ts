import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { openStore } from './lib/taskfence.js';
import type { BenchDatabases } from './lib/databases.js';
import { median, percentile, round } from './lib/stats.js';
import { seedFixture } from './ops.js';

const run = promisify(execFile);
const CHILD = fileURLToPath(new URL('./children/contend.mjs', import.meta.url));
export const CONTENTION_OPS = ['startRun', 'lockCycle', 'pathCycle', 'transfer', 'deliver'] as const;

export interface ContentionRow {
  dialect: 'sqlite' | 'postgres';
  op: (typeof CONTENTION_OPS)[number];
  workers: number;
  opsPerSec: number;
  p99Ms: number;
  retries: number;
  errors: number;
  /** The first failed call's message, when `errors` > 0. */
  firstError: string | null;
}

/**
 * The operations from N processes at once (each its own connection, its own keys), released at
 * one wall-clock instant: total throughput, p99, how many write transactions were retried
 * (SQLITE_BUSY, serialization, deadlock) and how many errors reached the caller (must be 0).
 */
export async function benchContention(
  dbs: BenchDatabases,
  options: {
    iterations: Record<'sqlite' | 'postgres', number>;
    workers: Record<'sqlite' | 'postgres', number[]>;
    runs: number;
  },
) {
  const rows: ContentionRow[] = [];
  for (const dialect of ['sqlite', 'postgres'] as const) {
    const maxWorkers = Math.max(...options.workers[dialect]);
    const iterations = options.iterations[dialect];
    for (const op of CONTENTION_OPS) {
      for (const workers of options.workers[dialect]) {
        const samples: ContentionRow[] = [];
        for (let r = 0; r < options.runs; r++) {
          const url = dialect === 'sqlite' ? `sqlite:${dbs.sqliteFile()}` : await dbs.postgresUrl();
          const store = await openStore(url);
          await store.migrate();
          await store.org.createCompany({ id: 'c-shared', name: 'shared' });
          await store.org.createWorkspace({ id: 'w-path-shared', companyId: 'c-shared', name: 'paths' });
          for (let w = 0; w < Math.min(workers, maxWorkers); w++)
            await seedFixture(store, `w${w}`, op === 'deliver' ? iterations + 10 : 0);
          await store.close();
          const startAt = Date.now() + 1500 + workers * 300;
          const outputs = await Promise.all(
            Array.from({ length: workers }, (_, worker) =>
              run(process.execPath, [CHILD, JSON.stringify({ url, op, worker, iterations, startAt })], {
                maxBuffer: 64 * 2 ** 20,
              }),
            ),
          );
          const results = outputs.map(
            (o) =>
              JSON.parse(o.stdout.trim().split('\n').at(-1)!) as {
                startedAt: number;
                endedAt: number;
                latencies: number[];
                errors: number;
                firstError: string | null;
                retries: number;
              },
          );
          const latencies = results.flatMap((x) => x.latencies).sort((a, b) => a - b);
          // From the first worker's real start (a worker that missed the start instant does not
          // stretch the window) to the last one's end.
          const elapsed = Math.max(...results.map((x) => x.endedAt)) - Math.min(...results.map((x) => x.startedAt));
          const late = results.filter((x) => x.startedAt - startAt > 50).length;
          if (late > 0)
            console.log(`  contention ${dialect} ${op} ×${workers}: ${late} workers started more than 50 ms late`);
          const errors = results.reduce((n, x) => n + x.errors, 0);
          if (errors > 0)
            console.log(
              `  contention ${dialect} ${op} ×${workers}: ${errors} errors, first: ${results.find((x) => x.firstError)?.firstError}`,
            );
          samples.push({
            dialect,
            op,
            workers,
            opsPerSec: (workers * iterations * 1000) / elapsed,
            p99Ms: percentile(latencies, 99),
            retries: results.reduce((n, x) => n + x.retries, 0),
            errors,
            firstError: results.find((x) => x.firstError)?.firstError ?? null,
          });
        }
        samples.sort((a, b) => a.opsPerSec - b.opsPerSec);
        const mid = samples[Math.floor(samples.length / 2)]!;
        const row = {
          ...mid,
          opsPerSec: round(mid.opsPerSec, 0),
          p99Ms: round(mid.p99Ms, 2),
          errors: samples.reduce((n, s) => n + s.errors, 0),
          firstError: samples.find((s) => s.firstError)?.firstError ?? null,
          retries: round(median(samples.map((s) => s.retries)), 0),
        };
        rows.push(row);
        console.log(
          `  contention ${dialect} ${op} ×${workers}: ${row.opsPerSec} ops/s, p99 ${row.p99Ms} ms, ${row.retries} retries, ${row.errors} errors`,
        );
      }
    }
  }
  return rows;
}

export function contentionTable(rows: readonly ContentionRow[]): string {
  const byKey = new Map<string, ContentionRow[]>();
  for (const r of rows) {
    const key = `${r.dialect}|${r.op}`;
    byKey.set(key, [...(byKey.get(key) ?? []), r]);
  }
  const lines = [
    '| dialect | operation | workers: ops/s (p99 ms, retries) | errors | N-worker / 1-worker throughput |',
    '|---|---|---|---|---|',
  ];
  for (const [key, group] of byKey) {
    const [dialect, op] = key.split('|');
    const one = group.find((g) => g.workers === 1);
    const most = group.at(-1)!;
    const errors = group.reduce((n, g) => n + g.errors, 0);
    // A failed call ends early, so a case with failures measured something else: no ratio for it.
    const scaling =
      errors > 0
        ? 'not measured: calls failed'
        : one
          ? `${most.workers}: ${round(most.opsPerSec / one.opsPerSec)}`
          : 'no 1-worker case';
    lines.push(
      `| ${dialect} | ${op} | ${group.map((g) => `${g.workers}: ${g.opsPerSec} (${g.p99Ms}, ${g.retries})`).join('; ')} | ${errors} | ${scaling} |`,
    );
  }
  return lines.join('\n');
}
