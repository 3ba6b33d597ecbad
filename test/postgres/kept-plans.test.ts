import pg from 'pg';
import { sql } from 'kysely';
import { afterAll, describe, expect, it } from 'vitest';
import type { Store } from '../../src/index.js';
import { postgresFixture } from '../support/dialects.js';
import { useUrlSchema } from '../support/schema.js';

/*
 * PL/pgSQL keeps a plan per connection, made with the statistics of its first calls, until the
 * table is analyzed again (ARCHITECTURE.md, "Kept plans"). This test makes 0105's plans on
 * near-empty tables, grows the tables without ANALYZE (autovacuum off on them), and counts what
 * the same connection's calls then read: sequential scans, and rows read through scans and
 * indexes (pg_stat). A count, not a timing. Mutants, each watched failing (2026-12-04):
 * - `message-fns-seqscan-allowed` (without `set enable_seqscan = off`): 10 sequential scans of
 *   `messages`, 801,338 rows read (75 ms a receive at 300,000 rows, against 2 ms);
 * - the adopted inboxes as `to_handle in (select handle from old)` instead of `LATERAL`: every
 *   pending message walked twice a call, 2,000,656 rows;
 * - deliver's re-check as `status = 'pending'` instead of `(…) is true`: 401,493 rows.
 * As built: 948 rows for the 30 calls.
 * The dead-lettering (0108), after 60,000 leases lapsed in 200 other inboxes: mutant
 * `inbox-dead-or` (0108's functions with v1's `to_handle = p_handle or to_handle in (…)` in
 * `dead`) reads 1,200,949 rows of `messages` in ten cycles; as built, 949.
 * The batch claim's busy terminals (0107), never analyzed, at 10,000 active dispatches: mutant
 * `batch-busy-any` (0104's `terminal_handle = any(…)`) reads 111,270 rows of `dispatch_contexts`
 * in ten batches of 100; as built, 20.
 * The dispatch cycle's functions (0104) the same way: mutant `dispatch-fns-0101-plans` (the store
 * calling 0101's `taskfence_dispatch_next_v1` and 0102's `taskfence_complete_dispatch_v2`, the
 * versions 0104 replaced) reads 1,381,515 rows of `tasks` with 11 sequential scans, 110,073 of
 * `dispatch_contexts` and 220,099 of `task_dependencies` in 10 chained cycles; 0104's read 308,
 * 52 and 22.
 */

const fx = postgresFixture();
afterAll(() => fx.cleanup());

const WATCHED = ['messages', 'coordinator_runs'] as const;

/** Sequential scans of each table, and the rows read from it (by those scans and through its indexes). */
async function reads(admin: pg.Client, tables: readonly string[]): Promise<Map<string, [number, number]>> {
  await admin.query('select pg_stat_clear_snapshot()');
  const { rows } = await admin.query<{ relname: string; seq_scan: string; tuples: string }>(
    `select t.relname, t.seq_scan,
       t.seq_tup_read + coalesce((select sum(i.idx_tup_read) from pg_stat_user_indexes i where i.relid = t.relid), 0) as tuples
     from pg_stat_user_tables t where t.relid = any($1::regclass[])`,
    [tables],
  );
  return new Map(rows.map((r) => [r.relname, [Number(r.seq_scan), Number(r.tuples)]]));
}

/**
 * What `calls` read of `tables` on the store's one connection: sequential scans, and whether the
 * rows read (by scans and through indexes) stayed under `bound`, a fraction of the rows grown.
 */
async function readsDuring(
  store: Store,
  admin: pg.Client,
  tables: readonly string[],
  bound: number,
  calls: () => Promise<void>,
) {
  await sql`select pg_stat_force_next_flush()`.execute(store.db);
  const before = await reads(admin, tables);
  await calls();
  await sql`select pg_stat_force_next_flush()`.execute(store.db);
  const after = await reads(admin, tables);
  return tables.map((table) => {
    const [scans0, rows0] = before.get(table)!;
    const [scans1, rows1] = after.get(table)!;
    console.log(`kept plans: ${table}: ${scans1 - scans0} sequential scans, ${rows1 - rows0} rows read`);
    return { table, seqScans: scans1 - scans0, bounded: rows1 - rows0 < bound };
  });
}

/** Another running run, `other-run` on `worktree:other`, written directly: the grown rows belong to it. */
async function insertOtherRun(admin: pg.Client, now: number): Promise<void> {
  await admin.query(
    `insert into coordinator_runs (id, coordinator_handle, target_key, status, started_at)
     values ('other-run', 'coordinator-other', 'worktree:other', 'running', $1::bigint)`,
    [now],
  );
}

