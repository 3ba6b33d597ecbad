import { sql, type Kysely, type RawBuilder, type Transaction } from 'kysely';
import { InvalidArgumentError, NotFoundError, TaskfenceError } from '../errors.js';
import {
  WHOLE_WORKSPACE_KEY,
  decodePathLeaseKey,
  encodePathLeaseKey,
  leaseKeys,
  storedPathAncestorKeys,
  storedPathDescendantRange,
} from '../domain/write-paths.js';
import type { Database, PathLeaseRow, TaskStatus } from '../schema/database.js';
import type { StoreContext } from './context.js';
import { clampTimerMs } from '../timers.js';
import { elements, prepared } from '../query/prepared.js';
import {
  optionalId,
  optionalIdFilter,
  optionalInput,
  requireId,
  requireInput,
  requirePathList,
  requirePositiveMs,
} from './validate.js';
import { tableIn } from '../dialects/schema.js';
import { pathsLockKey } from './shared/lock-keys.js';

/** TTL of the leases `claimTask` takes when the caller gives none. */
export const DEFAULT_PATH_LEASE_TTL_MS = 60_000;

/** At most this many conflicts are reported by a failed acquisition (the check stops there). */
export const PATH_CONFLICT_REPORT_LIMIT = 16;

/**
 * Large write sets (up to `MAX_WRITE_PATHS`) are handled in chunks inside the same transaction,
 * so no statement grows with the set: at most this many key ranges per statement (SQLite refuses
 * a compound SELECT of 500 terms and an expression tree of depth 1000; PostgreSQL's parser
 * recursion has a stack limit), and this many keys or rows in one `in (…)` list or insert.
 */
const RANGE_CHUNK = 128;
const LIST_CHUNK = 256;

/** `list` cut into consecutive pieces of at most `size` (one empty piece for an empty list). */
function chunked<T>(list: readonly T[], size: number): (readonly T[])[] {
  if (list.length <= size) return [list];
  const out: T[][] = [];
  for (let i = 0; i < list.length; i += size) out.push(list.slice(i, i + size));
  return out.length > 0 ? out : [[]];
}

/** One live lease on a key of a workspace. */
export interface PathLease {
  readonly workspaceId: string;
  /** The lease key: a normalized path, or `""` for the whole workspace. */
  readonly key: string;
  readonly holder: string;
  /** The task the lease was taken for (`claimTask`, or `acquirePaths` with `taskId`). */
  readonly taskId: string | null;
  readonly acquiredAt: number;
  readonly expiresAt: number;
}

/** A live lease of another holder that overlaps what was asked for. */
export interface PathLeaseConflict {
  readonly key: string;
  readonly holder: string;
  readonly expiresAt: number;
}

export interface AcquirePathsInput {
  readonly workspaceId: string;
  readonly holder: string;
  /** Paths to lease, reduced by `leaseKeys` (globs to their prefix; `"."`, `""` or `"*"` = the whole workspace). */
  readonly paths: readonly string[];
  readonly ttlMs: number;
  /** Tags the leases with a task, so that `submitTaskResult` releases them too. */
  readonly taskId?: string | null;
}

export type TryAcquirePathsResult =
  | { readonly acquired: true; readonly leases: readonly PathLease[] }
  | { readonly acquired: false; readonly conflicts: readonly PathLeaseConflict[] };

export interface AcquirePathsOptions {
  /** Give up after waiting this long (real time, not the store clock). */
  readonly timeoutMs: number;
  /**
   * Longest wait between two checks when no wake-up comes (default: the store's
   * `wakeFallbackMs`). A release wakes the waiter at once; a lease that merely expires announces
   * nothing, so this bounds how late its waiter notices.
   */
  readonly maxPollMs?: number;
}

export interface ReleasePathsInput {
  readonly workspaceId: string;
  readonly holder: string;
  /** Release only the holder's leases on these paths and below them; omitted = all its leases in the workspace. */
  readonly paths?: readonly string[];
}

export interface RenewPathsInput {
  readonly workspaceId: string;
  readonly holder: string;
  /**
   * Required: the paths the holder believes it holds. Renewal extends its live leases on or below
   * them and reports in `lost` every one of them it no longer holds, so a heartbeat always learns
   * that it lost a lease (expired, taken over by another holder, released or pruned).
   */
  readonly paths: readonly string[];
  readonly ttlMs: number;
}

