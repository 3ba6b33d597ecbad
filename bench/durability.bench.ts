/**
 * SQLite's durability setting, measured: the same write transactions (claim then release of a
 * workspace lock, each its own write transaction) on two files of one disk, one store with
 * `durability: 'full'` (synchronous = FULL), one with `'normal'`; runs alternate so drift hits
 * both; the figures are medians. Run once with `npx tsx bench/durability.bench.ts [dir]` (dir on
 * the disk in question, default the OS temp dir); README (Failure model) quotes the ratio.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Store } from '../src/index.js';
import { openStore } from './lib/taskfence.js';
import { median, round } from './lib/stats.js';

const ITERATIONS = 500;
const RUNS = 5;

async function prepare(file: string, durability: 'full' | 'normal'): Promise<{ store: Store; ws: string }> {
  const store = await openStore({ url: `sqlite:${file}`, durability });
  await store.migrate();
  const company = (await store.org.createCompany({ name: 'bench' })).id;
  const ws = (await store.org.createWorkspace({ companyId: company, name: 'ws' })).id;
  return { store, ws };
}

async function cycles({ store, ws }: { store: Store; ws: string }): Promise<number> {
  const started = performance.now();
  for (let i = 0; i < ITERATIONS; i++) {
    const claim = await store.locks.claimWorkspaceLock(ws, { holder: 'h', runId: 'r', ttlMs: 60_000 });
    if (claim.status !== 'acquired') throw new Error('the bench lock was busy');
    await store.locks.releaseWorkspaceLock(claim.lease);
  }
  // Two write transactions per cycle.
  return (2 * ITERATIONS) / ((performance.now() - started) / 1000);
}

const dir = mkdtempSync(join(process.argv[2] ?? tmpdir(), 'taskfence-durability-'));
try {
  const full = await prepare(join(dir, 'full.db'), 'full');
  const normal = await prepare(join(dir, 'normal.db'), 'normal');
  const figures = { full: [] as number[], normal: [] as number[] };
  for (let r = 0; r < RUNS; r++) {
    figures.full.push(await cycles(full));
    figures.normal.push(await cycles(normal));
  }
  const f = median(figures.full);
  const n = median(figures.normal);
  console.log(
    JSON.stringify({
      writeTransactionsPerSec: { full: round(f, 0), normal: round(n, 0) },
      fullOverNormal: round(f / n, 2),
      perCommitMs: { full: round(1000 / f, 3), normal: round(1000 / n, 3) },
      iterations: ITERATIONS,
      runs: RUNS,
      dir,
    }),
  );
  await full.store.close();
  await normal.store.close();
} finally {
  rmSync(dir, { recursive: true, force: true });
}