/** Sends `n` messages to `inbox`. */
async function sendTo(store: Store, inbox: string, n: number): Promise<void> {
  await store.messages.sendMessages(
    Array.from({ length: n }, (_, i) => ({ from: 'w', to: inbox, kind: 'k', payload: { i } })),
  );
}

/** `n` inbox cycles: a receive of one message and its ack, and a delivery of one. */
async function inboxCycles(store: Store, inbox: string, n: number): Promise<void> {
  for (let i = 0; i < n; i++) {
    const [m] = await store.messages.receiveMessages(inbox, { limit: 1 });
    expect(m).toBeDefined();
    expect((await store.messages.ackMessages(inbox, [m!.receipt])).acked).toHaveLength(1);
    expect(await store.messages.deliverPendingMessages(inbox, { limit: 1 })).toHaveLength(1);
  }
}

/**
 * A running coordinator's inbox whose hand-outs were planned on near-empty tables: 20 messages
 * sent and 10 cycles run (past the fifth call PL/pgSQL keeps a generic plan). Its handle.
 */
async function warmedInbox(store: Store): Promise<string> {
  const run = await store.runs.startCoordinatorRun({ targetKey: 'worktree:kept-plans' });
  await sendTo(store, run.coordinatorHandle, 20);
  await inboxCycles(store, run.coordinatorHandle, 10);
  return run.coordinatorHandle;
}

/**
 * A migrated store on one connection (its plans are that connection's) and an admin connection,
 * with autovacuum off on `tables`, so only the test decides when they are analyzed (never).
 */
async function withKeptPlans(
  tables: readonly string[],
  fn: (store: Store, admin: pg.Client) => Promise<void>,
): Promise<void> {
  const url = await fx.freshUrl();
  const store = await fx.open(url, { poolSize: 1 });
  await store.migrate();
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  await useUrlSchema(admin, url);
  try {
    for (const table of tables) await admin.query(`alter table ${table} set (autovacuum_enabled = false)`);
    await fn(store, admin);
  } finally {
    await admin.end();
    await store.close();
  }
}

describe('kept plans of the inbox functions', () => {
  it('a connection that planned on empty tables hands out without scanning them once they grew', () =>
    withKeptPlans(WATCHED, async (store, admin) => {
      const inbox = await warmedInbox(store);

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
      await sendTo(store, inbox, 20);
      const read = await readsDuring(store, admin, WATCHED, 2_000, () => inboxCycles(store, inbox, 10));
      expect(read).toEqual(WATCHED.map((table) => ({ table, seqScans: 0, bounded: true })));
    }));
});

describe('the dead-lettering of the inbox functions', () => {
  it("reads the lapsed leases of the inboxes it serves, not every inbox's", () =>
    withKeptPlans(WATCHED, async (store, admin) => {
      const inbox = await warmedInbox(store);
      // 60,000 leases lapsed in 200 other inboxes (their consumers gone), a fifth of them on their
      // last attempt: the dead-lettering of those inboxes' own next hand-out.
      await admin.query(
        `insert into messages (id, from_handle, to_handle, kind, payload, status, created_at, visible_at, attempts)
         select 'l-' || i, 'w', 'other-' || (i % 200), 'k', '{}', 'pending', $1::bigint + i, $1::bigint - 600000, 1 + (i % 5)
         from generate_series(1, 60000) i`,
        [Date.now()],
      );
      await sendTo(store, inbox, 20);
      const read = await readsDuring(store, admin, WATCHED, 3_000, () => inboxCycles(store, inbox, 10));
      expect(read).toEqual(WATCHED.map((table) => ({ table, seqScans: 0, bounded: true })));
      const lapsed = await admin.query<{ n: string }>(
        `select count(*) as n from messages where id like 'l-%' and dead_at is null and to_handle like 'other-%'`,
      );
      expect(Number(lapsed.rows[0]!.n)).toBe(60_000);
    }));
});

