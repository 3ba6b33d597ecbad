import { sql, type Kysely, type Transaction } from 'kysely';
import { InvalidArgumentError } from '../errors.js';
import type { Database } from '../schema/database.js';
import type { StoreContext } from './context.js';
import { tableIn } from '../query/schema.js';
import { IDEMPOTENCY_WINDOW_MS } from './idempotent.js';
import type { OutcomeDeclarations } from './shared/outcomes.js';

/** What `prune` may delete, table by table. */
export type PrunableTable =
  | 'messages'
  | 'decision_gates'
  | 'dispatch_contexts'
  | 'coordinator_runs'
  | 'cleanup_snapshots'
  | 'audit_events'
  | 'path_leases'
  | 'idempotency_keys';

export interface PruneOptions {
  /** Only rows finished at least this long ago (ms) are deleted; 0 = everything finished. */
  readonly olderThanMs: number;
  /** Rows per delete transaction (default 1 000, at most 100 000): bounded locks and memory. */
  readonly batchSize?: number;
  /** Count what would be deleted, delete nothing. */
  readonly dryRun?: boolean;
}

export interface PruneResult {
  /** The cutoff on the store's clock: rows that finished before it were (or would be) deleted. */
  readonly cutoff: number;
  readonly dryRun: boolean;
  /** Rows deleted (or, with `dryRun`, that would be) per table. */
  readonly deleted: Readonly<Record<PrunableTable, number>>;
}

/** Housekeeping for long-running services. */
export interface MaintenanceRepository {
  /**
   * Deletes, in bounded batches (one write transaction each), what is finished and older than
   * `olderThanMs`: delivered messages, resolved gates and ended dispatches of runs that are not
   * running, stopped runs with nothing left that points at them, completed or stale cleanup
   * snapshots, audit events recorded before the cutoff, path leases that expired before the cutoff, dead messages, pending messages no
   * run or active dispatch can read any more (see the README: Messages), and idempotency keys.
   * Idempotency keys are kept at least `IDEMPOTENCY_WINDOW_MS` (24 hours) whatever
   * `olderThanMs` says; a message id is remembered as long as its message is kept (choose
   * `olderThanMs` longer than senders retry).
   *
   * Never deleted: anything a live run, lease or claim references (a running run's dispatches and
   * gates, an active dispatch, an open gate, a pending or claimed or retryable snapshot), and no
   * row whose deletion could re-issue a fencing token or generation (workspace locks, task leases,
   * environments and groups are kept whatever their age), nor tasks and organisation records.
   * Safe to run while other processes work on the database.
   *
   * @example
   * const { deleted } = await store.maintenance.prune({ olderThanMs: 30 * 24 * 3600_000 });
   */
  prune(options: PruneOptions): Promise<PruneResult>;
}

const DEFAULT_BATCH = 1_000;
const MAX_BATCH = 100_000;

type Db = Kysely<Database> | Transaction<Database>;

/** A run that is still running owns this column's row. */
const ownedByRunningRun = (
  db: Db,
  column: 'dispatch_contexts.coordinator_run_id' | 'decision_gates.coordinator_run_id',
) =>
  sql<boolean>`exists (select 1 from ${tableIn(db, 'coordinator_runs')} r where r.id = ${sql.ref(column)} and r.status = 'running')`;

/** For each table: the ids of up to `limit` prunable rows (re-checked in the delete's own transaction). */
const candidates: Record<
  Exclude<PrunableTable, 'path_leases' | 'idempotency_keys'>,
  (db: Db, cutoff: number, limit: number, only?: readonly string[]) => Promise<string[]>