export interface RenewPathsResult {
  /** The leases now extended to `now + ttlMs`. */
  readonly renewed: readonly PathLease[];
  /**
   * The lease keys of `paths` the holder no longer holds live (no live lease of the holder on or
   * below them): they expired, were taken over by another holder, or were released. The holder
   * must stop writing there.
   */
  readonly lost: readonly string[];
}

/** How a claimed task's write set was leased. */
export type TaskWriteMode = 'whole-workspace' | 'paths' | 'dynamic';

export type PathClaimResult =
  | { readonly claimed: true; readonly mode: TaskWriteMode; readonly leases: readonly PathLease[] }
  | { readonly claimed: false; readonly mode: TaskWriteMode; readonly conflicts: readonly PathLeaseConflict[] };

export interface PathClaimOptions {
  /** Lease TTL (default `DEFAULT_PATH_LEASE_TTL_MS`); renew with `renewPaths`. */
  readonly ttlMs?: number;
}

export interface PathTaskResult {
  readonly status: Extract<TaskStatus, 'done' | 'failed'>;
}

export interface PathTaskSubmission {
  readonly status: PathTaskResult['status'];
  /** Keys of the task's leases that were released. */
  readonly released: readonly string[];
}

/** `acquirePaths` waited `timeoutMs` and the set was still blocked; `blockers` are the last conflicts seen. */
export class PathLeaseTimeoutError extends TaskfenceError {
  readonly code = 'PATH_LEASE_TIMEOUT';
  constructor(
    readonly workspaceId: string,
    readonly holder: string,
    readonly keys: readonly string[],
    readonly timeoutMs: number,
    readonly blockers: readonly PathLeaseConflict[],
  ) {
    super(
      `Holder ${JSON.stringify(holder)} could not lease ${keys.map(showKey).join(', ')} in workspace ${workspaceId} ` +
        `within ${timeoutMs} ms; blocked by ${blockers.map((b) => `${showKey(b.key)} held by ${JSON.stringify(b.holder)}`).join(', ')}. ` +
        'Wait for those holders to release (or their leases to expire), or raise timeoutMs.',
    );
  }
}

/** Why `claimTask` or `submitTaskResult` refused. */
export type PathClaimRefusal = 'task_has_no_workspace' | 'task_finished' | 'held_by_other_holder';

/** `claimTask` / `submitTaskResult` refused: the task has no workspace, is finished, or another holder holds its leases. */
export class PathClaimRefusedError extends TaskfenceError {
  readonly code = 'PATH_CLAIM_REFUSED';
  constructor(
    readonly taskId: string,
    readonly holder: string,
    readonly reason: PathClaimRefusal,
    readonly detail: string,
  ) {
    super(`Task ${taskId} refused for holder ${JSON.stringify(holder)}: ${detail}.`);
  }
}

/** Path-scoped write leases (SPEC §5, seed 002): durable, per workspace, across processes. */
export interface PathLeaseRepository {
  /**
   * Leases every key of `paths` for `holder`, or nothing: in one write transaction (serialized
   * per workspace) it looks for live leases of other holders that overlap any key — ancestors by
   * equality, descendants by one bytewise key range, never a scan of the workspace — and only if
   * there are none writes all the leases. Keys the holder already holds are re-leased (new TTL).
   * Expired leases never block.
   *
   * @example
   * const r = await store.paths.tryAcquirePaths({ workspaceId, holder, paths: ['src/a.ts'], ttlMs: 30_000 });
   * if (!r.acquired) console.log(r.conflicts); // [{ key: 'src', holder: 'agent-2', expiresAt }]
   */
  tryAcquirePaths(input: AcquirePathsInput): Promise<TryAcquirePathsResult>;

  /**
   * Like `tryAcquirePaths`, but waits (jittered polling) until the whole set is free, then takes
   * it at once. It holds nothing while it waits, so waiters can never deadlock each other.
   * Throws `PathLeaseTimeoutError` naming the blockers after `timeoutMs`.
   *
   * @example
   * const leases = await store.paths.acquirePaths({ workspaceId, holder, paths: ['docs'], ttlMs: 30_000 }, { timeoutMs: 5_000 });
   */
  acquirePaths(input: AcquirePathsInput, options: AcquirePathsOptions): Promise<readonly PathLease[]>;