describe('kept plans of the dispatch functions', () => {
  const tables = ['tasks', 'dispatch_contexts', 'task_dependencies'];
  it('a connection that planned on empty tables claims and completes without reading the grown tables', () =>
    withKeptPlans(tables, async (store, admin) => {
      const company = await store.org.createCompany({ name: 'kept-plans' });
      const targetKey = 'worktree:kept-plans-dispatch';
      const run = await store.runs.startCoordinatorRun({ targetKey });
      // Pairs: a ready task and a blocked dependent, so every completion readies one.
      const pairs = async (n: number) =>
        store.transaction(async (tx) => {
          for (let i = 0; i < n; i++) {
            const first = await tx.tasks.createTask({
              companyId: company.id,
              title: `a${i}`,
              targetKey,
              requiresFilesystem: false,
              status: 'ready',
              priority: 5,
            });
            await tx.tasks.createTask({
              companyId: company.id,
              title: `b${i}`,
              targetKey,
              requiresFilesystem: false,
              status: 'ready',
              priority: 1,
              dependsOn: [first.id],
            });
          }
        });
      const cycles = async (n: number) => {
        let d = await store.dispatches.dispatchNext({ runId: run.id, terminalHandle: 'term-0' });
        for (let i = 0; i < n && d; i++) {
          const done = await store.dispatches.completeDispatch(d.id, {
            result: { ok: true },
            lease: d.lease ?? undefined,
            next: true,
          });
          d = done.next ?? null;
        }
        expect(d).not.toBeNull();
        await store.dispatches.completeDispatch(d!.id, { result: { ok: true }, lease: d!.lease ?? undefined });
      };
      await pairs(12);
      await cycles(10);

      // Grown without ANALYZE: another run's queue (ready, blocked on it, done), its history of
      // ended dispatches and its active ones on other terminals, and its dependency edges.
      const now = Date.now();
      await insertOtherRun(admin, now);
      await admin.query(
        `insert into tasks (id, company_id, title, status, created_at, updated_at, coordinator_run_id, target_key,
           requires_filesystem, priority, blocked_reason)
         select 'g-' || i, $1, 't', case i % 3 when 0 then 'ready' when 1 then 'done' else 'blocked' end,
           $2::bigint, $2::bigint, 'other-run', 'worktree:other', 0, i % 10,
           case when i % 3 = 2 then 'dependencies: waiting for g-' || (i - 2) end
         from generate_series(1, 60000) i`,
        [company.id, now],
      );
      await admin.query(
        `insert into task_dependencies (task_id, depends_on_id, created_at)
         select 'g-' || i, 'g-' || (i - 2), $1::bigint from generate_series(3, 60000) i where i % 3 = 2`,
        [now],
      );
      await admin.query(
        `insert into dispatch_contexts (id, task_id, terminal_handle, status, created_at, updated_at, ended_at,
           coordinator_run_id, lease_expires_at)
         select 'gd-' || i, 'g-' || i, 'other-' || i, case when i % 6 = 1 then 'completed' else 'active' end,
           $1::bigint, $1::bigint, case when i % 6 = 1 then $1::bigint end, 'other-run', $1::bigint + 600000
         from generate_series(1, 60000) i where i % 3 = 1`,
        [now],
      );
      await pairs(12);
      expect(await readsDuring(store, admin, tables, 2_000, () => cycles(10))).toEqual(
        tables.map((table) => ({ table, seqScans: 0, bounded: true })),
      );
    }));
});

describe('the busy terminals of a batch claim', () => {
  const tables = ['dispatch_contexts'];
  it('are told by one probe per terminal, whatever the statistics of active dispatches say', () =>
    withKeptPlans(tables, async (store, admin) => {
      const company = await store.org.createCompany({ name: 'kept-plans-batch' });
      const targetKey = 'worktree:kept-plans-batch';
      const run = await store.runs.startCoordinatorRun({ targetKey });
      const ready = (n: number) =>
        store.tasks.createTasks(
          Array.from({ length: n }, (_, i) => ({
            companyId: company.id,
            title: `r${i}`,
            targetKey,
            requiresFilesystem: false,
            status: 'ready' as const,
          })),
        );
      let terminal = 0;
      const batch = async (busy: readonly string[]) => {
        const handles = [...busy, ...Array.from({ length: 98 }, () => `term-${++terminal}`)];
        const made = await store.dispatches.dispatchNextBatch({ runId: run.id, terminalHandles: handles });
        expect(made.map((d) => d.terminalHandle)).toEqual(handles.slice(busy.length));
        return made.map((d) => d.terminalHandle);
      };
      await ready(1000);
      await ready(800);
      // Never analyzed (autovacuum off; a fresh table before its first autovacuum is the same).
      const first = await batch([]);
      for (let i = 0; i < 6; i++) await batch(first.slice(0, 2));

      // Grown without ANALYZE: 10,000 dispatches active on other terminals, of another run. (The
      // planner's default estimate of `status = 'active'` is 0.5% of the rows: below 200 per
      // terminal asked, `= any(terminals)` lost to reading every active dispatch.)
      const now = Date.now();
      await insertOtherRun(admin, now);
      await admin.query(
        `insert into tasks (id, company_id, title, status, created_at, updated_at, coordinator_run_id, target_key,
           requires_filesystem, priority)
         select 'g-' || i, $1, 't', 'dispatched', $2::bigint, $2::bigint, 'other-run', 'worktree:other', 0, 0
         from generate_series(1, 10000) i`,
        [company.id, now],
      );
      await admin.query(
        `insert into dispatch_contexts (id, task_id, terminal_handle, status, created_at, updated_at,
           coordinator_run_id, lease_expires_at)
         select 'gd-' || i, 'g-' || i, 'other-' || i, 'active', $1::bigint, $1::bigint, 'other-run', $1::bigint + 600000
         from generate_series(1, 10000) i`,
        [now],
      );
      // Ten batches of 100 terminals, two of them busy: 1,000 probes.
      expect(
        await readsDuring(store, admin, tables, 3_000, async () => {
          for (let i = 0; i < 10; i++) await batch(first.slice(0, 2));
        }),
      ).toEqual(tables.map((table) => ({ table, seqScans: 0, bounded: true })));
    }));
});

