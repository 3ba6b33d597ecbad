import { sql, type Kysely, type RawBuilder } from 'kysely';
import { tableIn } from '../query/schema.js';
import type { MigrationDefinition } from './types.js';

/**
 * The inbox's hand-outs as PL/pgSQL functions (issue 24), PostgreSQL only:
 * - `taskfence_receive_messages_v1`: `receiveMessages`' one statement (take-over of the adopted
 *   runs' messages, dead-lettering of lapsed last attempts, the leased hand-out);
 * - `taskfence_deliver_messages_v1`: `deliverPendingMessages`' one statement (the same, the
 *   hand-out acked at once).
 *
 * Why: sent by the client, the statement of six CTEs was planned on every call, about 0.45 ms of
 * a receive's 1 ms of server time. A function keeps its plans per connection, as the dispatch
 * functions of 0101 do: no session state, so a transaction-mode pooler is unaffected.
 *
 * Kept plans (see 0101, "Kept plans"): a plan made while the tables are small is kept for the
 * connection until the next ANALYZE. The statement is written so that such a plan stays bounded
 * by the inbox once the tables grow (`test/postgres/kept-plans.test.ts` counts the rows read):
 * - both functions run with `enable_seqscan = off`: without it the kept plans scanned all of
 *   `messages` on every call;
 * - the adopted runs' messages (`theirs`, `take`) are reached from `old` by `LATERAL`, one
 *   inbox index range per adopted handle: written as `to_handle in (select handle from old)`,
 *   a kept plan walked every pending message of the store and joined `old` to it;
 * - the re-check on the rows handed out is `(…) is true` (0104's `STILL_READY`), which no
 *   index can serve: deliver's `status = 'pending'` kept a plan through the inbox index on
 *   status alone, every pending message again.
 * `theirs` now takes the oldest `p_limit` of each adopted inbox rather than of all of them;
 * `next` keeps the oldest `p_limit` of those and `mine`, the same rows as before.
 *
 * Otherwise the statement the repository sent: same snapshot, same locks (`FOR UPDATE SKIP
 * LOCKED` on the rows handed out); each returns the rows handed out as `messages` rows.
 * Additive: a release that does not know them keeps sending its statements. The literal is
 * `LAPSED_ERROR` of the delivery statements.
 */
export const migration0105: MigrationDefinition = {
  version: 105,
  name: 'message_functions',
  functions: ['taskfence_receive_messages_v1', 'taskfence_deliver_messages_v1'],
  async up({ db, types }) {
    if (!types.storedFunctions) return;
    await sql`${createReceive(db)}`.execute(db);
    await sql`${createDeliver(db)}`.execute(db);
  },
  async down({ db, types }) {
    if (!types.storedFunctions) return;
    await sql`drop function if exists ${tableIn(db, 'taskfence_deliver_messages_v1')}(text, bigint, integer, integer)`.execute(
      db,
    );
    await sql`drop function if exists ${tableIn(db, 'taskfence_receive_messages_v1')}(text, bigint, integer, bigint, text, integer)`.execute(
      db,
    );
  },
};

/** The versions of the hand-out functions: 1 (this migration), 2 (0108: `dead` by one array of inboxes). */
export type HandOutVersion = 1 | 2;

/**
 * The CTEs both hand-outs share, over the functions' `p_handle`, `p_now`, `p_limit` and
 * `p_max_attempts`:
 * - `old`: the handles of the stopped runs of the target whose running run is `p_handle`'s (none
 *   when it is not a running coordinator), whose pending messages this hand-out takes over;
 * - `dead` dead-letters the lapsed last attempts of the inbox and of `old`'s inboxes;
 * - `mine` and `theirs` lock the oldest visible rows of the inbox and of each of `old`'s inboxes
 *   with `FOR UPDATE SKIP LOCKED`, and `next` keeps the oldest `p_limit` of them by `seq`;
 * - `take` re-homes `old`'s other pending messages (leased ones included) to `p_handle`,
 *   skipping rows another transaction holds: the next hand-out takes those. The hand-out itself
 *   re-homes the rows of `next`, and `dead` the rows it kills.
 *
 * All read one snapshot. No row is written twice: `next` never takes a row `dead` moves
 * (`attempts < p_max_attempts`), and `take` skips both. `take` skips locked rows so that two
 * consumers of one inbox in a takeover never wait on each other's `theirs` (a deadlock).
 */