  /**
   * Deletes the holder's leases in the workspace (only those on or below `paths`, if given) and
   * returns their keys. Releasing what is not held is not an error.
   *
   * @example
   * await store.paths.releasePaths({ workspaceId, holder, paths: ['src'] });
   */
  releasePaths(input: ReleasePathsInput): Promise<{ readonly released: readonly string[] }>;

  /**
   * Extends the holder's live leases on or below `paths` (required) to now + `ttlMs`, atomically
   * with respect to acquisitions in the workspace. An expired lease is not revived: every key of
   * `paths` the holder no longer holds live is reported in `lost`, whether it expired, was taken
   * over by another holder or was released, since another holder may have the path now.
   *
   * @example
   * const { lost } = await store.paths.renewPaths({ workspaceId, holder, ttlMs: 30_000, paths: ['src'] });
   */
  renewPaths(input: RenewPathsInput): Promise<RenewPathsResult>;

  /** Live leases of a workspace (all holders, or one), ordered by key; for diagnostics and tests. An unknown workspace is a `NotFoundError`. */
  listPathLeases(filter: { readonly workspaceId: string; readonly holder?: string }): Promise<PathLease[]>;

  /** Deletes expired leases of a workspace (maintenance; they never block anyone anyway). Returns how many. */
  pruneExpiredPaths(workspaceId: string): Promise<number>;

  /**
   * Claims a task for `holder` by leasing its write set in the task's workspace, in one
   * transaction with marking it `in_progress`: `writes` omitted (null) leases the whole workspace,
   * which conflicts with every other lease there; a path list leases those paths (disjoint tasks
   * run in parallel); `[]` is dynamic mode: nothing is leased now and the holder calls
   * `acquirePaths({ …, taskId })` as it goes. Paths are normalized here (a bad stored path throws
   * `InvalidWritePathError`). On conflict nothing changes and the blockers are returned.
   *
   * @example
   * const r = await store.paths.claimTask(task.id, 'agent-1', { ttlMs: 30_000 });
   */
  claimTask(taskId: string, holder: string, options?: PathClaimOptions): Promise<PathClaimResult>;

  /**
   * Records a task's result (`done` or `failed`) and releases every lease of that task — claim
   * leases and dynamic ones taken with its `taskId` — in the same transaction. Refused with
   * `PathClaimRefusedError` if another holder holds a live lease of the task or it is already finished.
   *
   * @example
   * await store.paths.submitTaskResult(task.id, 'agent-1', { status: 'done' });
   */
  submitTaskResult(taskId: string, holder: string, result: PathTaskResult): Promise<PathTaskSubmission>;
}

const FINISHED: readonly TaskStatus[] = ['done', 'failed', 'cancelled'];

function showKey(key: string): string {
  return key === WHOLE_WORKSPACE_KEY ? 'the whole workspace' : JSON.stringify(key);
}

/** The wake-up topic of a workspace's path leases: announced when leases in it are released. */
const pathsTopic = (workspaceId: string) => `paths:${workspaceId}`;

