/**
 * `store.dispatches` (SPEC §3): a task sent to a worker terminal, scoped to a run. The
 * guarantees are stated on `DispatchRepository` (types.ts).
 */
import { sql, type CompiledQuery, type Kysely, type Transaction } from 'kysely';
import { InvalidArgumentError, NotFoundError } from '../../errors.js';
import { tableIn } from '../../query/schema.js';
import type {
  CoordinatorRunRow,
  CoordinatorRunStatus,
  Database,
  DispatchContextRow,
  DispatchStatus,
  TaskRow,
  TaskStatus,
} from '../../schema/database.js';
import type { StoreContext } from '../context.js';
import type { LeaseFence } from '../shared/fence.js';
import { requireLease, type Lease } from '../shared/lease.js';
import { endedReason, GateOpenError, moveInFlightTask, moveInFlightTaskRow } from '../shared/lifecycle.js';
import { dispatchTaskLockKey, dispatchTerminalLockKey } from '../../protocol.js';
import { toTask } from '../shared/records.js';
import { auditLeaseActs, auditsLeaseAct, type LeaseActRecord } from '../shared/audit.js';
import { explainAfterRollback } from '../shared/misses.js';
import {
  CLAIM_NEXT,
  CLAIM_NEXT_BATCH,
  COMPLETE,
  COMPLETE_V2,
  type ClaimNextBatchRow,
  type ClaimNextRow,
} from './statements.js';
import { runBound } from '../../query/prepared.js';
import { CoordinatorRunNotRunningError, findRunningRun, requireRunningRunIn } from '../shared/running-run.js';
import { optionalTraceContext, toTraceContext } from '../shared/trace-context.js';
import { createOnce, keyedCall, keyedWrite, requireSameCreate } from '../idempotent.js';
import {
  optionalId,
  optionalIdFilter,
  optionalInput,
  optionalStatusFilter,
  optionalString,
  requireId,
  requireInput,
  requireJson,
  requireLimit,
  requirePositiveMs,
} from '../validate.js';
import {
  DEFAULT_DISPATCH_LEASE_TTL_MS,
  DISPATCH_FAILURE_LIMIT,
  DispatchAlreadyActiveError,
  DispatchLeaseLostError,
  LEASE_EXPIRED,
  TerminalBusyError,
  type DispatchExitResult,
  type CompletedDispatch,
  type DispatchNextFilter,
  type NextDispatchOptions,
  type ReclaimedDispatch,
  DispatchNotActiveError,
  DispatchRunMismatchError,
  TaskNotDispatchableError,
  type Dispatch,
  type DispatchRepository,
  type EscalationTarget,
} from './types.js';
import { extend } from '../../objects.js';

/** Maps a `dispatch_contexts` row to the public shape. */
export function toDispatch(row: DispatchContextRow): Dispatch {
  return {
    id: row.id,
    taskId: row.task_id,
    agentId: row.agent_id,
    terminalHandle: row.terminal_handle,
    status: row.status,
    error: row.error,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
    endedAt: row.ended_at,
    coordinatorRunId: row.coordinator_run_id,
    seq: Number(row.seq),
    leaseExpiresAt: row.lease_expires_at === null ? null : Number(row.lease_expires_at),
    lease:
      row.status === 'active' && row.lease_expires_at !== null
        ? Object.freeze({
            kind: 'dispatch' as const,
            resource: row.id,
            holder: row.terminal_handle,
            token: Number(row.seq),
            expiresAt: Number(row.lease_expires_at),
          })
        : null,
    traceContext: toTraceContext(row.trace_context),
  };
}

const IN_FLIGHT: readonly TaskStatus[] = ['dispatched', 'in_progress'];
const DISPATCH_STATUSES: readonly DispatchStatus[] = ['active', 'completed', 'failed', 'cancelled'];

type Trx = Transaction<Database>;

/**
 * When a dispatch's lease lapses. A legacy dispatch (active from before 0090 gave dispatches a
 * lease, `lease_expires_at` NULL) is held as if created with the default lease, counted from its
 * last update: it is reclaimable `DEFAULT_DISPATCH_LEASE_TTL_MS` after it, like a worker that
 * never heartbeats, and never stays active for ever.
 */
export function leaseExpiryOf(row: Pick<DispatchContextRow, 'lease_expires_at' | 'updated_at'>): number {
  return row.lease_expires_at === null
    ? Number(row.updated_at) + DEFAULT_DISPATCH_LEASE_TTL_MS
    : Number(row.lease_expires_at);
}

/** The newest active dispatch of a terminal (by `seq`), read in `db` (a transaction or the store). */
function newestActiveFor(trx: Trx | Kysely<Database>, terminalHandle: string) {
  return trx
    .selectFrom('dispatch_contexts')
    .selectAll()
    .where('terminal_handle', '=', terminalHandle)
    .where('status', '=', 'active')
    .orderBy('seq', 'desc')
    .limit(1)
    .executeTakeFirst();
}

/**
 * The check every worker report makes before it changes anything: the dispatch is active and, if
 * the worker passed its lease, the lease is this dispatch's. A lease that lapsed but was not
 * reclaimed still reports: expiry makes a dispatch reclaimable, reclaiming makes it lost.
 */
async function checkReport(trx: Trx, row: DispatchContextRow, lease: Lease<'dispatch'> | undefined): Promise<void> {
  if (lease !== undefined) {
    if (lease.resource !== row.id)
      throw new InvalidArgumentError('lease.resource', `must be the lease of dispatch ${row.id}`);
    if (lease.token !== Number(row.seq)) throw new DispatchLeaseLostError(row.id, lease.token, 'never_granted');
  }
  if (row.status === 'active') return;
  const reason = await endedReason(trx, row);
  if (reason !== 'released' || lease !== undefined)
    throw new DispatchLeaseLostError(row.id, lease?.token ?? Number(row.seq), reason);
  throw new DispatchNotActiveError(row.id, row.status);
}

/**
 * A `dispatch_contexts` insert with its seq: RETURNING on PostgreSQL (a sequence default), read
 * back on SQLite (a trigger assigns it, which RETURNING does not see). The caller already moved the task to `dispatched` (its row is locked).
 * A new dispatch supersedes the task's earlier path claim (`paths.claimTask`): a claim made
 * under an earlier dispatch is not this one's, so that worker's `submitTaskResult` is refused.
 */
