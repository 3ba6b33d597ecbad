import { sql, type Kysely, type RawBuilder } from 'kysely';
import { prepared } from '../../query/prepared.js';
import { tableIn } from '../../query/schema.js';
import type { Database, MessageRow } from '../../schema/database.js';

/*
 * The delivery statements, as named fragments. A message is visible (can be handed out) when it
 * is pending, not dead, and its lease is absent or lapsed: `visible_at is null or visible_at <=
 * now`. Every hand-out re-checks that on the row it takes, so a leased message is never handed
 * out twice while its lease holds.
 */

interface ReceiveParams {
  readonly handle: string;
  readonly now: number;
  readonly limit: number;
  readonly visibleAt: number;
  readonly nonce: string;
  readonly maxAttempts: number;
}

interface DeliverParams {
  readonly handle: string;
  readonly now: number;
  readonly limit: number;
  /** A message handed out this many times is dead-lettered, never delivered again. */
  readonly maxAttempts: number;
}

/** The reason a dead message died when no consumer reported an error. */
export const LAPSED_ERROR = 'its lease lapsed on its last attempt';

/**
 * The coordinator of a running run takes over the pending messages (leased or not) addressed to
 * the coordinators of its target's stopped runs: the runs whose work it adopted. (SQLite; on
 * PostgreSQL the hand-out function does it, see `deadAndNext` in migration 0105.)
 */
export const TAKE_OVER = prepared((db, p: { handle: string }) => {
  const runs = tableIn(db, 'coordinator_runs');
  return sql<never>`update ${tableIn(db, 'messages')} set to_handle = ${p.handle}
    where status = 'pending' and to_handle in (
      select old.coordinator_handle from ${runs} old
      where old.status <> 'running' and old.target_key = (
        select me.target_key from ${runs} me where me.coordinator_handle = ${p.handle} and me.status = 'running'))`;
});

/** Moves the inbox's messages whose last lease lapsed to dead (SQLite; PostgreSQL does it inside RECEIVE_SKIP_LOCKED and DELIVER_SKIP_LOCKED). */
export const DEAD_LETTER_LAPSED = prepared((db, p: { handle: string; now: number; maxAttempts: number }) =>
  db
    .updateTable('messages')
    .set((eb) => ({ dead_at: p.now, last_error: eb.fn.coalesce('last_error', sql.lit(LAPSED_ERROR)) }))
    .where('to_handle', '=', p.handle)
    .where('status', '=', 'pending')
    .where('dead_at', 'is', null)
    .where('visible_at', '<=', p.now)
    .where('attempts', '>=', p.maxAttempts),
);

/** The receipt of the hand-out being made: attempt, the call's nonce, the message id. */
const newReceipt = (nonce: string) => sql<string>`cast(attempts + 1 as text) || '.' || ${nonce} || '.' || id`;

/**
 * Hands out up to `limit` visible messages where rows cannot be locked one by one (SQLite: every
 * writer is serialized by BEGIN IMMEDIATE anyway).
 */
export const RECEIVE_SERIALIZED = prepared((db, p: ReceiveParams) =>
  db
    .updateTable('messages')
    .set((eb) => ({
      attempts: eb('attempts', '+', 1),
      visible_at: p.visibleAt,
      receipt: newReceipt(p.nonce),
    }))
    .where('id', 'in', (eb) =>
      eb
        .selectFrom('messages as m')
        .select('m.id')
        .where('m.to_handle', '=', p.handle)
        .where('m.status', '=', 'pending')
        .where('m.dead_at', 'is', null)
        .where((w) => w.or([w('m.visible_at', 'is', null), w('m.visible_at', '<=', p.now)]))
        .where('m.attempts', '<', p.maxAttempts)
        .orderBy('m.seq')
        .limit(p.limit),
    )
    .where((w) => w.or([w('visible_at', 'is', null), w('visible_at', '<=', p.now)]))
    .returningAll(),
);

/**
 * The same hand-out for PostgreSQL, where consumers of one inbox work in parallel: a call of
 * `taskfence_receive_messages_v2` (migrations 0105 and 0108), one statement whose plan the function keeps
 * per connection. The oldest visible rows are locked with `FOR UPDATE SKIP LOCKED` in a
 * materialized CTE, so each consumer takes rows no other in-flight hand-out holds, and the
 * visibility is re-checked on the locked row. In the same statement it takes over the messages
 * of the runs the coordinator adopted, and dead-letters the messages whose last lease lapsed
 * (`deadAndNext` in migration 0105: two round trips less than `TAKE_OVER` and `DEAD_LETTER_LAPSED`).
 */