/** The bytewise ranges of `keys` and everything below them (one index range per key). */
function descendantRanges(keys: readonly string[]): { froms: string[]; tos: string[] } {
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

interface ConflictParams {
  readonly workspaceId: string;
  readonly holder: string;
  readonly now: number;
  /** The proper ancestors of the keys, stored and deduplicated. */
  readonly ancestors: readonly string[];
  readonly froms: readonly string[];
  readonly tos: readonly string[];
}

function conflictParams(workspaceId: string, holder: string, keys: readonly string[], now: number): ConflictParams {
  return {
    workspaceId,
    holder,
    now,
    ancestors: [...new Set(keys.flatMap(storedPathAncestorKeys))],
    ...descendantRanges(keys),
  };
}

function conflictSql(db: Kysely<Database> | undefined, p: ConflictParams) {
  const live = sql`workspace_id = ${p.workspaceId} and holder <> ${p.holder} and expires_at > ${p.now}`;
  const branches: RawBuilder<unknown>[] = [];
  if (p.ancestors.length > 0) {
    branches.push(
      sql`select lease_key, holder, expires_at from ${tableIn(db, 'path_leases')} where ${live} and lease_key in (${sql.join(p.ancestors)})`,
    );
  }
  p.froms.forEach((from, i) => {
    branches.push(
      sql`select lease_key, holder, expires_at from ${tableIn(db, 'path_leases')} where ${live} and lease_key >= ${from} and lease_key < ${p.tos[i]}`,
    );
  });
  return sql<{
    lease_key: string;
    holder: string;
    expires_at: number;
  }>`${sql.join(branches, sql` union all `)} limit ${PATH_CONFLICT_REPORT_LIMIT}`;
}

/** The conflict check, prepared per (number of ancestors, number of keys). */
const FIND_CONFLICTS = prepared((db, p: ConflictParams, shape: string) => {
  const [ancestors, keys] = shape.split(':').map(Number) as [number, number];
  return conflictSql(db, {
    workspaceId: p.workspaceId,
    holder: p.holder,
    now: p.now,
    ancestors: elements(p.ancestors, ancestors),
    froms: elements(p.froms, keys),
    tos: elements(p.tos, keys),
  });
});

/** Expired leases of any holder on exactly these keys: garbage once a new holder takes them. */
const PRUNE_EXPIRED = prepared(
  (db, p: { workspaceId: string; stored: readonly string[]; holder: string; now: number }, n: number) =>
    db
      .deleteFrom('path_leases')
      .where('workspace_id', '=', p.workspaceId)
      .where('lease_key', 'in', elements(p.stored, n))
      .where('holder', '<>', p.holder)
      .where('expires_at', '<=', p.now),
);

const INSERT_LEASES = prepared(
  (
    db,
    p: {
      workspaceId: string;
      stored: readonly string[];
      holder: string;
      taskId: string | null;
      now: number;
      expiresAt: number;
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
        })),
      )
      .onConflict((oc) =>
        oc.columns(['workspace_id', 'lease_key', 'holder']).doUpdateSet((eb) => ({
          task_id: sql<string | null>`coalesce(${eb.ref('excluded.task_id')}, path_leases.task_id)`,
          acquired_at: eb.ref('excluded.acquired_at'),
          expires_at: eb.ref('excluded.expires_at'),
        })),
      )
      .returningAll(),
);

/** A holder's leases in a workspace, all of them (shape -1) or those on or below n keys. */
const RELEASE = prepared(
  (db, p: { workspaceId: string; holder: string; froms: readonly string[]; tos: readonly string[] }, n: number) => {
    const query = db.deleteFrom('path_leases').where('workspace_id', '=', p.workspaceId).where('holder', '=', p.holder);
    return (n < 0 ? query : query.where(onOrBelow(elements(p.froms, n), elements(p.tos, n)))).returning('lease_key');
  },
);

/** Extends a holder's live leases on or below n keys. */
const RENEW = prepared(
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
 * The conflict check as one statement: live leases (`expires_at > now`) of holders other than
 * `holder` in the workspace that overlap any of `keys` (an antichain from `leaseKeys`). A
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
  holder: string,
  keys: readonly string[],
  now: number,
  db?: Kysely<Database>,
) {
  return conflictSql(db, conflictParams(workspaceId, holder, keys, now));
}

/**
 * Builds `store.paths` on a store context. Every write runs in `dialect.writeTransaction`; the
 * per-workspace `lockKey('paths:<workspace>')` serializes conflict check and insert on PostgreSQL
 * (SQLite's BEGIN IMMEDIATE already does).
 *
 * @example
 * const paths = createPathLeaseRepository(createStoreContext(dialect));
 */