describe('kept plans of the path grant function', () => {
  const tables = ['path_leases'];
  it('a connection that planned on an empty path_leases grants without reading the grown workspace', () =>
    withKeptPlans(tables, async (store, admin) => {
      const company = await store.org.createCompany({ name: 'kept-plans-paths' });
      const workspace = await store.org.createWorkspace({ companyId: company.id, name: 'kept' });
      const paths = (i: number) => [`src/app/a${i}.ts`, `docs/${i}`];
      // Lapsed leases on the keys of grant i, of another holder (pruned) and of the granting one (overwritten).
      const lapse = (i: number) =>
        admin.query(
          `insert into path_leases (workspace_id, lease_key, holder, task_id, acquired_at, expires_at, token)
           values ($1, $2, 'agent-lapsed', null, 0, 1, 7), ($1, $3, 'agent-kept', null, 0, 1, 7)`,
          [workspace.id, `/src/app/a${i}.ts/`, `/docs/${i}/`],
        );
      // A grant with ancestors and ranges taking lapsed leases over, and one refused on its keys.
      const grant = async (i: number) => {
        await lapse(i);
        const r = await store.paths.tryAcquirePaths({
          workspaceId: workspace.id,
          holder: 'agent-kept',
          paths: paths(i),
          ttlMs: 600_000,
        });
        expect(r.status).toBe('acquired');
        const refused = await store.paths.tryAcquirePaths({
          workspaceId: workspace.id,
          holder: 'agent-other',
          paths: ['src'],
          ttlMs: 600_000,
        });
        expect(refused.status).toBe('busy');
        return r.status === 'acquired' ? r.lease : null;
      };
      // Planned on a near-empty path_leases: past the fifth call PL/pgSQL keeps a generic plan.
      for (let i = 0; i < 10; i++) await store.paths.releasePaths((await grant(i))!);

      // Grown without ANALYZE: 60,000 live leases on other keys of the workspace, half of them the
      // granting holder's (its index on (workspace, holder) is what a kept plan could walk).
      const now = Date.now();
      await admin.query(
        `insert into path_leases (workspace_id, lease_key, holder, task_id, acquired_at, expires_at, token)
         select $1, '/grown/' || i || '/', case when i % 2 = 0 then 'agent-kept' else 'agent-' || (i % 50) end,
           null, $2::bigint, $2::bigint + 600000, 1000000 + i
         from generate_series(1, 60000) i`,
        [workspace.id, now],
      );
      // Grants only (a release by token is a statement, planned per call; since 0110 by its token's index).
      expect(
        await readsDuring(store, admin, tables, 2_000, async () => {
          for (let i = 10; i < 20; i++) await grant(i);
        }),
      ).toEqual(tables.map((table) => ({ table, seqScans: 0, bounded: true })));
    }));
});

describe('the functions run without JIT (0112)', () => {
  it('every taskfence function in the schema is declared with jit = off', () =>
    withKeptPlans([], async (_store, admin) => {
      // A generic plan costed from a target's many stopped runs passed jit_above_cost, and every
      // receive compiled it first (540–570 ms against 1.3 ms). Mutant "no schema 0112", or a later
      // function created without `set jit = off`, fails here.
      const { rows } = await admin.query<{ fn: string; config: string[] | null }>(
        `select p.oid::regprocedure::text as fn, p.proconfig as config
         from pg_proc p where p.proname like 'taskfence\\_%' and p.pronamespace = current_schema()::regnamespace
         order by 1`,
      );
      expect(rows.length).toBeGreaterThanOrEqual(16);
      expect(rows.filter((r) => !(r.config ?? []).includes('jit=off')).map((r) => r.fn)).toEqual([]);
    }));
});
