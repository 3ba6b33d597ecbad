/**
 * `npm run bench:audit`: what the audit trail of lease acts costs on the hot path. The overhead
 * benchmark's lease cycle (claimWorkspaceLock + releaseWorkspaceLock), on one connection,
 * sequential, on both dialects, through three stores open on the same database that differ only
 * in `audit.leases`:
 * - `off`: no row;
 * - `grants` (the default): a row per grant, and the read of the lock row before the claim that
 *   names the holder a takeover supersedes;
 * - `all`: also a row per release.
 * Short runs alternate (off, grants, all, repeat) so drift on a loaded machine hits all three;
 * each ratio is the median over rounds of that round's ratio, and throughputs are medians. Prints a Markdown table and writes bench/results/audit.md.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type { Store } from '../src/index.js';
import { openStore } from './lib/taskfence.js';
import { BenchDatabases } from './lib/databases.js';
import { describeMachine } from './lib/machine.js';
import { measure, median, round, type Figures } from './lib/stats.js';
import { seedFixture } from './ops.js';

const quick = process.argv.includes('--quick');
const adminUrl = process.env.BENCH_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const ITERATIONS = quick ? 50 : 100;
const RUNS = quick ? 3 : 31;

type Variant = 'off' | 'grants' | 'all';
const VARIANTS: readonly Variant[] = ['off', 'grants', 'all'];

function cycle(store: Store, workspaceId: string): () => Promise<void> {
  const claimInput = { holder: 'bench', runId: 'run', ttlMs: 60_000 };
  return async () => {
    const claim = await store.locks.claimWorkspaceLock(workspaceId, claimInput);
    if (claim.status !== 'acquired') throw new Error('lock busy');
    await store.locks.releaseWorkspaceLock(claim.lease);
  };
}

interface Row {
  dialect: 'sqlite' | 'postgres';
  figures: Record<Variant, Figures>;
  /** Median over rounds of the round's cycles/s against `off`'s. */
  ratios: { grants: number; all: number };
}

async function main() {
  const dbs = new BenchDatabases(adminUrl);
  const machine = await describeMachine(adminUrl);
  const rows: Row[] = [];
  try {
    for (const dialect of ['sqlite', 'postgres'] as const) {
      const url = dialect === 'sqlite' ? `sqlite:${dbs.sqliteFile()}` : await dbs.postgresUrl();
      const stores = {} as Record<Variant, Store>;
      try {
        for (const variant of VARIANTS)
          stores[variant] = await openStore({ url, poolSize: 1, connectTimeoutMs: 60_000, audit: { leases: variant } });
        // Migrated and seeded on a store of its own: 0052's concurrent steps need a second connection.
        const setup = await openStore({ url, connectTimeoutMs: 60_000 });
        const fx = await setup
          .migrate()
          .then(() => seedFixture(setup, 'a', 0))
          .finally(() => setup.close());
        const runs: Record<Variant, Figures[]> = { off: [], grants: [], all: [] };
        // One untimed warm-up round per store (prepared statements, connections).
        for (const variant of VARIANTS) await measure(cycle(stores[variant], fx.lockWorkspaceId), 50);
        for (let r = 0; r < RUNS; r++)
          for (const variant of VARIANTS)
            runs[variant].push(await measure(cycle(stores[variant], fx.lockWorkspaceId), ITERATIONS));
        const pick = (of: Figures[]): Figures => ({
          opsPerSec: round(median(of.map((f) => f.opsPerSec)), 0),
          p50Ms: round(median(of.map((f) => f.p50Ms)), 3),
          p99Ms: round(median(of.map((f) => f.p99Ms)), 3),
          samples: of.reduce((n, f) => n + f.samples, 0),
        });
        const ratioOf = (v: Variant) => round(median(runs[v].map((f, i) => f.opsPerSec / runs.off[i]!.opsPerSec)), 3);
        const row: Row = {
          dialect,
          figures: { off: pick(runs.off), grants: pick(runs.grants), all: pick(runs.all) },
          ratios: { grants: ratioOf('grants'), all: ratioOf('all') },
        };
        rows.push(row);
        console.log(
          `  audit ${dialect}: ${VARIANTS.map((v) => `${v} ${row.figures[v].opsPerSec}`).join(', ')} cycles/s; grants/off ${row.ratios.grants}, all/off ${row.ratios.all}`,
        );
      } finally {
        await Promise.allSettled(Object.values(stores).map((s) => s.close()));
      }
    }
  } finally {
    await dbs.dropAll();
  }
  const table = [
    `Measured ${new Date().toISOString().slice(0, 10)} on ${machine.cpus} cores, node ${machine.node}, SQLite ${machine.sqlite}, PostgreSQL ${machine.postgres}; ${RUNS} alternating runs of ${ITERATIONS} cycles, medians.`,
    '',
    '| dialect | off cycles/s | grants cycles/s | all cycles/s | grants / off | all / off | off p50 ms | grants p50 ms | all p50 ms |',
    '|---|---|---|---|---|---|---|---|---|',
    ...rows.map((r) => {
      const f = r.figures;
      return `| ${r.dialect} | ${f.off.opsPerSec} | ${f.grants.opsPerSec} | ${f.all.opsPerSec} | ${r.ratios.grants} | ${r.ratios.all} | ${f.off.p50Ms} | ${f.grants.p50Ms} | ${f.all.p50Ms} |`;
    }),
  ].join('\n');
  console.log(`\n${table}`);
  if (!quick) {
    const dir = fileURLToPath(new URL('./results/', import.meta.url));
    mkdirSync(dir, { recursive: true });
    writeFileSync(`${dir}audit.md`, `${table}\n`);
  }
}

await main();
