/**
 * The statements of `store.paths`: the conflict check (one UNION ALL of primary-key lookups), the
 * lease writes, prepared per shape, and the chunking that keeps each statement bounded.
 */
import { sql, type Kysely, type QueryCreator, type RawBuilder } from 'kysely';
import { tableIn } from '../../query/schema.js';
import { decodePathLeaseKey, storedPathAncestorKeys, storedPathDescendantRange } from '../../domain/write-paths.js';
import { elements, prepared, wholeList } from '../../query/prepared.js';
import type { Database, PathLeaseRow } from '../../schema/database.js';
import { PATH_CONFLICT_REPORT_LIMIT, type PathLease } from './types.js';

/**
 * Large write sets (up to `MAX_WRITE_PATHS`) are handled in chunks inside the same transaction,
 * so no statement grows with the set: at most this many key ranges per statement (SQLite refuses
 * a compound SELECT of 500 terms and an expression tree of depth 1000; PostgreSQL's parser
 * recursion has a stack limit), and this many keys or rows in one `in (…)` list or insert.
 */
export const RANGE_CHUNK = 128;
export const LIST_CHUNK = 256;

/** `list` cut into consecutive pieces of at most `size` (one empty piece for an empty list). */
export function chunked<T>(list: readonly T[], size: number): (readonly T[])[] {
  if (list.length <= size) return [list];
  const out: T[][] = [];
  for (let i = 0; i < list.length; i += size) out.push(list.slice(i, i + size));
  return out.length > 0 ? out : [[]];
}

/** The bytewise ranges of `keys` and everything below them (one index range per key). */
export function descendantRanges(keys: readonly string[]): { froms: string[]; tos: string[] } {
  const ranges = keys.map(storedPathDescendantRange);
  return { froms: ranges.map((r) => r.from), tos: ranges.map((r) => r.to) };
}

/** `lease_key` on or below any of the ranges (see `descendantRanges`). */
function onOrBelow(froms: readonly string[], tos: readonly string[]): RawBuilder<boolean> {
  return sql<boolean>`(${sql.join(
    froms.map((from, i) => sql`(lease_key >= ${from} and lease_key < ${tos[i]})`),
    sql` or `,
  )})`;
}

export interface ConflictParams {
  readonly workspaceId: string;
  readonly now: number;
  /** The proper ancestors of the keys, stored and deduplicated. */
  readonly ancestors: readonly string[];
  readonly froms: readonly string[];
  readonly tos: readonly string[];
  /**
   * Also report the workspace's live exclusive lock, as the first row (`from_lock` 1): the
   * whole-workspace key, folded into the same statement (one round trip less per acquisition).
   */
  readonly withLock?: boolean;
}

export function conflictParams(workspaceId: string, keys: readonly string[], now: number): ConflictParams {
  return { workspaceId, now, ...keyRanges(keys) };
}

/**
 * The ancestors and descendant ranges of a set of lease keys, remembered for the sets seen last.
 * Keys hold no NUL, so the count and the joined keys name a set unambiguously.
 */
function keyRanges(keys: readonly string[]): Pick<ConflictParams, 'ancestors' | 'froms' | 'tos'> {
  const memoKey = `${keys.length}\u0000${keys.join('\u0000')}`;
  let ranges = KEY_RANGES.get(memoKey);
  if (!ranges) {
    ranges = Object.freeze({
      ancestors: [...new Set(keys.flatMap(storedPathAncestorKeys))],
      ...descendantRanges(keys),
    });
    if (KEY_RANGES.size >= KEY_RANGES_REMEMBERED) KEY_RANGES.delete(KEY_RANGES.keys().next().value!);
    KEY_RANGES.set(memoKey, ranges);
  }
  return ranges;
}
const KEY_RANGES_REMEMBERED = 512;
const KEY_RANGES = new Map<string, Pick<ConflictParams, 'ancestors' | 'froms' | 'tos'>>();

function conflictSql(db: Kysely<Database> | undefined, p: ConflictParams) {
  // Every live lease blocks, whatever its holder name: a grant never shares with another grant.
  const live = sql`workspace_id = ${p.workspaceId} and expires_at > ${p.now}`;
  const branches: RawBuilder<unknown>[] = [];
  if (p.ancestors.length > 0) {
    branches.push(
      sql`select lease_key, holder, expires_at, token from ${tableIn(db, 'path_leases')} where ${live} and lease_key in (${sql.join(p.ancestors)})`,
    );
  }
  p.froms.forEach((from, i) => {
    branches.push(
      sql`select lease_key, holder, expires_at, token from ${tableIn(db, 'path_leases')} where ${live} and lease_key >= ${from} and lease_key < ${p.tos[i]}`,
    );
  });
  // The limit is a literal: SQLite binds a JS number as a REAL, and a REAL limit costs more (see
  // IntegerLimitSqliteQueryCompiler in the SQLite dialect).
  const leases = sql`${sql.join(branches, sql` union all `)} limit ${sql.lit(PATH_CONFLICT_REPORT_LIMIT)}`;
  type ConflictRow = {
    lease_key: string;
    holder: string;
    expires_at: number;
    token: number | null;
    from_lock?: number;
  };
  if (!p.withLock) return sql<ConflictRow>`${leases}`;
  // The lock's row first, then at most the report limit of leases (a subquery keeps the limit theirs).
  const lock = sql`select '' as lease_key, holder, expires_at, token, 1 as from_lock
    from ${tableIn(db, 'workspace_locks')}
    where workspace_id = ${p.workspaceId} and holder is not null and expires_at > ${p.now}`;
  // No keys (a task of dynamic writes): the lock alone blocks.
  if (branches.length === 0) return sql<ConflictRow>`${lock}`;
  return sql<ConflictRow>`${lock} union all select lease_key, holder, expires_at, token, 0 as from_lock from (${leases}) l`;
}