function deadAndNext(db: Kysely<any>, version: HandOutVersion) {
  const messages = tableIn(db, 'messages');
  const runs = tableIn(db, 'coordinator_runs');
  // The inboxes `dead` reads: v1's `or` was planned as one scan of the lapsed leases of every
  // inbox (0108); v2 names them as one array, an index condition of the leased index.
  const inboxes =
    version === 1
      ? sql`(to_handle = p_handle or to_handle in (select handle from old))`
      : sql`to_handle = any(array(select p_handle union all select handle from old))`;
  return sql`with old as (
      select o.coordinator_handle as handle from ${runs} o
      where o.status <> 'running' and o.target_key = (
        select me.target_key from ${runs} me where me.coordinator_handle = p_handle and me.status = 'running')
    ), dead as (
      update ${messages} set to_handle = p_handle, dead_at = p_now,
        last_error = coalesce(last_error, 'its lease lapsed on its last attempt')
      where ${inboxes} and status = 'pending'
        and dead_at is null and visible_at <= p_now and attempts >= p_max_attempts
      returning id
    ), mine as materialized (
      select id, seq from ${messages}
      where to_handle = p_handle and status = 'pending' and dead_at is null
        and (visible_at is null or visible_at <= p_now) and attempts < p_max_attempts
      order by seq
      limit p_limit
      for update skip locked
    ), theirs as materialized (
      select t.id, t.seq from old cross join lateral (
        select id, seq from ${messages}
        where to_handle = old.handle and status = 'pending' and dead_at is null
          and (visible_at is null or visible_at <= p_now) and attempts < p_max_attempts
        order by seq
        limit p_limit
        for update skip locked) t
    ), next as (
      select id from (select id, seq from mine union all select id, seq from theirs) both_inboxes
      order by seq
      limit p_limit
    ), take as (
      update ${messages} set to_handle = p_handle
      where id in (
        select x.id from old cross join lateral (
          select id from ${messages}
          where to_handle = old.handle and status = 'pending'
            and id not in (select id from next) and id not in (select id from dead)
          for update skip locked) x)
    )`;
}

/**
 * A hand-out function: `name(params)` returning the rows `handOut` (the final UPDATE over `next`)
 * returns, after the shared CTEs (`deadAndNext`), with its plans kept bounded (see above).
 */
function handOutFunction(
  db: Kysely<any>,
  version: HandOutVersion,
  name: string,
  params: RawBuilder<unknown>,
  handOut: RawBuilder<unknown>,
) {
  return sql`create or replace function ${tableIn(db, name)}(
    ${params})
  returns setof ${tableIn(db, 'messages')}
  language plpgsql volatile
  set enable_seqscan = off
  as $fn$
  begin
    return query
    ${deadAndNext(db, version)}
    ${handOut}
    returning *;
  end
  $fn$`;
}

/** `receiveMessages`: the rows handed out, each leased until `p_visible_at` under a new receipt. */
export function createReceive(db: Kysely<any>, version: HandOutVersion = 1) {
  return handOutFunction(
    db,
    version,
    `taskfence_receive_messages_v${version}`,
    sql`p_handle text, p_now bigint, p_limit integer, p_visible_at bigint, p_nonce text, p_max_attempts integer`,
    sql`update ${tableIn(db, 'messages')} set to_handle = p_handle, attempts = attempts + 1, visible_at = p_visible_at,
      receipt = cast(attempts + 1 as text) || '.' || p_nonce || '.' || id
    where id in (select id from next) and (visible_at is null or visible_at <= p_now) is true`,
  );
}

/** `deliverPendingMessages`: the rows handed out, delivered (acked) at once. */
export function createDeliver(db: Kysely<any>, version: HandOutVersion = 1) {
  return handOutFunction(
    db,
    version,
    `taskfence_deliver_messages_v${version}`,
    sql`p_handle text, p_now bigint, p_limit integer, p_max_attempts integer`,
    sql`update ${tableIn(db, 'messages')} set to_handle = p_handle, status = 'delivered', delivered_at = p_now,
      attempts = attempts + 1, visible_at = null
    where id in (select id from next) and (status = 'pending') is true`,
  );
}