export const RECEIVE_SKIP_LOCKED = prepared(
  (db, p: ReceiveParams) =>
    sql<MessageRow>`select * from ${tableIn(db, 'taskfence_receive_messages_v2')}(${p.handle}::text, ${p.now}::bigint,
      ${p.limit}::integer, ${p.visibleAt}::bigint, ${p.nonce}::text, ${p.maxAttempts}::integer)`,
);

/** Receive and ack in one statement (`deliverPendingMessages`, at most once), serialized writers. */
export const DELIVER_SERIALIZED = prepared((db, p: DeliverParams) =>
  db
    .updateTable('messages')
    .set((eb) => ({ status: 'delivered', delivered_at: p.now, attempts: eb('attempts', '+', 1), visible_at: null }))
    .where('id', 'in', (eb) =>
      eb
        .selectFrom('messages as m')
        .select('m.id')
        .where('m.to_handle', '=', p.handle)
        .where('m.status', '=', 'pending')
        .where('m.dead_at', 'is', null)
        .where((w) => w.or([w('m.visible_at', 'is', null), w('m.visible_at', '<=', p.now)]))
        .where('m.attempts', '<', p.maxAttempts)
        .orderBy('m.seq')
        .limit(p.limit),
    )
    .where('status', '=', 'pending')
    .returningAll(),
);

/**
 * The same for PostgreSQL, with `FOR UPDATE SKIP LOCKED`: a call of
 * `taskfence_deliver_messages_v2` (migrations 0105 and 0108), which takes over and dead-letters in the same
 * statement as `RECEIVE_SKIP_LOCKED` does.
 */
export const DELIVER_SKIP_LOCKED = prepared(
  (db, p: DeliverParams) =>
    sql<MessageRow>`select * from ${tableIn(db, 'taskfence_deliver_messages_v2')}(${p.handle}::text, ${p.now}::bigint,
      ${p.limit}::integer, ${p.maxAttempts}::integer)`,
);

/** `sendMessage`'s values, for `sendFolded`. */
export interface SendValues {
  readonly id: string;
  readonly from: string;
  readonly to: string;
  readonly kind: string;
  readonly payload: string | null;
  readonly now: number;
  readonly traceContext: string | null;
  readonly allowUnknown: boolean;
}

/**
 * `sendMessage`'s recipient check and insert in one statement (writable CTEs, PostgreSQL): `r`
 * reads the recipient run and its target's running successor, `known` whether the recipient is
 * a run, allowed unknown, or a terminal that was dispatched to (the separate reads' test, in
 * their order), and `made` inserts only then, announcing the inbox in its RETURNING (`announce`,
 * `wakeups.notifyExpression`). One row: `known`, the successor, and the message when made.
 */
export function sendFolded(db: Kysely<Database>, v: SendValues, announce: RawBuilder<unknown> | null) {
  const runs = tableIn(db, 'coordinator_runs');
  return sql<MessageRow & { known: boolean; successor: string | null }>`with r as (
      select (select s.coordinator_handle from ${runs} s where s.target_key = r.target_key and s.status = 'running'
        limit 1) as successor
      from ${runs} r where r.coordinator_handle = ${v.to}
    ), known as (
      select (exists (select 1 from r) or ${v.allowUnknown}::boolean
        or exists (select 1 from ${tableIn(db, 'dispatch_contexts')} d where d.terminal_handle = ${v.to})) as ok
    ), made as (
      insert into ${tableIn(db, 'messages')} (id, from_handle, to_handle, kind, payload, status, created_at, delivered_at,
        receipt, visible_at, dead_at, last_error, trace_context)
      select ${v.id}::text, ${v.from}::text, ${v.to}::text, ${v.kind}::text, ${v.payload}::text, 'pending',
        ${v.now}::bigint, null, null, null, null, null, ${v.traceContext}::text
      where (select ok from known)
      returning *${announce === null ? sql`` : sql`, ${announce} as announced`}
    )
    select made.*, known.ok as known, (select successor from r) as successor from known left join made on true`;
}
