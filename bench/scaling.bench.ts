import { sql } from 'kysely';
import type { Store } from '../src/index.js';
import { openStore } from './lib/taskfence.js';
import { encodePathLeaseKey } from '../src/domain/write-paths.js';
import type { BenchDatabases } from './lib/databases.js';
import { median, percentile, round } from './lib/stats.js';

export interface ScalingRow {
  dialect: 'sqlite' | 'postgres';
  liveLeases: number;
  p50Ms: number;
}

/** One measured case: how the workspace's filler rows look, and the call timed beside them. */
interface ScalingCase {
  readonly label: string;
  /** The filler lease `i` of the workspace. */
  filler(i: number, far: number): { holder: string; token: number | null };
  /** Runs once after each fill (the token row a grant continues from). */
  afterFill?(store: Store, workspaceId: string, held: number): Promise<void>;
  /** One iteration; returns the milliseconds that count. */
  timed(store: Store, workspaceId: string): Promise<number>;
}

/**
 * The p50 of `timed` beside 10, 1,000, 100,000 … filler leases in one workspace, per dialect:
 * the median over `runs` of each run's p50, the workspace grown between sizes.
 */
async function scalingRows(
  dbs: BenchDatabases,
  options: { sizes: number[]; iterations: number; runs: number },
  c: ScalingCase,
  workspaceId: string,
): Promise<ScalingRow[]> {
  const rows: ScalingRow[] = [];
  for (const dialect of ['sqlite', 'postgres'] as const) {
    const url = dialect === 'sqlite' ? `sqlite:${dbs.sqliteFile()}` : await dbs.postgresUrl();
    const store = await openStore({ url, poolSize: 1 });
    await store.migrate();
    await store.org.createCompany({ id: `c-${workspaceId}`, name: 'c' });
    await store.org.createWorkspace({ id: workspaceId, companyId: `c-${workspaceId}`, name: 'ws' });
    let held = 0;
    const far = Date.now() + 86_400_000;
    for (const size of [...options.sizes].sort((a, b) => a - b)) {
      while (held < size) {
        const batch = [];
        for (let i = held; i < Math.min(size, held + 1000); i++) {
          batch.push({
            workspace_id: workspaceId,
            lease_key: encodePathLeaseKey(`pkg${i % 500}/mod${i}/file.ts`),
            task_id: null,
            acquired_at: 0,
            expires_at: far,
            ...c.filler(i, far),
          });
        }
        await store.db.insertInto('path_leases').values(batch).execute();
        held = Math.min(size, held + 1000);
      }
      await c.afterFill?.(store, workspaceId, held);
      if (dialect === 'postgres') await sql`analyze path_leases`.execute(store.db);
      const medians: number[] = [];
      for (let r = 0; r < options.runs; r++) {
        const latencies: number[] = [];
        for (let i = -20; i < options.iterations; i++) {
          const t = await c.timed(store, workspaceId);
          if (i >= 0) latencies.push(t);
        }
        medians.push(
          percentile(
            latencies.sort((a, b) => a - b),
            50,
          ),
        );
      }
      const row = { dialect, liveLeases: size, p50Ms: round(median(medians), 3) };
      rows.push(row);
      console.log(`  ${c.label} ${dialect} ${size} leases: p50 ${row.p50Ms} ms`);
    }
    await store.close();
  }
  return rows;
}

/**
 * `tryAcquirePaths` p50 with 10, 1,000 and 100,000 live leases of other holders in the same
 * workspace: the conflict check looks up ancestors by equality and descendants by one key range,
 * so its cost should stay flat (target: ≤ 1.5× at 100,000 vs 10).
 */
export function benchPathScaling(dbs: BenchDatabases, options: { sizes: number[]; iterations: number; runs: number }) {
  return scalingRows(
    dbs,
    options,
    {
      label: 'path scaling',
      filler: (i) => ({ holder: `other-${i % 64}`, token: null }),
      async timed(store, workspaceId) {
        const t0 = performance.now();
        const result = await store.paths.tryAcquirePaths({
          workspaceId,
          holder: 'bench',
          paths: ['src/a', 'docs'],
          ttlMs: 60_000,
        });
        const t = performance.now() - t0;
        if (!result.acquired) throw new Error('unexpected conflict');
        await store.paths.releasePaths({ workspaceId, holder: 'bench' });
        return t;
      },
    },
    'ws',
  );
}

/**
 * `releasePaths(lease)` p50 beside 10, 1,000 and 100,000 live grants of the same holder in the
 * workspace (a coordinator that leases paths for all its tasks under one holder): the release
 * finds its grant's rows by workspace, holder and token (schema 0110's index), so its cost should
 * stay flat. Before 0110 it read every lease the holder had there.
 */
export function benchGrantRelease(dbs: BenchDatabases, options: { sizes: number[]; iterations: number; runs: number }) {
  return scalingRows(
    dbs,
    options,
    {
      label: 'grant release beside the holder’s',
      // One single-key grant each, as `tryAcquirePaths` would have made them.
      filler: (i) => ({ holder: 'coordinator', token: i + 1 }),
      async afterFill(store, workspaceId, held) {
        // Later grants take tokens above the filler's.
        await store.db.deleteFrom('path_lease_tokens').where('workspace_id', '=', workspaceId).execute();
        await store.db
          .insertInto('path_lease_tokens')
          .values({ workspace_id: workspaceId, token: held + 1_000_000, updated_at: 0 })
          .execute();
      },
      async timed(store, workspaceId) {
        const result = await store.paths.tryAcquirePaths({
          workspaceId,
          holder: 'coordinator',
          paths: ['src/a'],
          ttlMs: 60_000,
        });
        if (!result.acquired) throw new Error('unexpected conflict');
        const t0 = performance.now();
        await store.paths.releasePaths(result.lease);
        return performance.now() - t0;
      },
    },
    'ws-grants',
  );
}

export function scalingTable(rows: readonly ScalingRow[], leases = 'leases'): string {
  const sizes = [...new Set(rows.map((r) => r.liveLeases))];
  const lines = [
    `| dialect | ${sizes.map((s) => `p50 at ${s.toLocaleString('en')} ${leases} (ms)`).join(' | ')} | largest / smallest (target ≤ 1.5) |`,
    `|---|${sizes.map(() => '---|').join('')}---|`,
  ];
  for (const dialect of ['sqlite', 'postgres'] as const) {
    const mine = rows.filter((r) => r.dialect === dialect);
    lines.push(
      `| ${dialect} | ${mine.map((r) => r.p50Ms).join(' | ')} | ${round(mine.at(-1)!.p50Ms / mine[0]!.p50Ms)} |`,
    );
  }
  return lines.join('\n');
}
