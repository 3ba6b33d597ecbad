import { openStore } from './lib/taskfence.js';
import { encodePathLeaseKey } from '../src/domain/write-paths.js';
import type { BenchDatabases } from './lib/databases.js';
import { median, percentile, round } from './lib/stats.js';

export interface ScalingRow {
  dialect: 'sqlite' | 'postgres';
  liveLeases: number;
  p50Ms: number;
}

/**
 * `tryAcquirePaths` p50 with 10, 1,000 and 100,000 live leases of other holders in the same
 * workspace: the conflict check looks up ancestors by equality and descendants by one key range,
 * so its cost should stay flat (target: ≤ 1.5× at 100,000 vs 10).
 */
export async function benchPathScaling(
  dbs: BenchDatabases,
  options: { sizes: number[]; iterations: number; runs: number },
) {
  const rows: ScalingRow[] = [];
  for (const dialect of ['sqlite', 'postgres'] as const) {
    const url = dialect === 'sqlite' ? `sqlite:${dbs.sqliteFile()}` : await dbs.postgresUrl();
    const store = await openStore({ url, poolSize: 1 });
    await store.migrate();
    await store.org.createCompany({ id: 'c', name: 'c' });
    await store.org.createWorkspace({ id: 'ws', companyId: 'c', name: 'ws' });
    let held = 0;
    const far = Date.now() + 86_400_000;
    for (const size of [...options.sizes].sort((a, b) => a - b)) {
      while (held < size) {
        const batch = [];
        for (let i = held; i < Math.min(size, held + 1000); i++) {
          batch.push({
            workspace_id: 'ws',
            lease_key: encodePathLeaseKey(`pkg${i % 500}/mod${i}/file.ts`),
            holder: `other-${i % 64}`,
            task_id: null,
            acquired_at: 0,
            expires_at: far,
          });
        }
        await store.db.insertInto('path_leases').values(batch).execute();
        held = Math.min(size, held + 1000);
      }
      if (dialect === 'postgres')
        await store.db.executeQuery({
          sql: 'analyze path_leases',
          parameters: [],
          query: { kind: 'RawNode' },
        } as never);
      const medians: number[] = [];
      for (let r = 0; r < options.runs; r++) {
        const latencies: number[] = [];
        for (let i = -20; i < options.iterations; i++) {
          const t0 = performance.now();
          const result = await store.paths.tryAcquirePaths({
            workspaceId: 'ws',
            holder: 'bench',
            paths: ['src/a', 'docs'],
            ttlMs: 60_000,
          });
          const t = performance.now() - t0;
          if (!result.acquired) throw new Error('unexpected conflict');
          await store.paths.releasePaths({ workspaceId: 'ws', holder: 'bench' });
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
      console.log(`  path scaling ${dialect} ${size} leases: p50 ${row.p50Ms} ms`);
    }
    await store.close();
  }
  return rows;
}

/**
 * `releasePaths(lease)` p50 beside 10, 1,000 and 100,000 live grants of the same holder in the
 * workspace (a coordinator that leases paths for all its tasks under one holder): the release
 * finds its grant's rows by workspace, holder and token (schema 0110's index), so its cost should
 * stay flat. Before 0110 it read every lease the holder had there.
 */
export async function benchGrantRelease(
  dbs: BenchDatabases,
  options: { sizes: number[]; iterations: number; runs: number },
) {
  const rows: ScalingRow[] = [];
  for (const dialect of ['sqlite', 'postgres'] as const) {
    const url = dialect === 'sqlite' ? `sqlite:${dbs.sqliteFile()}` : await dbs.postgresUrl();
    const store = await openStore({ url, poolSize: 1 });
    await store.migrate();
    await store.org.createCompany({ id: 'c-grants', name: 'c' });
    await store.org.createWorkspace({ id: 'ws-grants', companyId: 'c-grants', name: 'ws' });
    let held = 0;
    const far = Date.now() + 86_400_000;
    for (const size of [...options.sizes].sort((a, b) => a - b)) {
      while (held < size) {
        const batch = [];
        // One single-key grant each, as `tryAcquirePaths` would have made them.
        for (let i = held; i < Math.min(size, held + 1000); i++) {
          batch.push({
            workspace_id: 'ws-grants',
            lease_key: encodePathLeaseKey(`pkg${i % 500}/mod${i}/file.ts`),
            holder: 'coordinator',
            task_id: null,
            acquired_at: 0,
            expires_at: far,
            token: i + 1,
          });
        }
        await store.db.insertInto('path_leases').values(batch).execute();
        held = Math.min(size, held + 1000);
      }
      // Later grants take tokens above the filler's.
      await store.db.deleteFrom('path_lease_tokens').where('workspace_id', '=', 'ws-grants').execute();
      await store.db
        .insertInto('path_lease_tokens')
        .values({ workspace_id: 'ws-grants', token: held + 1_000_000, updated_at: 0 })
        .execute();
      if (dialect === 'postgres')
        await store.db.executeQuery({
          sql: 'analyze path_leases',
          parameters: [],
          query: { kind: 'RawNode' },
        } as never);
      const medians: number[] = [];
      for (let r = 0; r < options.runs; r++) {
        const latencies: number[] = [];
        for (let i = -20; i < options.iterations; i++) {
          const result = await store.paths.tryAcquirePaths({
            workspaceId: 'ws-grants',
            holder: 'coordinator',
            paths: ['src/a'],
            ttlMs: 60_000,
          });
          if (!result.acquired) throw new Error('unexpected conflict');
          const t0 = performance.now();
          await store.paths.releasePaths(result.lease);
          if (i >= 0) latencies.push(performance.now() - t0);
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
      console.log(`  grant release ${dialect} beside ${size} of the holder's leases: p50 ${row.p50Ms} ms`);
    }
    await store.close();
  }
  return rows;
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
