import { sql, type Kysely } from 'kysely';
import { tableIn } from '../query/schema.js';
import type { MigrationDefinition } from './types.js';

/**
 * The path grant as a PL/pgSQL function (issue 24), PostgreSQL only:
 * `taskfence_grant_paths_v1`, the check and the writes of `tryAcquirePaths`, `acquirePaths` and
 * `claimTask`'s acquisition, which the repository sent as one statement of five CTEs (`GRANT`).
 *
 * Why: sent by the client, that statement was planned on every call, 0.3–0.45 ms of a grant's
 * 0.9 ms round trip, and the path cycle ran at 0.81–0.86 of the raw statements it replaced. A
 * function keeps its plans per connection (as 0101's and 0105's do): no session state, so a
 * transaction-mode pooler is unaffected.
 *
 * Kept plans (see 0101 and 0105): a plan made while `path_leases` is small is kept for the
 * connection until the next ANALYZE. Both of its indexes lead with the workspace, and on a
 * near-empty table a kept plan picks `path_leases_holder_idx` (workspace, holder) wherever it
 * costs no more than the primary key: every lease of the workspace, or of the holder there, read
 * on every grant. (An earlier attempt, the statement moved into a function as it was, did that.)
 * So every read of `path_leases` here gives the primary key an index condition on the key that
 * the holder index cannot serve, and no condition the holder index could use alone:
 * - the ancestors and each key's range are reached from `unnest(…)` by `LATERAL` subqueries with
 *   a `LIMIT` (a subquery with a limit is not flattened, so the join order stays: the keys first,
 *   then one primary-key lookup or range per key);
 * - the lapsed leases on the keys are read per key, in a loop, by `lease_key = v_key` (written
 *   `lease_key = any(p_stored)`, a kept plan walked the holder index: 1,200,405 rows for 10
 *   grants at 60,000 leases);
 * - the holder's own lapsed leases are picked by `(holder = p_holder) is true`, which no index
 *   can serve (as 0105's re-checks): written `holder = p_holder`, the holder index ties with the
 *   primary key and wins, 600,315 rows;
 * and the function runs with `enable_seqscan = off`, as 0105's. `test/postgres/kept-plans.test.ts`
 * counts what a kept plan reads once the workspace grew (135 rows for those 10 grants).
 *
 * Otherwise the statement the repository sent, as steps under the caller's locks (the workspace's
 * key and its token row, taken before the call, so no other grant runs between the steps):
 * the blockers (the workspace's live lock first, `from_lock` 1, then at most 16 overlapping live
 * leases), and only when there are none: the next token, the other holders' lapsed leases on the
 * keys deleted, the holder's own lapsed ones read (both returned as `lost`, for the trail), the
 * keys written under the token, and one `granted` row with the token and the count written.
 * A refusal writes nothing. Additive: a release that does not know it keeps sending `GRANT`.
 */
export const migration0106: MigrationDefinition = {
  version: 106,
  name: 'path_grant_function',
  functions: ['taskfence_grant_paths_v1'],
  async up({ db, types }) {
    if (!types.storedFunctions) return;
    await sql`${createGrant(db)}`.execute(db);
  },
  async down({ db, types }) {
    if (!types.storedFunctions) return;
    await sql`drop function if exists ${tableIn(db, 'taskfence_grant_paths_v1')}(text, text, text, bigint, bigint, text[], text[], text[], text[])`.execute(
      db,
    );
  },
};

/** `PATH_CONFLICT_REPORT_LIMIT` as of this migration, a literal: a migration's text never changes once released. */
const REPORT_LIMIT = 16;

function createGrant(db: Kysely<any>) {
  const leases = tableIn(db, 'path_leases');
  const limit = sql.lit(REPORT_LIMIT);
  return sql`create or replace function ${tableIn(db, 'taskfence_grant_paths_v1')}(
    p_workspace text, p_holder text, p_task text, p_now bigint, p_expires_at bigint,
    p_ancestors text[], p_froms text[], p_tos text[], p_stored text[])
  returns table (kind text, lease_key text, holder text, expires_at bigint, token bigint, from_lock bigint)
  language plpgsql volatile
  set enable_seqscan = off
  as $fn$
  #variable_conflict use_column
  declare
    v_token bigint;
    v_made bigint;
    v_key text;
  begin
    return query
      select 'blocker'::text, ''::text, w.holder, w.expires_at, w.token, 1::bigint
      from ${tableIn(db, 'workspace_locks')} w
      where w.workspace_id = p_workspace and w.holder is not null and w.expires_at > p_now
      union all
      select 'blocker'::text, l.lease_key::text, l.holder, l.expires_at, l.token, 0::bigint from (
        select a.lease_key, a.holder, a.expires_at, a.token
        from unnest(p_ancestors) k(lease_key) cross join lateral (
          select x.lease_key, x.holder, x.expires_at, x.token from ${leases} x
          where x.workspace_id = p_workspace and x.lease_key = k.lease_key and x.expires_at > p_now
          limit ${limit}) a
        union all
        select d.lease_key, d.holder, d.expires_at, d.token
        from unnest(p_froms, p_tos) r(lease_from, lease_to) cross join lateral (
          select x.lease_key, x.holder, x.expires_at, x.token from ${leases} x
          where x.workspace_id = p_workspace and x.lease_key >= r.lease_from and x.lease_key < r.lease_to
            and x.expires_at > p_now
          limit ${limit}) d
        limit ${limit}) l;
    if found then
      return;
    end if;
    insert into ${tableIn(db, 'path_lease_tokens')} as t (workspace_id, token, updated_at)
    values (p_workspace, 1, p_now)
    on conflict (workspace_id) do update set token = t.token + 1, updated_at = excluded.updated_at
    returning t.token into v_token;
    foreach v_key in array p_stored loop
      return query
        delete from ${leases} x
        where x.workspace_id = p_workspace and x.lease_key = v_key and x.expires_at <= p_now
          and x.holder <> p_holder
        returning 'lost'::text, x.lease_key::text, x.holder, x.expires_at, x.token, 0::bigint;
      return query
        select 'lost'::text, x.lease_key::text, x.holder, x.expires_at, x.token, 0::bigint from ${leases} x
        where x.workspace_id = p_workspace and x.lease_key = v_key and x.expires_at <= p_now
          and (x.holder = p_holder) is true;
    end loop;
    insert into ${leases} as x (workspace_id, lease_key, holder, task_id, acquired_at, expires_at, token)
    select p_workspace, k.lease_key, p_holder, p_task, p_now, p_expires_at, v_token
    from unnest(p_stored) k(lease_key)
    on conflict (workspace_id, lease_key, holder) do update set task_id = excluded.task_id,
      acquired_at = excluded.acquired_at, expires_at = excluded.expires_at, token = excluded.token;
    get diagnostics v_made = row_count;
    return query select 'granted'::text, null::text, null::text, null::bigint, v_token, v_made;
  end
  $fn$`;
}
