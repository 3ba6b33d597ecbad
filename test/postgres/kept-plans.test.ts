import pg from 'pg';
import { sql } from 'kysely';
import { afterAll, describe, expect, it } from 'vitest';
import { postgresFixture } from '../support/dialects.js';
import { useUrlSchema } from '../support/schema.js';

/*
 * PL/pgSQL keeps a plan per connection, made with the statistics of its first calls, until the
 * table is analyzed again (ARCHITECTURE.md, "Kept plans"). These tests make the plans on
 * near-empty tables, grow the tables without ANALYZE (autovacuum off on them), and count the
 * sequential scans the same connection's calls then make: a count, not a timing. Mutant
 * `message-fns-seqscan-allowed` (0105's functions without `set enable_seqscan = off`) keeps plans
 * that scan the whole `messages` table on every hand-out (75 ms a receive at 300,000 rows,
 * against 2 ms), and fails here.
 */

const fx = postgresFixture();
afterAll(() => fx.cleanup());

const WATCHED = ['messages', 'coordinator_runs'] as const;

async function seqScans(admin: pg.Client): Promise<Record<string, number>> {
  await admin.query('select pg_stat_clear_snapshot()');
  const { rows } = await admin.query<{ relname: string; seq_scan: string }>(
    `select relname, seq_scan from pg_stat_user_tables where relid = any($1::regclass[])`,
    [WATCHED],
  );
  return Object.fromEntries(rows.map((r) => [r.relname, Number(r.seq_scan)]));
}

describe('kept plans of the inbox functions', () => {
  it('a connection that planned on empty tables hands out without scanning them once they grew', async () => {
    const url = await fx.freshUrl();
    const store = await fx.open(url, { poolSize: 1 });
    await store.migrate();
    const admin = new pg.Client({ connectionString: url });
    await admin.connect();
    await useUrlSchema(admin, url);
    try {
      for (const table of WATCHED) await admin.query(`alter table ${table} set (autovacuum_enabled = false)`);
      const run = await store.runs.startCoordinatorRun({ targetKey: 'worktree:kept-plans' });
      const inbox = run.coordinatorHandle;
      const send = (n: number) =>
        store.messages.sendMessages(
          Array.from({ length: n }, (_, i) => ({ from: 'w', to: inbox, kind: 'k', payload: { i } })),
        );
      const cycle = async () => {
        const [m] = await store.messages.receiveMessages(inbox, { limit: 1 });
        expect(m).toBeDefined();
        expect((await store.messages.ackMessages(inbox, [m!.receipt])).acked).toHaveLength(1);
        expect(await store.messages.deliverPendingMessages(inbox, { limit: 1 })).toHaveLength(1);
      };
      // Planned on near-empty tables: past the fifth call PL/pgSQL keeps a generic plan.
      await send(20);
      for (let i = 0; i < 10; i++) await cycle();

      // Grown without ANALYZE: other inboxes' messages (delivered, pending, leased), this inbox's
      // delivered history, and finished runs.
      const now = Date.now();
      await admin.query(
        `insert into messages (id, from_handle, to_handle, kind, payload, status, created_at, visible_at, attempts)
         select 'g-' || i, 'w', 'other-' || (i % 200), 'k', '{}',
           case when i % 3 = 0 then 'delivered' else 'pending' end, $1::bigint + i,
           case when i % 3 = 1 then $1::bigint + 600000 end, case when i % 3 = 1 then 1 else 0 end
         from generate_series(1, 60000) i`,
        [now],
      );
      await admin.query(
        `insert into messages (id, from_handle, to_handle, kind, payload, status, created_at, delivered_at, attempts)
         select 'h-' || i, 'w', $1, 'k', '{}', 'delivered', $2::bigint - 100000 + i, $2::bigint, 1
         from generate_series(1, 20000) i`,
        [inbox, now],
      );
      await admin.query(
        `insert into coordinator_runs (id, coordinator_handle, target_key, status, started_at, ended_at)
         select 'r-' || i, 'coordinator-r-' || i, 'worktree:r-' || (i % 500), 'completed', $1::bigint, $1::bigint
         from generate_series(1, 5000) i`,
        [now],
      );
      await send(20);

      await sql`select pg_stat_force_next_flush()`.execute(store.db);
      const before = await seqScans(admin);
      for (let i = 0; i < 10; i++) await cycle();
      await sql`select pg_stat_force_next_flush()`.execute(store.db);
      const after = await seqScans(admin);
      for (const table of WATCHED)
        expect({ table, scans: after[table]! - before[table]! }).toEqual({ table, scans: 0 });
    } finally {
      await admin.end();
      await store.close();
    }
  });
});
