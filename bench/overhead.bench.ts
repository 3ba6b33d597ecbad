import { openStore } from './lib/taskfence.js';
import type { BenchDatabases } from './lib/databases.js';
import { openRawPostgres, openRawSqlite, type RawClient } from './lib/raw.js';
import { measure, median, round, type Figures } from './lib/stats.js';
import { OPS, seedFixture } from './ops.js';

export interface OverheadRow {
  op: string;
  dialect: 'sqlite' | 'postgres';
  taskfence: Figures;
  raw: Figures;
  /** taskfence throughput / raw throughput (target ≥ 0.9, issue 24). */
  ratio: number;
}

/**
 * Each operation through taskfence and through its raw baseline, on two copies of the same
 * fixture, alternating taskfence and raw runs so drift hits both; the figures are medians.
 */
export async function benchOverhead(
  dbs: BenchDatabases,
  options: { iterations: number; runs: number },
): Promise<OverheadRow[]> {
  const rows: OverheadRow[] = [];
  // Two ops consume one message per iteration (deliver, and receive → ack).
  const messages = 2 * (options.runs * Math.ceil(options.iterations * 1.1) + 100);
  for (const dialect of ['sqlite', 'postgres'] as const) {
    const tfUrl = dialect === 'sqlite' ? `sqlite:${dbs.sqliteFile()}` : await dbs.postgresUrl();
    const rawFile = dialect === 'sqlite' ? dbs.sqliteFile() : null;
    const rawUrl = rawFile ? `sqlite:${rawFile}` : await dbs.postgresUrl();
    const store = await openStore({ url: tfUrl, poolSize: 1 });
    await store.migrate();
    const fx = await seedFixture(store, 'o', messages);
    const seeder = await openStore(rawUrl);
    await seeder.migrate();
    await seedFixture(seeder, 'o', messages);
    await seeder.close();
    const raw: RawClient = rawFile ? openRawSqlite(rawFile) : await openRawPostgres(rawUrl);
    try {
      for (const op of OPS) {
        const tf = op.taskfence(store, fx);
        const baseline = op.raw(raw, fx);
        const tfRuns: Figures[] = [];
        const rawRuns: Figures[] = [];
        for (let r = 0; r < options.runs; r++) {
          tfRuns.push(await measure(tf, options.iterations));
          rawRuns.push(await measure(baseline, options.iterations));
        }
        const pick = (runs: Figures[]): Figures => ({
          opsPerSec: round(median(runs.map((f) => f.opsPerSec)), 0),
          p50Ms: round(median(runs.map((f) => f.p50Ms)), 3),
          p99Ms: round(median(runs.map((f) => f.p99Ms)), 3),
          samples: runs.reduce((n, f) => n + f.samples, 0),
        });
        const row: OverheadRow = { op: op.name, dialect, taskfence: pick(tfRuns), raw: pick(rawRuns), ratio: 0 };
        row.ratio = round(row.taskfence.opsPerSec / row.raw.opsPerSec);
        rows.push(row);
        console.log(
          `  overhead ${dialect} ${op.name}: ${row.taskfence.opsPerSec} vs ${row.raw.opsPerSec} ops/s (ratio ${row.ratio})`,
        );
      }
    } finally {
      await raw.close();
      await store.close();
    }
  }
  return rows;
}

export function overheadTable(rows: readonly OverheadRow[]): string {
  return [
    '| operation | dialect | taskfence ops/s | raw ops/s | ratio (target ≥ 0.9) | taskfence p50 / p99 ms | raw p50 / p99 ms |',
    '|---|---|---|---|---|---|---|',
    ...rows.map(
      (r) =>
        `| ${r.op} | ${r.dialect} | ${r.taskfence.opsPerSec} | ${r.raw.opsPerSec} | ${r.ratio} | ${r.taskfence.p50Ms} / ${r.taskfence.p99Ms} | ${r.raw.p50Ms} / ${r.raw.p99Ms} |`,
    ),
  ].join('\n');
}