async function insertDispatch(
  ctx: StoreContext,
  trx: Trx,
  values: Omit<DispatchContextRow, 'seq'>,
): Promise<DispatchContextRow> {
  await trx.deleteFrom('path_lease_claims').where('task_id', '=', values.task_id).execute();
  const insert = trx.insertInto('dispatch_contexts').values(values);
  let row: DispatchContextRow;
  if (ctx.dialect.insertReturnsSeq) row = await insert.returningAll().executeTakeFirstOrThrow();
  else {
    await insert.execute();
    row = await trx.selectFrom('dispatch_contexts').selectAll().where('id', '=', values.id).executeTakeFirstOrThrow();
  }
  await auditLeaseActs(ctx, trx, values.created_at, [grantedAct(row)]);
  return row;
}

/** The trail's row of a dispatch lease's grant. */
const grantedAct = (row: DispatchContextRow) =>
  dispatchAct('granted', row, { taskId: row.task_id, expiresAt: Number(row.lease_expires_at) });

/** The trail's row of an act on a dispatch's lease (`holder`: its terminal, `token`: its seq). */
function dispatchAct(act: LeaseActRecord['act'], row: DispatchContextRow, detail: Record<string, unknown>) {
  return {
    act,
    kind: 'dispatch',
    resource: row.id,
    holder: row.terminal_handle,
    token: Number(row.seq),
    detail,
  } satisfies LeaseActRecord;
}

/**
 * Fails an active dispatch in `trx` (the caller holds its task's key) and moves its task: the
 * breaker counts the task's failed dispatches. Null if it already ended.
 */
async function failDispatchIn(
  ctx: StoreContext,
  trx: Trx,
  dispatchId: string,
  error: string,
  now: number,
  rowLocks: boolean,
): Promise<Omit<DispatchExitResult, 'escalateTo'> | null> {
  const failed = await trx
    .updateTable('dispatch_contexts')
    .set({ status: 'failed', error, updated_at: now, ended_at: now })
    .where('id', '=', dispatchId)
    .where('status', '=', 'active')
    .returningAll()
    .executeTakeFirst();
  if (!failed) return null;
  // A reclaim takes a lapsed lease away (lost); an exit report ends the terminal's own (released).
  await auditLeaseActs(ctx, trx, now, [
    dispatchAct(error === LEASE_EXPIRED ? 'lost' : 'released', failed, {
      status: 'failed',
      reason: error === LEASE_EXPIRED ? 'reclaimed' : error,
    }),
  ]);
  const { failures } = await trx
    .selectFrom('dispatch_contexts')
    .select((eb) => eb.fn.countAll<number>().as('failures'))
    .where('task_id', '=', failed.task_id)
    .where('status', '=', 'failed')
    .executeTakeFirstOrThrow();
  const failureCount = Number(failures);
  const tripped = failureCount >= DISPATCH_FAILURE_LIMIT;
  const before = await trx
    .selectFrom('tasks')
    .select('status')
    .where('id', '=', failed.task_id)
    .executeTakeFirstOrThrow();
  const inFlight = IN_FLIGHT.includes(before.status);
  const taskStatus = await moveInFlightTask(trx, failed.task_id, tripped ? 'failed' : 'ready', now, rowLocks);
  return { dispatch: toDispatch(failed), failureCount, circuitBreakerTripped: tripped && inFlight, taskStatus };
}

/** Checks `dispatchNext`'s filter. */
function checkFilter(value: unknown): DispatchNextFilter {
  const filter = optionalInput('filter', value as DispatchNextFilter | undefined);
  if (filter.assigneeAgentId !== undefined && filter.assigneeAgentId !== null)
    requireId('filter.assigneeAgentId', filter.assigneeAgentId);
  if (
    filter.minPriority !== undefined &&
    (typeof filter.minPriority !== 'number' || !Number.isInteger(filter.minPriority))
  )
    throw new InvalidArgumentError('filter.minPriority', 'must be an integer');
  return filter;
}

/** `completeDispatch`'s `next`, checked: the claim's options with their defaults; null without `next`. */
function checkNext(value: unknown): Omit<ClaimNextInput, 'runId' | 'terminalHandle'> | null {
  if (value === undefined) return null;
  if (value !== true && (typeof value !== 'object' || value === null || Array.isArray(value)))
    throw new InvalidArgumentError('next', 'must be true or an object of dispatchNext options');
  const next: NextDispatchOptions = value === true ? {} : value;
  return {
    agentId: optionalId('next.agentId', next.agentId),
    filter: checkFilter(next.filter),
    ttlMs: next.ttlMs === undefined ? DEFAULT_DISPATCH_LEASE_TTL_MS : requirePositiveMs('next.ttlMs', next.ttlMs),
    traceContext: optionalTraceContext('next.traceContext', next.traceContext),
  };
}

/** The assignee mode and minimum priority a claim function takes for `filter`. */
function claimFilterParams(filter: DispatchNextFilter) {
  const { assigneeAgentId, minPriority } = filter;
  return {
    assigneeMode: assigneeAgentId === undefined ? 'any' : assigneeAgentId === null ? 'unassigned' : 'assignee',
    assignee: assigneeAgentId ?? null,
    minPriority: minPriority ?? null,
  } as const;
}

async function escalationFor(
  trx: Transaction<Database>,
  dispatch: DispatchContextRow,
): Promise<EscalationTarget | null> {
  const target = (run: CoordinatorRunRow, via: EscalationTarget['via']): EscalationTarget => ({
    runId: run.id,
    coordinatorHandle: run.coordinator_handle,
    runStatus: run.status,
    via,
  });
  if (dispatch.coordinator_run_id !== null) {
    const own = await trx
      .selectFrom('coordinator_runs')
      .selectAll()
      .where('id', '=', dispatch.coordinator_run_id)
      .executeTakeFirst();
    if (own) return target(own, 'dispatch_run');
  }
  // Legacy row (written before runs were stamped): the running run of the task's target is
  // unique, so it is exact; only a task whose target has no running run falls back further.
  const task = await trx.selectFrom('tasks').select('target_key').where('id', '=', dispatch.task_id).executeTakeFirst();
  const sameTarget = await findRunningRun(trx, task?.target_key ?? null);
  if (sameTarget) return target(sameTarget, 'task_target_run');
  const latest = await trx
    .selectFrom('coordinator_runs')
    .selectAll()
    .where('status', '=', 'running')
    .orderBy('started_at', 'desc')
    .orderBy('id', 'desc')
    .limit(1)
    .executeTakeFirst();
  return latest ? target(latest, 'latest_running_run') : null;
}

/** The claim-next step's input (`dispatchNext`, `dispatchNextBatch`). */
interface ClaimNextInput {
  readonly runId: string;
  readonly terminalHandle: string;
  readonly agentId: string | null;
  readonly filter: DispatchNextFilter;
  readonly ttlMs: number;
  readonly traceContext: string | null;
}

