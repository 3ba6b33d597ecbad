/**
 * Leased delivery and idempotency keys (issue 23), each case run for a fixed time:
 *
 * - receive → ack cycles per second and messages per second at 1, 4 and 8 consumers of one inbox
 *   (each its own store and connection, batches of 10), beside pgmq-style raw SQL on the same
 *   PostgreSQL in the same run: a queue table with a visibility timestamp, read with
 *   `FOR UPDATE SKIP LOCKED` (pgmq's `read`) and acked by deleting the rows (pgmq's `delete`);
 * - the cost of an idempotency key on `claimTaskLease`: the claim's mean latency with a fresh key
 *   per call against the same claim without one (each claim released, untimed, before the next).
 *
 * `npx tsx bench/run.ts --only=delivery` (add `--quick` for 3 s cases); `DELIVERY_CASE_MS` sets
 * the length of a case (default 20 s).
 */
import pg from 'pg';
import type { Store } from '../src/index.js';
import { openStore } from './lib/taskfence.js';
import type { BenchDatabases } from './lib/databases.js';
import { round } from './lib/stats.js';

const BATCH = 10;
const VISIBILITY_MS = 30_000;

export interface DeliveryRow {
  readonly consumers: number;
  readonly taskfenceCyclesPerSec: number;
  readonly taskfenceMessagesPerSec: number;
  readonly rawCyclesPerSec: number;
  readonly rawMessagesPerSec: number;
  /** taskfence messages/s ÷ raw messages/s. */
  readonly ratio: number;
}

export interface KeyOverheadRow {
  readonly dialect: 'sqlite' | 'postgres';
  readonly plainClaimsPerSec: number;
  readonly keyedClaimsPerSec: number;
  /** Mean keyed claim latency ÷ mean plain claim latency. */
  readonly ratio: number;
}

/** Enough messages that no case runs dry: `perSecond` × the case's length, rounded up. */
function messagesFor(caseMs: number, perSecondCeiling: number) {
  return Math.ceil((caseMs / 1000) * perSecondCeiling);
}

/** Runs `consumers` loops of `cycle` (returning how many messages it took) until `caseMs` passes. */
async function timed(consumers: number, caseMs: number, cycle: (i: number) => Promise<number>) {
  const until = performance.now() + caseMs;
  let cycles = 0;
  let messages = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: consumers }, async (_, i) => {
      while (performance.now() < until) {
        const n = await cycle(i);
        if (n === 0) throw new Error('the inbox ran dry: raise the message count');
        cycles++;
        messages += n;
      }
    }),
  );
  const seconds = (performance.now() - t0) / 1000;
  return { cyclesPerSec: Math.round(cycles / seconds), messagesPerSec: Math.round(messages / seconds) };
}

/** One PostgreSQL database, taskfence's messages table filled for the inbox. */
async function taskfenceInbox(dbs: BenchDatabases, messages: number): Promise<string> {
  const url = await dbs.postgresUrl();
  const store = await openStore(url);
  try {
    await store.migrate();
    for (let i = 0; i < messages; i += 5_000) {
      await store.db
        .insertInto('messages')
        .values(
          Array.from({ length: Math.min(5_000, messages - i) }, (_, k) => ({
            id: `m${i + k}`,
            from_handle: 'sender',
            to_handle: 'inbox',
            kind: 'k',
            payload: '{"n":1}',
            status: 'pending' as const,
            created_at: i + k,
            delivered_at: null,
          })),
        )
        .execute();
    }
  } finally {
    await store.close();
  }
  return url;
}

/** One PostgreSQL database with a pgmq-shaped queue table, filled. */
async function rawQueue(dbs: BenchDatabases, messages: number): Promise<string> {
  const url = await dbs.postgresUrl();
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    await client.query(`create table q (
      msg_id bigserial primary key,
      read_ct integer not null default 0,
      enqueued_at bigint not null,
      vt bigint not null,
      message jsonb)`);
    await client.query('create index q_vt on q (vt)');
    await client.query(
      `insert into q (enqueued_at, vt, message) select g, 0, '{"n":1}'::jsonb from generate_series(1, $1) g`,
      [messages],
    );
    await client.query('analyze q');
  } finally {
    await client.end();
  }
  return url;
}

/** pgmq's `read` (visibility timeout, SKIP LOCKED) and `delete`, as prepared statements. */
const RAW_READ = `with next as (
    select msg_id from q where vt <= $1 order by msg_id limit $2 for update skip locked)
  update q set vt = $3, read_ct = read_ct + 1 from next where q.msg_id = next.msg_id
  returning q.msg_id, q.read_ct, q.message`;
const RAW_DELETE = 'delete from q where msg_id = any($1::bigint[])';

