/**
 * Wake-up latency and parallel inbox consumers (issue: running it for months), and the floor:
 * the same machine's single-connection commit latency, so readers see how close to the hardware
 * each PostgreSQL figure is.
 */
import pg from 'pg';
import type { Store } from '../src/index.js';
import { openStore } from './lib/taskfence.js';
import type { BenchDatabases } from './lib/databases.js';
import { median, percentile, round } from './lib/stats.js';

type Dialect = 'sqlite' | 'postgres';

export interface WakeupRow {
  readonly dialect: Dialect;
  readonly what: 'release → blocked acquirePaths' | 'sendMessage → waitForMessages';
  readonly mode: 'wake-up' | 'polling (100 ms fallback, no notifications)';
  readonly p50Ms: number;
  readonly p99Ms: number;
}

export interface DrainRow {
  readonly dialect: Dialect;
  readonly consumers: number;
  readonly messagesPerSec: number;
}

async function migrated(dbs: BenchDatabases, dialect: Dialect): Promise<string> {
  const url = dialect === 'sqlite' ? `sqlite:${dbs.sqliteFile()}` : await dbs.postgresUrl();
  const store = await openStore(url);
  await store.migrate();
  await store.close();
  return url;
}

/** Time from the commit of a release (or a send) to the waiter's call returning, `iterations` times. */
export async function benchWakeups(dbs: BenchDatabases, options: { iterations: number }): Promise<WakeupRow[]> {
  const rows: WakeupRow[] = [];
  for (const dialect of ['sqlite', 'postgres'] as const) {
    for (const notifications of [true, false]) {
      const url = await migrated(dbs, dialect);
      const waiter = await openStore({
        url,
        wakeNotifications: notifications,
        wakeFallbackMs: notifications ? 60_000 : 100,
      });
      const actor = await openStore({ url, wakeNotifications: notifications });
      try {
        const company = await actor.org.createCompany({ name: 'bench' });
        const ws = await actor.org.createWorkspace({ companyId: company.id, name: 'ws' });
        const paths: number[] = [];
        const messages: number[] = [];
        for (let i = 0; i < options.iterations; i++) {
          await actor.paths.tryAcquirePaths({ workspaceId: ws.id, holder: 'holder', paths: ['src'], ttlMs: 600_000 });
          const blocked = waiter.paths.acquirePaths(
            { workspaceId: ws.id, holder: 'waiter', paths: ['src/a.ts'], ttlMs: 600_000 },
            { timeoutMs: 600_000 },
          );
          await new Promise((resolve) => setTimeout(resolve, 20)); // the waiter is waiting
          const t0 = performance.now();
          await actor.paths.releasePaths({ workspaceId: ws.id, holder: 'holder' });
          await blocked;
          paths.push(performance.now() - t0);
          await waiter.paths.releasePaths({ workspaceId: ws.id, holder: 'waiter' });

          const waiting = waiter.messages.waitForMessages('bench-inbox', { timeoutMs: 600_000 });
          await new Promise((resolve) => setTimeout(resolve, 20));
          const t1 = performance.now();
          await actor.messages.sendMessage({ allowUnknownRecipient: true, from: 'a', to: 'bench-inbox', kind: 'k' });
          await waiting;
          messages.push(performance.now() - t1);
        }
        const mode = notifications ? 'wake-up' : 'polling (100 ms fallback, no notifications)';
        for (const [what, samples] of [
          ['release → blocked acquirePaths', paths],
          ['sendMessage → waitForMessages', messages],
        ] as const) {
          samples.sort((a, b) => a - b);
          rows.push({
            dialect,
            what,
            mode,
            p50Ms: round(percentile(samples, 50), 3),
            p99Ms: round(percentile(samples, 99), 3),
          });
        }
      } finally {
        await waiter.close();
        await actor.close();
      }
    }
  }
  return rows;
}