/** `dispatchNextBatch`'s claim input: the terminals in the caller's order, and the limit. */
interface ClaimBatchInput extends Omit<ClaimNextInput, 'terminalHandle'> {
  readonly handles: readonly string[];
  readonly limit: number;
}

/** The dispatch repository on a store context (wired as `store.dispatches`). */
// The typed refusals a keyed dispatch call stores (a TerminalBusyError found by the unique index
// after the rollback is not stored: a retry meets it again).
const NEXT_REFUSALS = [NotFoundError, CoordinatorRunNotRunningError, TerminalBusyError];
const REPORT_REFUSALS = [NotFoundError, DispatchLeaseLostError, DispatchNotActiveError, GateOpenError];
/** `completeOnce`'s result when the next claim's agent does not exist. */
const AGENT_MISSING = Symbol('agent missing');

export function createDispatchRepository(ctx: StoreContext): DispatchRepository {
  const { dialect } = ctx;
  const { db } = dialect;
  /** The dispatch-task key's prefix as `lockKey` scopes it (`lockKeyText`), for `COMPLETE_V2` to take the key itself. */
  const taskKeyPrefix = dialect.lockKeyText(dispatchTaskLockKey(''));

  async function getDispatch(id: string): Promise<Dispatch | null> {
    requireId('id', id);
    const row = await db.selectFrom('dispatch_contexts').selectAll().where('id', '=', id).executeTakeFirst();
    return row ? toDispatch(row) : null;
  }

  /**
   * Runs a write that inserts a dispatch; the one-active-per-terminal index's violation becomes
   * `TerminalBusyError`, naming the dispatch that won the terminal, read after the rollback
   * (`explainAfterRollback`).
   */
  function onFreeTerminal<T>(terminalHandles: readonly string[], write: () => Promise<T>): Promise<T> {
    return explainAfterRollback(dialect, 'unique_violation', write, async (db) => {
      for (const handle of terminalHandles) {
        const active = await newestActiveFor(db, handle);
        if (active) throw new TerminalBusyError(handle, active.id);
      }
      throw new TerminalBusyError(terminalHandles[0]!, null);
    });
  }

  /** Checks `ttlMs`. */
  const ttlOf = (value: unknown) =>
    value === undefined ? DEFAULT_DISPATCH_LEASE_TTL_MS : requirePositiveMs('ttlMs', value);

  /**
   * The claim-next step of `dispatchNext`, in `trx`: the run's best ready task with every
   * dependency done, row-locked and skipping rows other claimers hold (PostgreSQL), dispatched
   * to `terminalHandle`. Null when none is ready.
   */
  async function claimNextIn(trx: Trx, p: ClaimNextInput): Promise<DispatchContextRow | null> {
    const tasks = tableIn(trx, 'tasks');
    const deps = tableIn(trx, 'task_dependencies');
    let query = trx
      .selectFrom('tasks')
      .select('id')
      .where('coordinator_run_id', '=', p.runId)
      .where('status', '=', 'ready')
      .where(
        sql<boolean>`not exists (select 1 from ${deps} d join ${tasks} dep on dep.id = d.depends_on_id
          where d.task_id = ${sql.ref('tasks.id')} and dep.status <> 'done')`,
      );
    if (p.filter.assigneeAgentId !== undefined)
      query =
        p.filter.assigneeAgentId === null
          ? query.where('assignee_agent_id', 'is', null)
          : query.where('assignee_agent_id', '=', p.filter.assigneeAgentId);
    if (p.filter.minPriority !== undefined) query = query.where('priority', '>=', p.filter.minPriority);
    query = query.orderBy('priority', 'desc').orderBy('seq').limit(1);
    const now = ctx.clock.now();
    // One statement: the pick (row-locked, skipping rows other claimers hold, on PostgreSQL) is
    // the subquery of the conditional UPDATE that claims it, which re-checks `ready`.
    const pick = await trx
      .updateTable('tasks')
      .set({ status: 'dispatched', updated_at: now })
      .where('id', '=', dialect.supportsSkipLocked ? query.forUpdate().skipLocked() : query)
      .where('status', '=', 'ready')
      .returning(['id', 'coordinator_run_id'])
      .executeTakeFirst();
    if (!pick) return null;
    return insertDispatch(ctx, trx, {
      id: ctx.newId(),
      task_id: pick.id,
      agent_id: p.agentId,
      terminal_handle: p.terminalHandle,
      status: 'active',
      error: null,
      created_at: now,
      updated_at: now,
      ended_at: null,
      coordinator_run_id: pick.coordinator_run_id,
      lease_expires_at: now + p.ttlMs,
      trace_context: p.traceContext,
    });
  }

  /**
   * What every claim statement states: the run, the agent, the filter, the trace and the time,
   * read now (before BEGIN when BEGIN sends the statement), with the lease's end from it.
   */
  function claimParams(p: Omit<ClaimNextInput, 'terminalHandle'>) {
    const now = ctx.clock.now();
    return {
      runId: p.runId,
      agentId: p.agentId,
      ...claimFilterParams(p.filter),
      now,
      expiresAt: now + p.ttlMs,
      traceContext: p.traceContext,
    };
  }

  /** A claim statement's guard reads, refused in `requireDispatchable`'s order (the run, then the agent). */
  function refuseClaim(
    p: Omit<ClaimNextInput, 'terminalHandle'>,
    guards: { run_status: string; agent_found: string | null } | undefined,
  ): asserts guards {
    if (!guards) throw new NotFoundError('coordinator run', p.runId);
    if (guards.run_status !== 'running')
      throw new CoordinatorRunNotRunningError(p.runId, guards.run_status as CoordinatorRunStatus);
    if (p.agentId !== null && guards.agent_found === null) throw new NotFoundError('agent', p.agentId);
  }

  /** `CLAIM_NEXT` bound for `p`, with the time it states. */
  function claimNextStatement(p: ClaimNextInput): { query: CompiledQuery<ClaimNextRow>; now: number } {
    const params = extend(claimParams(p), { terminalHandle: p.terminalHandle, id: ctx.newId() });
    return { query: CLAIM_NEXT.bind(db, params), now: params.now };
  }

  /**
   * `dispatchNext`'s guards and claim in one statement (`CLAIM_NEXT`, writable CTEs): refused in
   * the order `requireDispatchable` refuses, and nothing written when a guard refuses. `sent`: the
   * statement BEGIN already carried, if it did.
   */
  async function claimNextFolded(
    trx: Trx,
    p: ClaimNextInput,
    sent?: { query: CompiledQuery<ClaimNextRow>; now: number },
  ): Promise<DispatchContextRow | null> {
    const { query, now } = sent ?? claimNextStatement(p);
    const result = (dialect.beginResult(query) ?? (await runBound(trx, query))).rows[0];
    refuseClaim(p, result);
    const { busy_id: busy, made: row } = result;
    if (busy !== null) throw new TerminalBusyError(p.terminalHandle, busy);
    if (row === null) return null;
    await auditLeaseActs(ctx, trx, now, [grantedAct(row)]);
    return row;
  }

  /** `CLAIM_NEXT_BATCH` bound for `p`, with the time it states. */
  function claimBatchStatement(p: ClaimBatchInput): { query: CompiledQuery<ClaimNextBatchRow>; now: number } {
    const params = extend(claimParams(p), {
      terminalHandles: JSON.stringify(p.handles),
      ids: JSON.stringify(p.handles.map(() => ctx.newId())),
      limit: p.limit,
    });
    return { query: CLAIM_NEXT_BATCH.bind(db, params), now: params.now };
  }

  /**
   * `dispatchNextBatch` in one set-based statement (`CLAIM_NEXT_BATCH`, writable CTEs): the guards
   * refused in `requireDispatchable`'s order, busy terminals skipped, the best tasks to the free
   * terminals in order; nothing written when a guard refuses. `sent`: the statement BEGIN already
   * carried, if it did.
   */
  async function claimBatchFolded(
    trx: Trx,
    p: ClaimBatchInput,
    sent?: { query: CompiledQuery<ClaimNextBatchRow>; now: number },
  ): Promise<DispatchContextRow[]> {
    const { query, now } = sent ?? claimBatchStatement(p);
    const result = (dialect.beginResult(query) ?? (await runBound(trx, query))).rows[0];
    refuseClaim(p, result);
    const { made } = result;
    await auditLeaseActs(ctx, trx, now, made.map(grantedAct));
    return made;
  }

  /** Checks the agent reference. */
  async function requireAgent(trx: Trx, agentId: string | null): Promise<void> {
    if (agentId !== null && !(await trx.selectFrom('agents').select('id').where('id', '=', agentId).executeTakeFirst()))
      throw new NotFoundError('agent', agentId);
  }

  /**
   * The guards of `dispatchNext` in one read: the run is running (else `NotFoundError` or
   * `CoordinatorRunNotRunningError`), the agent, when given, exists (`NotFoundError`), and the
   * terminal, when given, has no active dispatch (`TerminalBusyError` naming its newest one).
   * Plain reads, no locks, refused in that order, as the three separate reads were.
   */
  async function requireDispatchable(
    trx: Trx,
    runId: string,
    agentId: string | null,
    terminalHandle: string | null,
  ): Promise<void> {
    const row = await trx
      .selectFrom('coordinator_runs')
      .select('coordinator_runs.status')
      .$if(agentId !== null, (qb) =>
        qb.select((eb) => eb.selectFrom('agents').select('agents.id').where('agents.id', '=', agentId!).as('agent_id')),
      )
      .$if(terminalHandle !== null, (qb) =>
        qb.select((eb) =>
          eb
            .selectFrom('dispatch_contexts')
            .select('dispatch_contexts.id')
            .where('dispatch_contexts.terminal_handle', '=', terminalHandle!)
            .where('dispatch_contexts.status', '=', 'active')
            .orderBy('dispatch_contexts.seq', 'desc')
            .limit(1)
            .as('busy_id'),
        ),
      )
      .where('coordinator_runs.id', '=', runId)
      .executeTakeFirst();
    if (!row) throw new NotFoundError('coordinator run', runId);
    if (row.status !== 'running') throw new CoordinatorRunNotRunningError(runId, row.status);
    if (agentId !== null && (row.agent_id ?? null) === null) throw new NotFoundError('agent', agentId);
    const busy = row.busy_id ?? null;
    if (terminalHandle !== null && busy !== null) throw new TerminalBusyError(terminalHandle, busy);
  }

  /**
   * Reads a dispatch for a report, under its task's key, and checks the report may be made.
   * PostgreSQL: the statement that reads the task id takes the key (`lockKeyExpression`), and the
   * row is read again once it is held; SQLite's `BEGIN IMMEDIATE` already serializes, so one read.
   * `withGate`: the same re-read also returns the task's open gate (read under the key), for
   * `requireNoOpenGate`'s refusal after the report's own checks.
   */
  async function reportable(trx: Trx, dispatchId: string, lease: Lease<'dispatch'> | undefined, withGate: boolean) {
    await takeTaskKey(trx, dispatchId, taskKeyRead(dispatchId));
    const gates = tableIn(trx, 'decision_gates');
    const row = await trx
      .selectFrom('dispatch_contexts')
      .selectAll()
      .$if(withGate, (qb) =>
        qb.select(
          sql<string | null>`(select g.id from ${gates} g where g.task_id = ${sql.ref('dispatch_contexts.task_id')}
            and g.status = 'open' order by g.created_at, g.id limit 1)`.as('open_gate_id'),
        ),
      )
      .where('id', '=', dispatchId)
      .executeTakeFirst();
    if (!row) throw new NotFoundError('dispatch', dispatchId);
    const { open_gate_id: openGate, ...dispatch } = row;
    await checkReport(trx, dispatch, lease);
    return { row: dispatch, openGate: openGate ?? null };
  }

  /**
   * The statement that takes a dispatch's task key as it reads the task id (`lockKeyExpression`),
   * bound, for BEGIN to send (`WriteTransactionOptions.first`); null where `lockKey` is a no-op.
   */
  function taskKeyRead(dispatchId: string) {
    const taking = dialect.lockKeyExpression(sql<string>`${dispatchTaskLockKey('')} || ${sql.ref('task_id')}`);
    return taking === null
      ? null
      : db
          .selectFrom('dispatch_contexts')
          .select(['task_id', taking.as('locked')])
          .where('id', '=', dispatchId)
          .compile();
  }

  /** Takes the task key with `read` (`taskKeyRead`), or finds BEGIN took it; `NotFoundError` when no dispatch has the id. */
  async function takeTaskKey(trx: Trx, dispatchId: string, read: CompiledQuery | null): Promise<void> {
    if (read === null) return;
    const taken = dialect.beginResult(read) ?? (await runBound(trx, read));
    if (taken.rows.length === 0) throw new NotFoundError('dispatch', dispatchId);
  }

  /**
   * `endIn` for a completion in one statement after the key (`COMPLETE`, writable CTEs): the
   * same refusals in the same order, from the row the statement read; nothing is written when one
   * applies (the statement completes only an active dispatch of that token with no open gate).
   */
  async function completeFolded(
    trx: Trx,
    dispatchId: string,
    lease: Lease<'dispatch'> | undefined,
    result: string | null | undefined,
    keyRead: CompiledQuery | null,
  ) {
    await takeTaskKey(trx, dispatchId, keyRead);
    const now = ctx.clock.now();
    const read = await COMPLETE.first(trx, {
      id: dispatchId,
      token: lease?.token ?? null,
      now,
      setResult: result !== undefined,
      result: result ?? null,
    });
    if (!read) throw new NotFoundError('dispatch', dispatchId);
    const { open_gate_id: openGate, ended, moved_task: movedTask, dispatch } = read;
    await checkReport(trx, dispatch, lease);
    if (openGate !== null) throw new GateOpenError(dispatch.task_id, openGate);
    if (!ended) throw new Error(`taskfence: dispatch ${dispatchId} passed every check but did not complete`);
    const row: DispatchContextRow = extend(dispatch, { status: 'completed' as const, updated_at: now, ended_at: now });
    await auditLeaseActs(ctx, trx, now, [dispatchAct('released', row, { status: 'completed' })]);
    // `COMPLETE` moved the task's dependents too, once the task moved to done.
    const task =
      movedTask !== null
        ? (movedTask as unknown as TaskRow)
        : await trx.selectFrom('tasks').selectAll().where('id', '=', row.task_id).executeTakeFirstOrThrow();
    return { dispatch: toDispatch(row), task: toTask(task) };
  }

  /**
   * `completeDispatch` in one round trip (PostgreSQL, an unkeyed call whose acts are not
   * audited): BEGIN carries `COMPLETE_V2` (the task key, the completion, the dependents' move
   * and, with `next`, the terminal's next claim) and COMMIT. `AGENT_MISSING` when the next
   * claim's agent does not exist; null when the completion was refused. Either way nothing was
   * written, and the caller refuses, or runs the call again in an ordinary transaction, which
   * explains the refusal (its reasons need reads this round trip cannot make).
   */
  async function completeOnce(
    dispatchId: string,
    lease: Lease<'dispatch'> | undefined,
    result: string | null,
    next: Omit<ClaimNextInput, 'runId' | 'terminalHandle'> | null,
  ): Promise<CompletedDispatch | typeof AGENT_MISSING | null> {
    const now = ctx.clock.now();
    const complete = COMPLETE_V2.bind(db, {
      keyPrefix: taskKeyPrefix,
      id: dispatchId,
      token: lease?.token ?? null,
      now,
      setResult: true,
      result,
      next: next !== null,
      agentId: next?.agentId ?? null,
      ...claimFilterParams(next?.filter ?? {}),
      nextId: next === null ? '' : ctx.newId(),
      expiresAt: now + (next?.ttlMs ?? 0),
      traceContext: next?.traceContext ?? null,
    });
    return dialect.writeTransaction(
      async () => {
        const read = dialect.beginResult(complete)?.rows[0];
        if (read && next !== null && next.agentId !== null && read.agent_found === null) return AGENT_MISSING;
        if (!read?.ended || read.dispatch === null) return null;
        const { moved_task: moved, task_before: before, dispatch } = read;
        const row: DispatchContextRow = extend(dispatch, {
          status: 'completed' as const,
          updated_at: now,
          ended_at: now,
        });
        const done = { dispatch: toDispatch(row), task: toTask((moved ?? before) as unknown as TaskRow) };
        return next === null ? done : extend(done, { next: read.next === null ? null : toDispatch(read.next) });
      },
      { first: complete, commit: true },
    );
  }

  /**
   * `completeDispatch` with `next` in `trx`: the next claim's agent checked first (`NotFoundError`
   * before anything changes), the completion (`endIn`), then the claim for the dispatch's run and
   * terminal (`claimAfterCompletion`).
   */
  async function completeThenNext(
    trx: Trx,
    dispatchId: string,
    lease: Lease<'dispatch'> | undefined,
    result: string | null,
    keyRead: CompiledQuery | null,
    next: Omit<ClaimNextInput, 'runId' | 'terminalHandle'>,
  ): Promise<CompletedDispatch> {
    await requireAgent(trx, next.agentId);
    const done = await endIn(trx, dispatchId, 'completed', lease, result, keyRead);
    const runId = done.dispatch.coordinatorRunId;
    const made =
      runId === null
        ? null
        : await claimAfterCompletion(trx, extend(next, { runId, terminalHandle: done.dispatch.terminalHandle }));
    return extend(done, { next: made === null ? null : toDispatch(made) });
  }

  /**
   * `dispatchNext`'s claim after a completion in the same transaction: where `dispatchNext` would
   * refuse (the run no longer runs, the terminal is busy again), nothing is claimed and the
   * completion stands. The agent was checked before the completion.
   */
  async function claimAfterCompletion(trx: Trx, p: ClaimNextInput): Promise<DispatchContextRow | null> {
    if (dialect.writableCtes) {
      const { query, now } = claimNextStatement(p);
      const read = (await runBound(trx, query)).rows[0];
      if (!read || read.run_status !== 'running' || read.busy_id !== null || read.made === null) return null;
      const row = read.made;
      await auditLeaseActs(ctx, trx, now, [grantedAct(row)]);
      return row;
    }
    const run = await trx.selectFrom('coordinator_runs').select('status').where('id', '=', p.runId).executeTakeFirst();
    if (run?.status !== 'running' || (await newestActiveFor(trx, p.terminalHandle))) return null;
    return claimNextIn(trx, p);
  }

  /**
   * Runs a completion with `next`: the one-active-per-terminal index's violation (another call
   * gave the terminal a dispatch meanwhile) becomes `TerminalBusyError`, read after the rollback.
   */
  function onNextTerminal<T>(dispatchId: string, write: () => Promise<T>): Promise<T> {
    return explainAfterRollback(dialect, 'unique_violation', write, async (db) => {
      const ended = await db
        .selectFrom('dispatch_contexts')
        .select('terminal_handle')
        .where('id', '=', dispatchId)
        .executeTakeFirstOrThrow();
      const active = await newestActiveFor(db, ended.terminal_handle);
      throw new TerminalBusyError(ended.terminal_handle, active?.id ?? null);
    });
  }

  /** Ends an active dispatch as completed or cancelled and moves its task (done with `result`, or ready). */
  async function endIn(
    trx: Trx,
    dispatchId: string,
    status: 'completed' | 'cancelled',
    lease: Lease<'dispatch'> | undefined,
    result: string | null | undefined,
    keyRead: CompiledQuery | null = null,
  ) {
    if (dialect.writableCtes && status === 'completed')
      return completeFolded(trx, dispatchId, lease, result, keyRead ?? taskKeyRead(dispatchId));
    // A completion waits for the decision of an open gate on its task; a cancel does not.
    const { row, openGate } = await reportable(trx, dispatchId, lease, status === 'completed');
    if (openGate !== null) throw new GateOpenError(row.task_id, openGate);
    const now = ctx.clock.now();
    const ended = await trx
      .updateTable('dispatch_contexts')
      .set({ status, updated_at: now, ended_at: now })
      .where('id', '=', dispatchId)
      .where('status', '=', 'active')
      .returningAll()
      .executeTakeFirstOrThrow();
    await auditLeaseActs(ctx, trx, now, [dispatchAct('released', ended, { status })]);
    // The task as the move left it (its last write in this transaction: the finish moves only its dependents).
    const task = await moveInFlightTaskRow(
      trx,
      ended.task_id,
      status === 'completed' ? 'done' : 'ready',
      now,
      dialect.supportsSkipLocked,
      result,
    );
    return { dispatch: toDispatch(ended), task: toTask(task) };
  }

  const optionalLease = (options: unknown) => {
    const lease = optionalInput('options', options as { lease?: unknown } | undefined).lease;
    return lease === undefined ? undefined : requireLease('dispatch', lease, 'options.lease');
  };

  /**
   * Reclaims up to `limit` lapsed dispatches, reading candidates from `reader` and ending each in
   * `write` (its own transaction, or the keyed call's one).
   */
  async function reclaimIn(
    reader: Kysely<Database> | Trx,
    runId: string | undefined,
    limit: number,
    write: <T>(fn: (trx: Trx) => Promise<T>) => Promise<T>,
  ): Promise<ReclaimedDispatch[]> {
    const out: ReclaimedDispatch[] = [];
    while (out.length < limit) {
      const now = ctx.clock.now();
      // Lapsed leases, and legacy dispatches (no lease) one default TTL after their last update.
      let query = reader
        .selectFrom('dispatch_contexts')
        .select(['id', 'task_id'])
        .where('status', '=', 'active')
        .where((eb) =>
          eb.or([
            eb('lease_expires_at', '<=', now),
            eb.and([eb('lease_expires_at', 'is', null), eb('updated_at', '<=', now - DEFAULT_DISPATCH_LEASE_TTL_MS)]),
          ]),
        );
      if (runId !== undefined) query = query.where('coordinator_run_id', '=', runId);
      const candidates = await query
        .orderBy(sql`coalesce(lease_expires_at, updated_at + ${sql.lit(DEFAULT_DISPATCH_LEASE_TTL_MS)})`)
        .orderBy('seq')
        .limit(limit - out.length)
        .execute();
      if (candidates.length === 0) break;
      let progressed = false;
      for (const candidate of candidates) {
        const reclaimed = await write(async (trx) => {
          await dialect.lockKey(trx, dispatchTaskLockKey(candidate.task_id));
          const row = await trx
            .selectFrom('dispatch_contexts')
            .select(['status', 'lease_expires_at', 'updated_at'])
            .where('id', '=', candidate.id)
            .executeTakeFirstOrThrow();
          const at = ctx.clock.now();
          if (row.status !== 'active' || leaseExpiryOf(row) > at) return null;
          return failDispatchIn(ctx, trx, candidate.id, LEASE_EXPIRED, at, dialect.supportsSkipLocked);
        });
        if (reclaimed) {
          out.push(reclaimed);
          progressed = true;
        }
      }
      if (!progressed) break;
    }
    return out;
  }

  const repo: DispatchRepository = {
    async createDispatch(input) {
      requireInput('input', input);
      const taskId = requireId('taskId', input.taskId);
      const terminalHandle = requireId('terminalHandle', input.terminalHandle);
      const agentId = optionalId('agentId', input.agentId);
      if (input.runId !== undefined) requireId('runId', input.runId);
      const ttlMs = ttlOf(input.ttlMs);
      const traceContext = optionalTraceContext('traceContext', input.traceContext);
      const id = input.id === undefined ? ctx.newId() : requireId('id', input.id);
      const now = ctx.clock.now();
      const create = () =>
        dialect.writeTransaction(async (trx) => {
          if (input.id !== undefined) {
            const existing = await trx
              .selectFrom('dispatch_contexts')
              .selectAll()
              .where('id', '=', id)
              .executeTakeFirst();
            if (existing) {
              // A retry of this create (e.g. after COMMIT_OUTCOME_UNKNOWN): the same input gets the stored dispatch.
              requireSameCreate('dispatch', id, {
                taskId: [taskId, existing.task_id],
                terminalHandle: [terminalHandle, existing.terminal_handle],
                agentId: [agentId, existing.agent_id],
                runId: [input.runId ?? existing.coordinator_run_id, existing.coordinator_run_id],
              });
              return existing;
            }
          }
          await dialect.lockKey(trx, dispatchTaskLockKey(taskId));
          const task = await trx
            .selectFrom('tasks')
            .select(['id', 'status', 'coordinator_run_id'])
            .where('id', '=', taskId)
            .executeTakeFirst();
          if (!task) throw new NotFoundError('task', taskId);
          if (input.runId !== undefined) {
            await requireRunningRunIn(trx, input.runId);
            if (task.coordinator_run_id !== input.runId)
              throw new DispatchRunMismatchError(taskId, input.runId, task.coordinator_run_id);
          }
          const runId = task.coordinator_run_id;
          const active = await trx
            .selectFrom('dispatch_contexts')
            .select(['id', 'terminal_handle'])
            .where('task_id', '=', taskId)
            .where('status', '=', 'active')
            .where(sql<string>`coalesce(coordinator_run_id, '')`, '=', runId ?? '')
            .executeTakeFirst();
          if (active) throw new DispatchAlreadyActiveError(taskId, runId, active.id, active.terminal_handle);
          // The agent reference is checked before the first write, so a missing one is a NotFoundError and changes nothing.
          await requireAgent(trx, agentId);
          // The conditional UPDATE is the claim: it row-locks the task and re-checks `ready`.
          const claimed = await trx
            .updateTable('tasks')
            .set({ status: 'dispatched', updated_at: now })
            .where('id', '=', taskId)
            .where('status', '=', 'ready')
            .executeTakeFirst();
          if (claimed.numUpdatedRows === 0n) throw new TaskNotDispatchableError(taskId, task.status);
          // The terminal's one active dispatch is the partial unique index's to decide (no read
          // first): a second one violates it, here or in a racing transaction.
          return insertDispatch(ctx, trx, {
            id,
            task_id: taskId,
            agent_id: agentId,
            terminal_handle: terminalHandle,
            status: 'active',
            error: null,
            created_at: now,
            updated_at: now,
            ended_at: null,
            coordinator_run_id: runId,
            lease_expires_at: now + ttlMs,
            trace_context: traceContext,
          });
        });
      // A unique violation on a caller-chosen id (a racing create of it) runs once more and finds the row.
      const row = await onFreeTerminal([terminalHandle], () =>
        input.id === undefined ? create() : createOnce(dialect, [], create),
      );
      return toDispatch(row);
    },

    async dispatchNext(input) {
      requireInput('input', input);
      const runId = requireId('runId', input.runId);
      const terminalHandle = requireId('terminalHandle', input.terminalHandle);
      const agentId = optionalId('agentId', input.agentId);
      const filter = checkFilter(input.filter);
      const ttlMs = ttlOf(input.ttlMs);
      const traceContext = optionalTraceContext('traceContext', input.traceContext);
      const call = keyedCall(
        'dispatches.dispatchNext',
        input,
        { runId, terminalHandle, agentId, filter, ttlMs },
        NEXT_REFUSALS,
      );
      const p = { runId, terminalHandle, agentId, filter, ttlMs, traceContext };
      const row = await onFreeTerminal([terminalHandle], () => {
        // PostgreSQL, unkeyed, no grant to audit: the whole call is one round trip, BEGIN carrying
        // the claim and COMMIT (a refusal writes nothing, so it is thrown after that commit).
        const once =
          dialect.writableCtes && call === null && !auditsLeaseAct(ctx, 'granted') ? claimNextStatement(p) : undefined;
        return keyedWrite(
          ctx,
          call,
          async (trx) => {
            if (dialect.writableCtes) return claimNextFolded(trx, p, once);
            await requireDispatchable(trx, runId, agentId, terminalHandle);
            return claimNextIn(trx, p);
          },
          undefined,
          once?.query,
          true,
        );
      });
      return row ? toDispatch(row) : null;
    },

    async dispatchNextBatch(input) {
      requireInput('input', input);
      const runId = requireId('runId', input.runId);
      if (!Array.isArray(input.terminalHandles) || input.terminalHandles.length > 1_000)
        throw new InvalidArgumentError('terminalHandles', 'must be an array of at most 1000 terminal handles');
      const handles = [
        ...new Set((input.terminalHandles as unknown[]).map((h, i) => requireId(`terminalHandles[${i}]`, h))),
      ];
      const agentId = optionalId('agentId', input.agentId);
      const filter = checkFilter(input.filter);
      const ttlMs = ttlOf(input.ttlMs);
      const traceContext = optionalTraceContext('traceContext', input.traceContext);
      const limit = requireLimit('limit', input.limit, 1_000, Math.max(handles.length, 1));
      if (handles.length === 0) return [];
      const call = keyedCall(
        'dispatches.dispatchNextBatch',
        input,
        { runId, handles, agentId, filter, ttlMs, limit },
        NEXT_REFUSALS,
      );
      const p = { runId, handles, agentId, filter, ttlMs, traceContext, limit };
      const rows = await onFreeTerminal(handles, () => {
        // PostgreSQL, unkeyed, no grant to audit: one round trip, as dispatchNext's.
        const once =
          dialect.writableCtes && call === null && !auditsLeaseAct(ctx, 'granted') ? claimBatchStatement(p) : undefined;
        return keyedWrite(
          ctx,
          call,
          async (trx) => {
            if (dialect.writableCtes) return claimBatchFolded(trx, p, once);
            const made: DispatchContextRow[] = [];
            await requireDispatchable(trx, runId, agentId, null);
            for (const terminalHandle of handles) {
              if (made.length >= limit) break;
              if (await newestActiveFor(trx, terminalHandle)) continue;
              const row = await claimNextIn(trx, { runId, terminalHandle, agentId, filter, ttlMs, traceContext });
              if (!row) break;
              made.push(row);
            }
            return made;
          },
          undefined,
          once?.query,
          true,
        );
      });
      return rows.map(toDispatch);
    },

    async completeDispatch(dispatchId, options) {
      requireId('dispatchId', dispatchId);
      const opts = optionalInput('options', options);
      const result = requireJson('result', opts.result);
      const lease = optionalLease(options);
      const next = checkNext(opts.next);
      const { traceContext: _trace, ...nextInput } = next ?? {};
      const call = keyedCall(
        'dispatches.completeDispatch',
        opts,
        { dispatchId, result, lease, next: next === null ? undefined : nextInput },
        REPORT_REFUSALS,
      );
      // The whole call in one round trip when nothing has to be read between its statements.
      const once =
        dialect.writableCtes &&
        call === null &&
        !auditsLeaseAct(ctx, 'released') &&
        (next === null || !auditsLeaseAct(ctx, 'granted')) &&
        (!lease || lease.resource === dispatchId);
      // Otherwise the task key's read goes with BEGIN (PostgreSQL).
      const keyRead = () => (dialect.writableCtes ? taskKeyRead(dispatchId) : null);
      if (next === null) {
        if (once) {
          const done = await completeOnce(dispatchId, lease, result, null);
          if (done !== null && done !== AGENT_MISSING) return done;
        }
        const read = keyRead();
        return keyedWrite(
          ctx,
          call,
          (trx) => endIn(trx, dispatchId, 'completed', lease, result, read),
          undefined,
          read ?? undefined,
        );
      }
      return onNextTerminal(dispatchId, async () => {
        if (once) {
          const done = await completeOnce(dispatchId, lease, result, next);
          if (done === AGENT_MISSING) throw new NotFoundError('agent', next.agentId!);
          if (done) return done;
        }
        const read = keyRead();
        return keyedWrite(
          ctx,
          call,
          (trx) => completeThenNext(trx, dispatchId, lease, result, read, next),
          undefined,
          read ?? undefined,
        );
      });
    },

    async heartbeatDispatch(value, options) {
      const lease = requireLease('dispatch', value);
      const opts = optionalInput('options', options);
      const ttlMs = ttlOf(opts.ttlMs);
      const call = keyedCall('dispatches.heartbeatDispatch', opts, { lease, ttlMs }, REPORT_REFUSALS);
      return keyedWrite(ctx, call, async (trx) => {
        const now = ctx.clock.now();
        const renewed = await trx
          .updateTable('dispatch_contexts')
          .set({ lease_expires_at: now + ttlMs, updated_at: now })
          .where('id', '=', lease.resource)
          .where('seq', '=', lease.token)
          .where('status', '=', 'active')
          // Renew never revives a lapsed lease (the lease protocol): a lapsed one is reclaimable.
          .where('lease_expires_at', '>', now)
          .returningAll()
          .executeTakeFirst();
        if (renewed) {
          await auditLeaseActs(ctx, trx, now, [
            dispatchAct('renewed', renewed, { expiresAt: Number(renewed.lease_expires_at) }),
          ]);
          return toDispatch(renewed).lease!;
        }
        const row = await trx
          .selectFrom('dispatch_contexts')
          .selectAll()
          .where('id', '=', lease.resource)
          .executeTakeFirst();
        if (!row || Number(row.seq) !== lease.token)
          throw new DispatchLeaseLostError(lease.resource, lease.token, 'never_granted');
        if (row.status === 'active') throw new DispatchLeaseLostError(lease.resource, lease.token, 'expired');
        throw new DispatchLeaseLostError(lease.resource, lease.token, await endedReason(trx, row));
      });
    },

    async reclaimExpiredDispatches(options) {
      const opts = optionalInput('options', options);
      const runId = optionalIdFilter('runId', opts.runId);
      const limit = requireLimit('limit', opts.limit, 10_000, 100);
      const call = keyedCall('dispatches.reclaimExpiredDispatches', opts, { runId, limit }, []);
      // Keyed, the whole reclaim is one transaction, so its key records exactly what it took back.
      if (call !== null) return keyedWrite(ctx, call, (trx) => reclaimIn(trx, runId, limit, (fn) => fn(trx)));
      // One dispatch per transaction: each takes only its task's key, and a reclaim racing
      // another (or an exit, or a completion) ends the dispatch at most once.
      return reclaimIn(db, runId, limit, (fn) => dialect.writeTransaction(fn));
    },

    getDispatch,

    async getActiveDispatchForTerminal(terminalHandle) {
      requireId('terminalHandle', terminalHandle);
      const row = await newestActiveFor(db, terminalHandle);
      return row ? toDispatch(row) : null;
    },

    async failActiveDispatchOnExit(terminalHandle, options) {
      requireId('terminalHandle', terminalHandle);
      const opts = optionalInput('options', options);
      const error = optionalString('error', opts.error) ?? 'worker terminal exited';
      const named = optionalIdFilter('dispatchId', opts.dispatchId);
      const input = { terminalHandle, error, dispatchId: named };
      return keyedWrite(ctx, keyedCall('dispatches.failActiveDispatchOnExit', opts, input, []), async (trx) => {
        // Exit reports for one terminal queue here, so each sees the previous one's result.
        await dialect.lockKey(trx, dispatchTerminalLockKey(terminalHandle));
        let first: DispatchExitResult | null = null;
        // Every active dispatch of the terminal ends (the index allows one; legacy rows may hold more), newest first.
        for (;;) {
          const active = await newestActiveFor(trx, terminalHandle);
          if (!active) return first;
          if (named !== undefined && active.id !== named && first === null) return null;
          await dialect.lockKey(trx, dispatchTaskLockKey(active.task_id));
          const failed = await failDispatchIn(ctx, trx, active.id, error, ctx.clock.now(), dialect.supportsSkipLocked);
          if (!failed) continue; // ended meanwhile: look again
          first ??= extend(failed, { escalateTo: await escalationFor(trx, await rowOf(trx, failed.dispatch.id)) });
        }
      });
    },

    async endDispatch(dispatchId, status, options) {
      requireId('dispatchId', dispatchId);
      if (status !== 'completed' && status !== 'cancelled')
        throw new InvalidArgumentError('status', 'must be completed or cancelled');
      const lease = optionalLease(options);
      const opts = optionalInput('options', options);
      const call = keyedCall('dispatches.endDispatch', opts, { dispatchId, status, lease }, REPORT_REFUSALS);
      const ended = await keyedWrite(ctx, call, (trx) => endIn(trx, dispatchId, status, lease, undefined));
      return ended.dispatch;
    },

    async listDispatches(options) {
      const filter = optionalInput('filter', options);
      const runId = optionalIdFilter('runId', filter.runId);
      const taskId = optionalIdFilter('taskId', filter.taskId);
      const terminalHandle = optionalIdFilter('terminalHandle', filter.terminalHandle);
      const statuses = optionalStatusFilter('status', filter.status, DISPATCH_STATUSES);
      if (statuses !== null && statuses.length === 0) return [];
      let query = db.selectFrom('dispatch_contexts').selectAll();
      if (runId !== undefined) query = query.where('coordinator_run_id', '=', runId);
      if (taskId !== undefined) query = query.where('task_id', '=', taskId);
      if (terminalHandle !== undefined) query = query.where('terminal_handle', '=', terminalHandle);
      if (statuses !== null) query = query.where('status', 'in', statuses);
      const rows = await query.orderBy('seq').execute();
      return rows.map(toDispatch);
    },

    async countDispatchesByStatus(runId) {
      requireId('runId', runId);
      const rows = await db
        .selectFrom('dispatch_contexts')
        .select(['status', (eb) => eb.fn.countAll<number>().as('n')])
        .where('coordinator_run_id', '=', runId)
        .groupBy('status')
        .execute();
      const counts: Record<DispatchStatus, number> = { active: 0, completed: 0, failed: 0, cancelled: 0 };
      for (const r of rows) counts[r.status] = Number(r.n);
      return counts;
    },
  };
  return repo;
}

/** A dispatch row by id (it exists). */
function rowOf(trx: Trx, id: string): Promise<DispatchContextRow> {
  return trx.selectFrom('dispatch_contexts').selectAll().where('id', '=', id).executeTakeFirstOrThrow();
}

/**
 * `tx.assertLease` for a dispatch lease: its row, read `FOR SHARE` on PostgreSQL, must be active
 * with this token and unexpired. Heartbeats, reports and reclaims update the row, so they wait
 * for the fenced transaction.
 */
export const fenceDispatch: LeaseFence = async (ctx, trx, lease) => {
  const query = trx.selectFrom('dispatch_contexts').selectAll().where('id', '=', lease.resource);
  const row = ctx.dialect.supportsSkipLocked
    ? await query.forShare().executeTakeFirst()
    : await query.executeTakeFirst();
  const now = ctx.clock.now();
  if (!row || Number(row.seq) !== lease.token)
    throw new DispatchLeaseLostError(lease.resource, lease.token, 'never_granted');
  if (row.status === 'active' && leaseExpiryOf(row) > now) return;
  throw new DispatchLeaseLostError(
    lease.resource,
    lease.token,
    row.status === 'active' ? 'expired' : await endedReason(trx, row),
  );
};
