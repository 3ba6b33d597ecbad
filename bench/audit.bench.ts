/**
 * `npm run bench:audit`: what the audit trail would cost on the hot path. The same lease cycle
 * (claimWorkspaceLock + releaseWorkspaceLock, the overhead benchmark's operation) three ways, on
 * one connection, sequential, on both dialects:
 * - `plain`: the repository calls as callers make them (each its own write transaction);
 * - `in transaction`: each call inside `store.transaction` (how an audited act is written);
 * - `audited`: the same, plus an `audit_events` row in each transaction (grant and release),
 *   written by the trail's one writer (`recordAuditEvent`), as the operator actions do.
 * Runs alternate (plain, in transaction, audited, repeat) so drift hits all three; figures are
 * medians. The trail's cost is `audited` against `in transaction`: one insert (and its two
 * indexes) more per transaction. Prints a Markdown table and writes bench/results/audit.md.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { randomUUID } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { openStore, type Store } from '../src/index.js';
import { recordAuditEvent } from '../src/repositories/shared/audit.js';
import { BenchDatabases } from './lib/databases.js';
import { describeMachine } from './lib/machine.js';
import { measure, median, round, type Figures } from './lib/stats.js';
import { seedFixture } from './ops.js';

const quick = process.argv.includes('--quick');
const adminUrl = process.env.BENCH_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const ITERATIONS = quick ? 100 : 300;
const RUNS = quick ? 1 : 9;

type Variant = 'plain' | 'in transaction' | 'audited';
const VARIANTS: readonly Variant[] = ['plain', 'in transaction', 'audited'];

function cycle(store: Store, workspaceId: string, variant: Variant): () => Promise<void> {
  const claimInput = { holder: 'bench', runId: 'run', ttlMs: 60_000 };
  if (variant === 'plain')
    return async () => {
      const claim = await store.locks.claimWorkspaceLock(workspaceId, claimInput);
      if (claim.status !== 'acquired') throw new Error('lock busy');
      await store.locks.releaseWorkspaceLock(claim.lease);
    };
  const audited = variant === 'audited';
  return async () => {
    const lease = await store.transaction(async (tx) => {
      const claim = await tx.locks.claimWorkspaceLock(workspaceId, claimInput);
      if (claim.status !== 'acquired') throw new Error('lock busy');
      if (audited)
        await recordAuditEvent(tx.db, {
          id: randomUUID(),
          at: Date.now(),
          actor: 'bench',
          action: 'lease.granted',
          subjectKind: 'workspace_lock',
          subjectId: workspaceId,
          token: claim.lease.token,
          detail: { runId: 'run' },
        });
      return claim.lease;
    });
    await store.transaction(async (tx) => {
      await tx.locks.releaseWorkspaceLock(lease);
      if (audited)
        await recordAuditEvent(tx.db, {
          id: randomUUID(),
          at: Date.now(),
          actor: 'bench',
          action: 'lease.released',
          subjectKind: 'workspace_lock',
          subjectId: workspaceId,
          token: lease.token,
        });
    });
  };
}

interface Row {
  dialect: 'sqlite' | 'postgres';
  figures: Record<Variant, Figures>;
}

async function main() {
  const dbs = new BenchDatabases(adminUrl);
  const machine = await describeMachine(adminUrl);
  const rows: Row[] = [];
  try {
    for (const dialect of ['sqlite', 'postgres'] as const) {
      const url = dialect === 'sqlite' ? `sqlite:${dbs.sqliteFile()}` : await dbs.postgresUrl();
      const store = await openStore({ url, poolSize: 1 });
      try {
        await store.migrate();
        const fx = await seedFixture(store, 'a', 0);
        const runs: Record<Variant, Figures[]> = { plain: [], 'in transaction': [], audited: [] };
        for (let r = 0; r < RUNS; r++)
          for (const variant of VARIANTS)
            runs[variant].push(await measure(cycle(store, fx.lockWorkspaceId, variant), ITERATIONS));
        const pick = (of: Figures[]): Figures => ({
          opsPerSec: round(median(of.map((f) => f.opsPerSec)), 0),
          p50Ms: round(median(of.map((f) => f.p50Ms)), 3),
          p99Ms: round(median(of.map((f) => f.p99Ms)), 3),
          samples: of.reduce((n, f) => n + f.samples, 0),
        });
        const row: Row = {
          dialect,
          figures: {
            plain: pick(runs.plain),
            'in transaction': pick(runs['in transaction']),
            audited: pick(runs.audited),
          },
        };
        rows.push(row);
        console.log(
          `  audit ${dialect}: ${VARIANTS.map((v) => `${v} ${row.figures[v].opsPerSec}`).join(', ')} cycles/s`,
        );
      } finally {
        await store.close();
      }
    }
  } finally {
    await dbs.dropAll();
  }
  const table = [
    `Measured ${new Date().toISOString().slice(0, 10)} on ${machine.cpus} cores, node ${machine.node}, SQLite ${machine.sqlite}, PostgreSQL ${machine.postgres}; ${RUNS} alternating runs of ${ITERATIONS} cycles, medians.`,
    '',
    '| dialect | plain cycles/s | in transaction cycles/s | audited cycles/s | audited / in transaction | audited / plain | audited p50 / p99 ms |',
    '|---|---|---|---|---|---|---|',
    ...rows.map((r) => {
      const f = r.figures;
      return `| ${r.dialect} | ${f.plain.opsPerSec} | ${f['in transaction'].opsPerSec} | ${f.audited.opsPerSec} | ${round(f.audited.opsPerSec / f['in transaction'].opsPerSec)} | ${round(f.audited.opsPerSec / f.plain.opsPerSec)} | ${f.audited.p50Ms} / ${f.audited.p99Ms} |`;
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