> = {
  async messages(db, cutoff, limit, only) {
    // Acked messages; dead letters; and pending ones nobody can read any more: addressed to a
    // handle that is neither a running run's coordinator (or a stopped one's whose target has a
    // running run, which takes its inbox over) nor an active dispatch's terminal. A message's id
    // is remembered (a resend with it converges) for as long as the row is kept.
    const rows = await db
      .selectFrom('messages as m')
      .select('m.id')
      .where((eb) =>
        eb.or([
          eb.and([eb('m.status', '=', 'delivered'), eb('m.delivered_at', '<', cutoff)]),
          eb.and([eb('m.status', '=', 'pending'), eb('m.dead_at', '<', cutoff)]),
          eb.and([
            eb('m.status', '=', 'pending'),
            eb('m.dead_at', 'is', null),
            eb('m.created_at', '<', cutoff),
            eb.not(
              eb.exists(
                eb
                  .selectFrom('coordinator_runs as r')
                  .select('r.id')
                  .whereRef('r.coordinator_handle', '=', 'm.to_handle')
                  .where((w) =>
                    w.or([
                      w('r.status', '=', 'running'),
                      w.exists(
                        w
                          .selectFrom('coordinator_runs as s')
                          .select('s.id')
                          .whereRef('s.target_key', '=', 'r.target_key')
                          .where('s.status', '=', 'running'),
                      ),
                    ]),
                  ),
              ),
            ),
            eb.not(
              eb.exists(
                eb
                  .selectFrom('dispatch_contexts as d')
                  .select('d.id')
                  .whereRef('d.terminal_handle', '=', 'm.to_handle')
                  .where('d.status', '=', 'active'),
              ),
            ),
          ]),
        ]),
      )
      .$if(only !== undefined, (qb) => qb.where('m.id', 'in', only as string[]))
      .limit(limit)
      .execute();
    return rows.map((r) => r.id);
  },
  async decision_gates(db, cutoff, limit, only) {
    const rows = await db
      .selectFrom('decision_gates')
      .select('id')
      .where('status', '=', 'resolved')
      .where('resolved_at', '<', cutoff)
      .where((eb) => eb.not(ownedByRunningRun(db, 'decision_gates.coordinator_run_id')))
      .$if(only !== undefined, (qb) => qb.where('id', 'in', only as string[]))
      .limit(limit)
      .execute();
    return rows.map((r) => r.id);
  },
  async dispatch_contexts(db, cutoff, limit, only) {
    const rows = await db
      .selectFrom('dispatch_contexts')
      .select('id')
      .where('status', '<>', 'active')
      .where((eb) => eb(eb.fn.coalesce('ended_at', 'updated_at'), '<', cutoff))
      .where((eb) => eb.not(ownedByRunningRun(db, 'dispatch_contexts.coordinator_run_id')))
      .$if(only !== undefined, (qb) => qb.where('id', 'in', only as string[]))
      .limit(limit)
      .execute();
    return rows.map((r) => r.id);
  },
  async coordinator_runs(db, cutoff, limit, only) {
    // A stopped run goes once nothing points at it but tasks (a task of a deleted run is unowned,
    // exactly as a task of a stopped run: the next run on its target adopts it).
    const rows = await db
      .selectFrom('coordinator_runs as r')
      .select('r.id')
      .where('r.status', '<>', 'running')
      .where('r.ended_at', '<', cutoff)
      .where((eb) =>
        eb.not(
          eb.exists(
            eb.selectFrom('dispatch_contexts as d').select('d.id').whereRef('d.coordinator_run_id', '=', 'r.id'),
          ),
        ),
      )
      .where((eb) =>
        eb.not(
          eb.exists(eb.selectFrom('decision_gates as g').select('g.id').whereRef('g.coordinator_run_id', '=', 'r.id')),
        ),
      )
      .$if(only !== undefined, (qb) => qb.where('r.id', 'in', only as string[]))
      .limit(limit)
      .execute();
    return rows.map((r) => r.id);
  },
  async cleanup_snapshots(db, cutoff, limit, only) {
    // `failed` snapshots are retried by cleanup workers: only completed and stale ones are settled.
    const rows = await db
      .selectFrom('cleanup_snapshots')
      .select('id')
      .where('state', 'in', ['completed', 'stale'])
      .where('updated_at', '<', cutoff)
      .$if(only !== undefined, (qb) => qb.where('id', 'in', only as string[]))
      .limit(limit)
      .execute();
    return rows.map((r) => r.id);
  },
  async audit_events(db, cutoff, limit, only) {
    // Append-only history: an event is finished when it is recorded.
    const rows = await db
      .selectFrom('audit_events')
      .select('id')
      .where('at', '<', cutoff)
      .$if(only !== undefined, (qb) => qb.where('id', 'in', only as string[]))
      .limit(limit)
      .execute();
    return rows.map((r) => r.id);
  },
};