/**
 * One inbox of `messages` messages drained by 1, 2, 4, 8 consumers (each its own store and
 * connection): messages/s. PostgreSQL only: SQLite serializes writers by design (and several
 * SQLite connections in one process would measure busy_timeout stalls of one thread, not the engine).
 */
export async function benchInboxDrain(
  dbs: BenchDatabases,
  options: { messages: number; consumers: readonly number[]; runs: number },
): Promise<DrainRow[]> {
  const rows: DrainRow[] = [];
  for (const dialect of ['postgres'] as const) {
    for (const n of options.consumers) {
      const rates: number[] = [];
      for (let run = 0; run < options.runs; run++) {
        const url = await migrated(dbs, dialect);
        const sender = await openStore(url);
        const consumers: Store[] = [];
        try {
          await sender.db
            .insertInto('messages')
            .values(
              Array.from({ length: options.messages }, (_, i) => ({
                id: `m${i}`,
                from_handle: 'a',
                to_handle: 'inbox',
                kind: 'k',
                payload: null,
                status: 'pending' as const,
                created_at: i,
                delivered_at: null,
              })),
            )
            .execute();
          for (let i = 0; i < n; i++) consumers.push(await openStore({ url, poolSize: 1 }));
          const t0 = performance.now();
          let delivered = 0;
          await Promise.all(
            consumers.map(async (c) => {
              for (;;) {
                const got = await c.messages.deliverPendingMessages('inbox', { limit: 10 });
                if (got.length === 0) return;
                delivered += got.length;
              }
            }),
          );
          if (delivered !== options.messages) throw new Error(`delivered ${delivered} of ${options.messages}`);
          rates.push((options.messages / (performance.now() - t0)) * 1000);
        } finally {
          for (const c of consumers) await c.close();
          await sender.close();
        }
      }
      rows.push({ dialect, consumers: n, messagesPerSec: Math.round(median(rates)) });
    }
  }
  return rows;
}

/** The floor: one connection committing one-row inserts with the raw pg driver, p50/p99 ms. */
export async function benchCommitFloor(
  dbs: BenchDatabases,
  iterations: number,
): Promise<{ p50Ms: number; p99Ms: number; commitsPerSec: number }> {
  const url = await dbs.postgresUrl();
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    await client.query('create table floor (id int primary key)');
    const samples: number[] = [];
    const started = performance.now();
    for (let i = 0; i < iterations; i++) {
      const t0 = performance.now();
      await client.query('insert into floor values ($1)', [i]);
      samples.push(performance.now() - t0);
    }
    const elapsed = performance.now() - started;
    samples.sort((a, b) => a - b);
    return {
      p50Ms: round(percentile(samples, 50), 3),
      p99Ms: round(percentile(samples, 99), 3),
      commitsPerSec: Math.round((iterations / elapsed) * 1000),
    };
  } finally {
    await client.end();
  }
}

export function wakeupTable(rows: readonly WakeupRow[]): string {
  return [
    '| dialect | from → to | mode | p50 ms | p99 ms |',
    '|---|---|---|---|---|',
    ...rows.map((r) => `| ${r.dialect} | ${r.what} | ${r.mode} | ${r.p50Ms} | ${r.p99Ms} |`),
  ].join('\n');
}

export function drainTable(rows: readonly DrainRow[]): string {
  const dialects = [...new Set(rows.map((r) => r.dialect))];
  return [
    '| dialect | consumers: messages/s | N / 1 |',
    '|---|---|---|',
    ...dialects.map((d) => {
      const mine = rows.filter((r) => r.dialect === d);
      const one = mine.find((r) => r.consumers === 1)?.messagesPerSec ?? NaN;
      const last = mine.at(-1)!;
      return `| ${d} | ${mine.map((r) => `${r.consumers}: ${r.messagesPerSec}`).join('; ')} | ${last.consumers}: ${round(last.messagesPerSec / one)} |`;
    }),
  ].join('\n');
}