/** The conflict check, prepared per (number of ancestors, number of keys, with the lock or not). */
export const FIND_CONFLICTS = prepared((db, p: ConflictParams, shape: string) => {
  const [ancestors, keys, withLock] = shape.split(':').map(Number) as [number, number, number];
  return conflictSql(db, {
    workspaceId: p.workspaceId,
    now: p.now,
    ancestors: elements(p.ancestors, ancestors),
    froms: elements(p.froms, keys),
    tos: elements(p.tos, keys),
    withLock: withLock === 1,
  });
});

interface PruneParams {
  readonly workspaceId: string;
  readonly stored: readonly string[];
  readonly now: number;
}

/** Expired leases of any grant on exactly these keys: garbage once a new grant takes them. */
const pruneExpired = (db: QueryCreator<Database>, p: PruneParams, n: number) =>
  db
    .deleteFrom('path_leases')
    .where('workspace_id', '=', p.workspaceId)
    .where('lease_key', 'in', elements(p.stored, n))
    .where('expires_at', '<=', p.now)
    // What was taken over, for the audit trail (no statement more).
    .returning(['holder', 'token', 'lease_key', 'expires_at']);

/** The workspace's next fencing token: one higher than every token granted there before. */
const takeToken = (db: QueryCreator<Database>, p: { readonly workspaceId: string; readonly now: number }) =>
  db
    .insertInto('path_lease_tokens')
    .values({ workspace_id: p.workspaceId, token: 1, updated_at: p.now })
    .onConflict((oc) =>
      oc.column('workspace_id').doUpdateSet({ token: sql<number>`path_lease_tokens.token + 1`, updated_at: p.now }),
    )
    .returning('token');

export const PRUNE_EXPIRED = prepared((db, p: PruneParams, n: number) => pruneExpired(db, p, n));

export const NEXT_TOKEN = prepared((db, p: { workspaceId: string; now: number }) => takeToken(db, p));

export const INSERT_LEASES = prepared(
  (
    db,
    p: {
      workspaceId: string;
      stored: readonly string[];
      holder: string;
      taskId: string | null;
      now: number;
      expiresAt: number;
      token: number;
    },
    n: number,
  ) =>
    db
      .insertInto('path_leases')
      .values(
        elements(p.stored, n).map((lease_key) => ({
          workspace_id: p.workspaceId,
          lease_key,
          holder: p.holder,
          task_id: p.taskId,
          acquired_at: p.now,
          expires_at: p.expiresAt,
          token: p.token,
        })),
      )
      .onConflict((oc) =>
        oc.columns(['workspace_id', 'lease_key', 'holder']).doUpdateSet((eb) => ({
          task_id: sql<string | null>`coalesce(${eb.ref('excluded.task_id')}, path_leases.task_id)`,
          acquired_at: eb.ref('excluded.acquired_at'),
          expires_at: eb.ref('excluded.expires_at'),
          token: eb.ref('excluded.token'),
        })),
      )
      .returningAll(),
);

/** The token row of a workspace, locked (`FOR UPDATE`): every grant there waits for the others, and for fenced writes. */
export const LOCK_TOKEN_ROW = prepared((db, p: { workspaceId: string }) =>
  db.selectFrom('path_lease_tokens').select('token').where('workspace_id', '=', p.workspaceId).forUpdate(),
);

export interface GrantParams extends ConflictParams {
  /** The keys to grant, stored (`encodePathLeaseKey`); the same keys `froms` and `tos` range over. */
  readonly stored: readonly string[];
  readonly holder: string;
  readonly taskId: string | null;
  readonly expiresAt: number;
}

/** `GRANT`'s rows: the blockers (none when granted), the lapsed leases taken over, and the grant's token. */
export type GrantRow = {
  kind: 'blocker' | 'lost' | 'granted';
  lease_key: string | null;
  holder: string | null;
  expires_at: number | string | null;
  token: number | string | null;
  from_lock: number | string | null;
};

/**
 * An acquisition's check and writes in one call of `taskfence_grant_paths_v1` (migration 0106,
 * PostgreSQL), run once the caller holds the workspace's key and its token row
 * (`LOCK_TOKEN_ROW`), so no other grant runs while it does: the conflict check of
 * `FIND_CONFLICTS` with the workspace lock, and only when there is no blocker, the next token,
 * other holders' lapsed leases on these keys pruned, and the grant's rows written. The function
 * keeps its plans per connection (the statement it replaced was planned on every call), each
 * read of `path_leases` bounded by the keys (see the migration). A refusal writes nothing.
 */