/** Deletes `ids` from `table`, re-checking each row's prunability inside the delete's transaction. */
async function deleteBatch(
  trx: Transaction<Database>,
  table: Exclude<PrunableTable, 'path_leases' | 'idempotency_keys'>,
  ids: string[],
  cutoff: number,
): Promise<number> {
  // The candidate query again, restricted to these ids, inside the delete's transaction: a row
  // that changed since it was found (a dispatch re-activated by a new run, say) is not deleted.
  const still = await candidates[table](trx, cutoff, ids.length, ids);
  if (still.length === 0) return 0;
  const result = await trx.deleteFrom(table).where('id', 'in', still).executeTakeFirst();
  return Number(result.numDeletedRows);
}

export function createMaintenanceRepository(ctx: StoreContext): MaintenanceRepository {
  const { dialect } = ctx;
  return {
    async prune(options) {
      const olderThanMs = options?.olderThanMs;
      if (typeof olderThanMs !== 'number' || !Number.isInteger(olderThanMs) || olderThanMs < 0) {
        throw new InvalidArgumentError('olderThanMs', 'must be a non-negative integer number of milliseconds');
      }
      const batchSize = options.batchSize ?? DEFAULT_BATCH;
      if (!Number.isInteger(batchSize) || batchSize < 1 || batchSize > MAX_BATCH) {
        throw new InvalidArgumentError('batchSize', `must be an integer from 1 to ${MAX_BATCH}`);
      }
      if (options.dryRun !== undefined && typeof options.dryRun !== 'boolean')
        throw new InvalidArgumentError('dryRun', 'must be true or false');
      const dryRun = options.dryRun ?? false;
      const now = ctx.clock.now();
      const cutoff = now - olderThanMs;
      // Idempotency keys are remembered for at least the window, whatever olderThanMs says.
      const keptCutoff = Math.min(cutoff, now - IDEMPOTENCY_WINDOW_MS);
      // A message's id is an idempotency key too (a resend with it converges): kept as long.
      const cutoffOf = (table: PrunableTable) => (table === 'messages' ? keptCutoff : cutoff);
      const deleted: Record<PrunableTable, number> = {
        messages: 0,
        decision_gates: 0,
        dispatch_contexts: 0,
        coordinator_runs: 0,
        cleanup_snapshots: 0,
        audit_events: 0,
        path_leases: 0,
        idempotency_keys: 0,
      };
      // Dependents first: a run goes only once its dispatches and gates are gone.
      for (const table of [
        'messages',
        'decision_gates',
        'dispatch_contexts',
        'coordinator_runs',
        'cleanup_snapshots',
        'audit_events',
      ] as const) {
        if (dryRun) {
          deleted[table] = await countCandidates(dialect.db, table, cutoffOf(table));
          continue;
        }
        for (;;) {
          const ids = await candidates[table](dialect.db, cutoffOf(table), batchSize);
          if (ids.length === 0) break;
          const n = await dialect.writeTransaction((trx) => deleteBatch(trx, table, ids, cutoffOf(table)));
          deleted[table] += n;
          if (ids.length < batchSize) break;
          if (n === 0) break; // every candidate changed meanwhile: leave them to the next prune
        }
      }
      deleted.path_leases = await prunePathLeases(ctx, cutoff, batchSize, dryRun);
      deleted.idempotency_keys = await pruneIdempotencyKeys(ctx, keptCutoff, batchSize, dryRun);
      return { cutoff, dryRun, deleted };
    },
  };
}