export function createPathLeaseRepository(ctx: StoreContext): PathLeaseRepository {
  const { dialect } = ctx;

  /** Live leases of other holders overlapping any of `keys`, the first few (see `buildPathConflictQuery`). */
  async function findConflicts(
    trx: Transaction<Database>,
    workspaceId: string,
    holder: string,
    keys: readonly string[],
    now: number,
  ): Promise<PathLeaseConflict[]> {
    const all = conflictParams(workspaceId, holder, keys, now);
    const ancestorChunks = chunked(all.ancestors, LIST_CHUNK);
    const keyChunks = chunked(keys, RANGE_CHUNK);
    const seen = new Set<string>();
    const conflicts: PathLeaseConflict[] = [];
    // One statement for an ordinary set; a large one is checked chunk by chunk, stopping at the report limit.
    for (
      let i = 0;
      i < Math.max(ancestorChunks.length, keyChunks.length) && conflicts.length < PATH_CONFLICT_REPORT_LIMIT;
      i++
    ) {
      const ancestors = ancestorChunks[i] ?? [];
      const chunkKeys = keyChunks[i] ?? [];
      if (ancestors.length === 0 && chunkKeys.length === 0) continue;
      const params = { workspaceId, holder, now, ancestors, ...descendantRanges(chunkKeys) };
      const rows = await FIND_CONFLICTS.execute(trx, params, `${ancestors.length}:${chunkKeys.length}`);
      for (const row of rows) {
        const id = `${row.lease_key}\u0000${row.holder}`;
        if (seen.has(id) || conflicts.length >= PATH_CONFLICT_REPORT_LIMIT) continue;
        seen.add(id);
        conflicts.push({
          key: decodePathLeaseKey(row.lease_key),
          holder: row.holder,
          expiresAt: Number(row.expires_at),
        });
      }
    }
    return conflicts;
  }

  /** The all-or-nothing acquisition, inside the caller's write transaction. */
  async function acquireKeys(
    trx: Transaction<Database>,
    workspaceId: string,
    holder: string,
    keys: readonly string[],
    ttlMs: number,
    taskId: string | null,
  ): Promise<TryAcquirePathsResult> {
    if (keys.length === 0) return { acquired: true, leases: [] };
    await dialect.lockKey(trx, pathsLockKey(workspaceId));
    // Read the clock only once the workspace is serialized, so lease times follow commit order.
    const now = ctx.clock.now();
    const conflicts = await findConflicts(trx, workspaceId, holder, keys, now);
    if (conflicts.length > 0) return { acquired: false, conflicts };
    const rows: PathLeaseRow[] = [];
    for (const chunk of chunked(keys, LIST_CHUNK)) {
      const stored = chunk.map(encodePathLeaseKey);
      // Expired leases of any holder on exactly these keys are garbage from now on.
      await PRUNE_EXPIRED.run(trx, { workspaceId, stored, holder, now }, stored.length);
      try {
        rows.push(
          ...(await INSERT_LEASES.execute(
            trx,
            { workspaceId, stored, holder, taskId, now, expiresAt: now + ttlMs },
            stored.length,
          )),
        );
      } catch (error) {
        if (dialect.classifyError(error) === 'foreign_key_violation') throw new NotFoundError('workspace', workspaceId);
        throw error;
      }
    }
    const order = new Map(keys.map((key, i) => [key, i]));
    return {
      acquired: true,
      leases: rows.map(toPathLease).sort((a, b) => order.get(a.key)! - order.get(b.key)!),
    };
  }

  function checkAcquireInput(input: AcquirePathsInput) {
    requireInput('input', input);
    const workspaceId = requireId('workspaceId', input.workspaceId);
    const holder = requireId('holder', input.holder);
    const ttlMs = requirePositiveMs('ttlMs', input.ttlMs);
    const keys = leaseKeys(requirePathList('paths', input.paths));
    const taskId = optionalId('taskId', input.taskId);
    return { workspaceId, holder, ttlMs, keys, taskId };
  }

  const repo: PathLeaseRepository = {
    async tryAcquirePaths(input) {
      const { workspaceId, holder, ttlMs, keys, taskId } = checkAcquireInput(input);
      return dialect.writeTransaction((trx) => acquireKeys(trx, workspaceId, holder, keys, ttlMs, taskId));
    },

    async acquirePaths(input, options) {
      const { workspaceId, holder, ttlMs, keys, taskId } = checkAcquireInput(input);
      requireInput('options', options);
      const timeoutMs = requirePositiveMs('timeoutMs', options.timeoutMs, 0);
      const maxPollMs = options.maxPollMs === undefined ? undefined : requirePositiveMs('maxPollMs', options.maxPollMs);
      // A real-time deadline: waiting is a duration, and a test's frozen store clock must not make it endless.
      const deadline = performance.now() + timeoutMs;
      for (;;) {
        // Subscribe before trying: a release committed between the try and the wait still wakes us.
        const wake = dialect.wakeups.subscribe(pathsTopic(workspaceId), maxPollMs);
        const result = await dialect
          .writeTransaction((trx) => acquireKeys(trx, workspaceId, holder, keys, ttlMs, taskId))
          .catch((error: unknown) => {
            wake.cancel();
            throw error;
          });
        if (result.acquired) {
          wake.cancel();
          return result.leases;
        }
        const left = deadline - performance.now();
        if (left <= 0) {
          wake.cancel();
          throw new PathLeaseTimeoutError(workspaceId, holder, keys, timeoutMs, result.conflicts);
        }
        // Woken by a release in this workspace, or after the fallback interval, or at the deadline.
        const deadlineTimer = setTimeout(() => wake.cancel(), clampTimerMs(left));
        await wake.woken;
        clearTimeout(deadlineTimer);
      }
    },

    async releasePaths(input) {
      requireInput('input', input);
      const workspaceId = requireId('workspaceId', input.workspaceId);
      const holder = requireId('holder', input.holder);
      const keys = input.paths === undefined ? null : leaseKeys(requirePathList('paths', input.paths));
      if (keys !== null && keys.length === 0) return { released: [] };
      const rows = await dialect.writeTransaction(async (trx) => {
        await dialect.wakeups.notify(trx, pathsTopic(workspaceId));
        if (keys === null) return RELEASE.execute(trx, { workspaceId, holder, froms: [], tos: [] }, -1);
        const released: { lease_key: string }[] = [];
        for (const chunk of chunked(keys, RANGE_CHUNK)) {
          released.push(
            ...(await RELEASE.execute(trx, { workspaceId, holder, ...descendantRanges(chunk) }, chunk.length)),
          );
        }
        return released;
      });
      return { released: rows.map((r) => decodePathLeaseKey(r.lease_key)).sort() };
    },

    async renewPaths(input) {
      requireInput('input', input);
      const workspaceId = requireId('workspaceId', input.workspaceId);
      const holder = requireId('holder', input.holder);
      const ttlMs = requirePositiveMs('ttlMs', input.ttlMs);
      if (input.paths === undefined || input.paths === null) {
        throw new InvalidArgumentError(
          'paths',
          'is required: pass the paths the holder expects to hold, so that renewal can report the ones it lost',
        );
      }
      const keys = leaseKeys(requirePathList('paths', input.paths));
      if (keys.length === 0) return { renewed: [], lost: [] };
      const rows = await dialect.writeTransaction(async (trx) => {
        // Serialized with acquisitions: a lease seen live here cannot be taken over meanwhile.
        await dialect.lockKey(trx, pathsLockKey(workspaceId));
        const now = ctx.clock.now();
        const extended: PathLeaseRow[] = [];
        // The keys are an antichain, so their ranges are disjoint: no lease is renewed twice.
        for (const chunk of chunked(keys, RANGE_CHUNK)) {
          const params = { workspaceId, holder, now, expiresAt: now + ttlMs, ...descendantRanges(chunk) };
          extended.push(...(await RENEW.execute(trx, params, chunk.length)));
        }
        return extended;
      });
      const renewed = rows.map(toPathLease).sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
      // A key is kept if a renewed lease is on or below it: the key is the lease's key or one of its ancestors.
      const asked = new Set(keys);
      const kept = new Set<string>();
      for (const { key } of renewed) {
        if (asked.has(WHOLE_WORKSPACE_KEY)) kept.add(WHOLE_WORKSPACE_KEY);
        for (let end = key.length; end > 0; end = key.lastIndexOf('/', end - 1)) {
          const prefix = key.slice(0, end);
          if (asked.has(prefix)) kept.add(prefix);
        }
      }
      return { renewed, lost: keys.filter((k) => !kept.has(k)) };
    },

    async listPathLeases(filter) {
      requireInput('filter', filter);
      const workspaceId = requireId('workspaceId', filter.workspaceId);
      const holder = optionalIdFilter('holder', filter.holder);
      let query = dialect.db
        .selectFrom('path_leases')
        .selectAll()
        .where('workspace_id', '=', workspaceId)
        .where('expires_at', '>', ctx.clock.now());
      if (holder !== undefined) query = query.where('holder', '=', holder);
      const rows = await query.orderBy('lease_key').orderBy('holder').execute();
      if (
        rows.length === 0 &&
        !(await dialect.db.selectFrom('workspaces').select('id').where('id', '=', workspaceId).executeTakeFirst())
      ) {
        throw new NotFoundError('workspace', workspaceId);
      }
      return rows.map(toPathLease);
    },

    async pruneExpiredPaths(workspaceId) {
      requireId('workspaceId', workspaceId);
      const result = await dialect.writeTransaction((trx) =>
        trx
          .deleteFrom('path_leases')
          .where('workspace_id', '=', workspaceId)
          .where('expires_at', '<=', ctx.clock.now())
          .executeTakeFirst(),
      );
      return Number(result.numDeletedRows);
    },

    async claimTask(taskId, holder, options) {
      requireId('taskId', taskId);
      requireId('holder', holder);
      const ttlMs = requirePositiveMs('ttlMs', optionalInput('options', options).ttlMs ?? DEFAULT_PATH_LEASE_TTL_MS);
      return dialect.writeTransaction(async (trx): Promise<PathClaimResult> => {
        const task = await trx
          .selectFrom('tasks')
          .select(['workspace_id', 'writes', 'status'])
          .where('id', '=', taskId)
          .executeTakeFirst();
        if (!task) throw new NotFoundError('task', taskId);
        if (FINISHED.includes(task.status)) {
          throw new PathClaimRefusedError(taskId, holder, 'task_finished', `it is already ${task.status}`);
        }
        if (task.workspace_id === null) {
          throw new PathClaimRefusedError(
            taskId,
            holder,
            'task_has_no_workspace',
            'it has no workspace to lease paths in',
          );
        }
        const writes = task.writes === null ? null : (JSON.parse(task.writes) as string[]);
        const mode: TaskWriteMode = writes === null ? 'whole-workspace' : writes.length === 0 ? 'dynamic' : 'paths';
        const keys = writes === null ? [WHOLE_WORKSPACE_KEY] : leaseKeys(writes);
        const result = await acquireKeys(trx, task.workspace_id, holder, keys, ttlMs, taskId);
        if (!result.acquired) return { claimed: false, mode, conflicts: result.conflicts };
        await trx
          .updateTable('tasks')
          .set({ status: 'in_progress', updated_at: ctx.clock.now() })
          .where('id', '=', taskId)
          .execute();
        return { claimed: true, mode, leases: result.leases };
      });
    },

    async submitTaskResult(taskId, holder, result) {
      requireId('taskId', taskId);
      requireId('holder', holder);
      const status = requireInput('result', result).status;
      if (status !== 'done' && status !== 'failed')
        throw new InvalidArgumentError('result.status', "must be 'done' or 'failed'");
      return dialect.writeTransaction(async (trx) => {
        const task = await trx
          .selectFrom('tasks')
          .select(['workspace_id', 'status'])
          .where('id', '=', taskId)
          .executeTakeFirst();
        if (!task) throw new NotFoundError('task', taskId);
        if (FINISHED.includes(task.status)) {
          throw new PathClaimRefusedError(taskId, holder, 'task_finished', `it is already ${task.status}`);
        }
        if (task.workspace_id !== null) await dialect.lockKey(trx, pathsLockKey(task.workspace_id));
        const now = ctx.clock.now();
        const other = await trx
          .selectFrom('path_leases')
          .select(['holder', 'lease_key'])
          .where('task_id', '=', taskId)
          .where('holder', '<>', holder)
          .where('expires_at', '>', now)
          .executeTakeFirst();
        if (other) {
          throw new PathClaimRefusedError(
            taskId,
            holder,
            'held_by_other_holder',
            `holder ${JSON.stringify(other.holder)} holds its lease on ${showKey(decodePathLeaseKey(other.lease_key))}`,
          );
        }
        const released = await trx
          .deleteFrom('path_leases')
          .where('task_id', '=', taskId)
          .returning('lease_key')
          .execute();
        if (released.length > 0 && task.workspace_id !== null)
          await dialect.wakeups.notify(trx, pathsTopic(task.workspace_id));
        await trx.updateTable('tasks').set({ status, updated_at: now }).where('id', '=', taskId).execute();
        return { status, released: released.map((r) => decodePathLeaseKey(r.lease_key)).sort() };
      });
    },
  };
  return repo;
}

function toPathLease(row: PathLeaseRow): PathLease {
  return {
    workspaceId: row.workspace_id,
    key: decodePathLeaseKey(row.lease_key),
    holder: row.holder,
    taskId: row.task_id,
    acquiredAt: Number(row.acquired_at),
    expiresAt: Number(row.expires_at),
  };
}