export const GRANT = prepared(
  (db, p: GrantParams) =>
    sql<GrantRow>`select * from ${tableIn(db, 'taskfence_grant_paths_v1')}(${p.workspaceId}::text, ${p.holder}::text,
      ${p.taskId}::text, ${p.now}::bigint, ${p.expiresAt}::bigint, ${textArray(p.ancestors)}, ${textArray(p.froms)},
      ${textArray(p.tos)}, ${textArray(p.stored)})`,
);

/** A list of text as one `text[]` parameter (the driver sends a JS array as an array literal). */
function textArray(list: readonly string[]): RawBuilder<string[]> {
  return sql<string[]>`${wholeList(list)}::text[]`;
}

/** A holder's leases in a workspace, all of them (shape -1) or those on or below n keys. */
export const RELEASE = prepared(
  (db, p: { workspaceId: string; holder: string; froms: readonly string[]; tos: readonly string[] }, n: number) => {
    const query = db.deleteFrom('path_leases').where('workspace_id', '=', p.workspaceId).where('holder', '=', p.holder);
    return (n < 0 ? query : query.where(onOrBelow(elements(p.froms, n), elements(p.tos, n)))).returning('lease_key');
  },
);

/** Extends a holder's live leases on or below n keys. */
export const RENEW = prepared(
  (
    db,
    p: {
      workspaceId: string;
      holder: string;
      now: number;
      expiresAt: number;
      froms: readonly string[];
      tos: readonly string[];
    },
    n: number,
  ) =>
    db
      .updateTable('path_leases')
      .set({ expires_at: p.expiresAt })
      .where('workspace_id', '=', p.workspaceId)
      .where('holder', '=', p.holder)
      .where('expires_at', '>', p.now)
      .where(onOrBelow(elements(p.froms, n), elements(p.tos, n)))
      .returningAll(),
);

/**
 * `renewPaths(lease)` of a grant with leases in one statement (writable CTEs, PostgreSQL): `held`
 * counts the grant's rows and whether every one is unexpired (`isLive`'s test: `keys` rows, all
 * live), and `renewed` extends them only then. One row: `live`.
 */
export const RENEW_IF_LIVE = prepared(
  (db, p: { workspaceId: string; token: number; holder: string; now: number; expiresAt: number; keys: number }) => {
    const leases = tableIn(db, 'path_leases');
    const grant = sql`workspace_id = ${p.workspaceId} and token = ${p.token} and holder = ${p.holder}`;
    return sql<{ live: boolean }>`with held as (
        select count(*) = ${p.keys}::bigint and coalesce(bool_and(expires_at > ${p.now}), false) as live
        from ${leases} where ${grant}
      ), renewed as (
        update ${leases} set expires_at = ${p.expiresAt} where ${grant} and (select live from held)
      )
      select live from held`;
  },
);

/**
 * The conflict check as one statement: live leases (`expires_at > now`) of any grant in the
 * workspace that overlap any of `keys` (an antichain from `leaseKeys`). A
 * UNION ALL of one branch for the keys' proper ancestors, by equality, and one bytewise range
 * per key for the key itself and its descendants; each branch is a lookup on the primary key
 * (workspace_id, lease_key), and LIMIT stops at the first few conflicts, so the cost does not
 * grow with the number of unrelated leases in the workspace. Exported so tests and benchmarks
 * can EXPLAIN it.
 *
 * @example
 * const { rows } = await buildPathConflictQuery(workspaceId, 'agent-1', ['src'], Date.now(), store.db).execute(store.db);
 * // (pass the Kysely it runs on, so a PostgreSQL `schema` qualifies the table)
 */
export function buildPathConflictQuery(
  workspaceId: string,
  /** Unused since schema 0095 (every live lease blocks, whatever its holder); kept for the call shape. */
  _holder: string,
  keys: readonly string[],
  now: number,
  db?: Kysely<Database>,
) {
  return conflictSql(db, conflictParams(workspaceId, keys, now));
}

/** Maps a `path_leases` row to the public shape. */
export function toPathLease(row: PathLeaseRow): PathLease {
  return {
    workspaceId: row.workspace_id,
    key: decodePathLeaseKey(row.lease_key),
    holder: row.holder,
    taskId: row.task_id,
    acquiredAt: Number(row.acquired_at),
    expiresAt: Number(row.expires_at),
    token: row.token === null ? null : Number(row.token),
  };
}

/** The rows of one grant (workspace, token); `holder` is checked too, so a forged token of another holder finds nothing. */
export function grantRows(
  db: Kysely<Database>,
  lease: { readonly resource: string; readonly holder: string; readonly token: number },
) {
  return db
    .selectFrom('path_leases')
    .where('workspace_id', '=', lease.resource)
    .where('token', '=', lease.token)
    .where('holder', '=', lease.holder);
}