/** With `dryRun`: how many rows each table would lose (runs count the dispatches and gates that would go first). */
async function countCandidates(
  db: Kysely<Database>,
  table: Exclude<PrunableTable, 'path_leases' | 'idempotency_keys'>,
  cutoff: number,
): Promise<number> {
  if (table !== 'coordinator_runs') return (await candidates[table](db, cutoff, Number.MAX_SAFE_INTEGER)).length;
  // Runs whose remaining dispatches and gates would all be pruned first.
  const rows = await db
    .selectFrom('coordinator_runs as r')
    .select('r.id')
    .where('r.status', '<>', 'running')
    .where('r.ended_at', '<', cutoff)
    .where((eb) =>
      eb.not(
        eb.exists(
          eb
            .selectFrom('dispatch_contexts as d')
            .select('d.id')
            .whereRef('d.coordinator_run_id', '=', 'r.id')
            .where((w) =>
              w.or([w('d.status', '=', 'active'), w(w.fn.coalesce('d.ended_at', 'd.updated_at'), '>=', cutoff)]),
            ),
        ),
      ),
    )
    .where((eb) =>
      eb.not(
        eb.exists(
          eb
            .selectFrom('decision_gates as g')
            .select('g.id')
            .whereRef('g.coordinator_run_id', '=', 'r.id')
            .where((w) => w.or([w('g.status', '=', 'open'), w('g.resolved_at', '>=', cutoff)])),
        ),
      ),
    )
    .execute();
  return rows.length;
}

/** Path leases that expired before the cutoff: dead since then, they block nothing and carry no token. */
async function prunePathLeases(ctx: StoreContext, cutoff: number, batchSize: number, dryRun: boolean): Promise<number> {
  const { dialect } = ctx;
  const select = (db: Db, limit: number) =>
    db
      .selectFrom('path_leases')
      .select(['workspace_id', 'lease_key', 'holder'])
      .where('expires_at', '<', cutoff)
      .limit(limit)
      .execute();
  if (dryRun) return (await select(dialect.db, Number.MAX_SAFE_INTEGER)).length;
  let total = 0;
  for (;;) {
    const n = await dialect.writeTransaction(async (trx) => {
      const rows = await select(trx, batchSize);
      let removed = 0;
      for (const row of rows) {
        const result = await trx
          .deleteFrom('path_leases')
          .where('workspace_id', '=', row.workspace_id)
          .where('lease_key', '=', row.lease_key)
          .where('holder', '=', row.holder)
          .where('expires_at', '<', cutoff)
          .executeTakeFirst();
        removed += Number(result.numDeletedRows);
      }
      return { removed, seen: rows.length };
    });
    total += n.removed;
    if (n.seen < batchSize) return total;
  }
}

/** Idempotency keys created before `cutoff` (at most now − IDEMPOTENCY_WINDOW_MS), in batches. */
async function pruneIdempotencyKeys(
  ctx: StoreContext,
  cutoff: number,
  batchSize: number,
  dryRun: boolean,
): Promise<number> {
  const { dialect } = ctx;
  const select = (db: Db, limit: number) =>
    db
      .selectFrom('idempotency_keys')
      .select(['operation', 'key'])
      .where('created_at', '<', cutoff)
      .limit(limit)
      .execute();
  if (dryRun) return (await select(dialect.db, Number.MAX_SAFE_INTEGER)).length;
  let total = 0;
  for (;;) {
    const n = await dialect.writeTransaction(async (trx) => {
      const rows = await select(trx, batchSize);
      let removed = 0;
      for (const row of rows) {
        const result = await trx
          .deleteFrom('idempotency_keys')
          .where('operation', '=', row.operation)
          .where('key', '=', row.key)
          .where('created_at', '<', cutoff)
          .executeTakeFirst();
        removed += Number(result.numDeletedRows);
      }
      return { removed, seen: rows.length };
    });
    total += n.removed;
    if (n.seen < batchSize) return total;
  }
}

/** Each call's declared outcome (see shared/outcomes.ts): a prune reports its counts. */
export const MAINTENANCE_OUTCOMES: OutcomeDeclarations<MaintenanceRepository> = {
  prune: {
    returned: () => ({ outcome: 'committed' }),
    stale: 'refused',
    events: (result) => [{ type: 'prune', result }],
  },
};