export async function benchDeliveryCycles(
  dbs: BenchDatabases,
  options: { consumers: readonly number[]; caseMs: number },
): Promise<DeliveryRow[]> {
  const rows: DeliveryRow[] = [];
  for (const n of options.consumers) {
    const url = await taskfenceInbox(dbs, messagesFor(options.caseMs, 6_000));
    const stores: Store[] = [];
    let tf: { cyclesPerSec: number; messagesPerSec: number };
    try {
      for (let i = 0; i < n; i++) stores.push(await openStore({ url, poolSize: 1 }));
      tf = await timed(n, options.caseMs, async (i) => {
        const store = stores[i]!;
        const got = await store.messages.receiveMessages('inbox', { limit: BATCH, visibilityMs: VISIBILITY_MS });
        if (got.length === 0) return 0;
        const { acked } = await store.messages.ackMessages(
          'inbox',
          got.map((m) => m.receipt),
        );
        if (acked.length !== got.length) throw new Error('an ack was refused');
        return got.length;
      });
    } finally {
      for (const s of stores) await s.close();
    }

    const rawUrl = await rawQueue(dbs, messagesFor(options.caseMs, 30_000));
    const clients: pg.Client[] = [];
    let raw: { cyclesPerSec: number; messagesPerSec: number };
    try {
      for (let i = 0; i < n; i++) {
        const c = new pg.Client({ connectionString: rawUrl });
        await c.connect();
        clients.push(c);
      }
      raw = await timed(n, options.caseMs, async (i) => {
        const c = clients[i]!;
        const now = Date.now();
        const read = await c.query<{ msg_id: string }>({
          name: 'read',
          text: RAW_READ,
          values: [now, BATCH, now + VISIBILITY_MS],
        });
        if (read.rowCount === 0) return 0;
        await c.query({ name: 'delete', text: RAW_DELETE, values: [read.rows.map((r) => r.msg_id)] });
        return read.rows.length;
      });
    } finally {
      for (const c of clients) await c.end();
    }
    rows.push({
      consumers: n,
      taskfenceCyclesPerSec: tf.cyclesPerSec,
      taskfenceMessagesPerSec: tf.messagesPerSec,
      rawCyclesPerSec: raw.cyclesPerSec,
      rawMessagesPerSec: raw.messagesPerSec,
      ratio: round(tf.messagesPerSec / raw.messagesPerSec),
    });
  }
  return rows;
}

export async function benchKeyOverhead(dbs: BenchDatabases, options: { caseMs: number }): Promise<KeyOverheadRow[]> {
  const rows: KeyOverheadRow[] = [];
  for (const dialect of ['sqlite', 'postgres'] as const) {
    const url = dialect === 'sqlite' ? `sqlite:${dbs.sqliteFile()}` : await dbs.postgresUrl();
    const store = await openStore(url);
    try {
      await store.migrate();
      const company = await store.org.createCompany({ name: 'bench' });
      const task = await store.tasks.createTask({ companyId: company.id, title: 'claimed', requiresFilesystem: false });
      let k = 0;
      // Claims timed one by one; the release that frees the task for the next claim is not timed.
      const claimsPerSec = async (keyed: boolean) => {
        const until = performance.now() + options.caseMs;
        let spent = 0;
        let claims = 0;
        while (performance.now() < until) {
          const t0 = performance.now();
          const claim = await store.locks.claimTaskLease(task.id, {
            holder: 'bench',
            ttlMs: 60_000,
            ...(keyed ? { idempotencyKey: `claim-${k++}` } : {}),
          });
          spent += performance.now() - t0;
          claims++;
          if (claim.status !== 'acquired') throw new Error(`claim ${claim.status}`);
          await store.locks.releaseTaskLease(claim.lease);
        }
        return (claims / spent) * 1000;
      };
      await claimsPerSec(false); // warm-up: prepared statements, the page cache
      const plain = await claimsPerSec(false);
      const keyed = await claimsPerSec(true);
      rows.push({
        dialect,
        plainClaimsPerSec: Math.round(plain),
        keyedClaimsPerSec: Math.round(keyed),
        ratio: round(plain / keyed),
      });
    } finally {
      await store.close();
    }
  }
  return rows;
}

export function deliveryTable(rows: readonly DeliveryRow[]): string {
  return [
    '| consumers | taskfence receive → ack cycles/s | taskfence messages/s | pgmq-style raw SQL cycles/s | raw messages/s | ratio taskfence / raw |',
    '|---|---|---|---|---|---|',
    ...rows.map(
      (r) =>
        `| ${r.consumers} | ${r.taskfenceCyclesPerSec} | ${r.taskfenceMessagesPerSec} | ${r.rawCyclesPerSec} | ${r.rawMessagesPerSec} | ${r.ratio} |`,
    ),
  ].join('\n');
}

export function keyOverheadTable(rows: readonly KeyOverheadRow[]): string {
  return [
    '| dialect | claimTaskLease without a key (claims/s) | with a fresh key (claims/s) | latency ratio keyed / plain |',
    '|---|---|---|---|',
    ...rows.map((r) => `| ${r.dialect} | ${r.plainClaimsPerSec} | ${r.keyedClaimsPerSec} | ${r.ratio} |`),
  ].join('\n');
}
