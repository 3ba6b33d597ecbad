/** The public types of `store.dispatches` (SPEC §3): dispatch contexts, their errors and guarantees. */
import { TaskfenceError } from '../../errors.js';
import type { CoordinatorRunStatus, DispatchStatus, TaskStatus } from '../../schema/database.js';
import type { Lease } from '../shared/lease.js';
import type { Task } from '../shared/records.js';
import type { TraceContext } from '../shared/trace-context.js';
import type { IdempotencyOptions } from '../idempotent.js';
import { DispatchLeaseLostError, LEASE_EXPIRED, TaskNotDispatchableError } from '../shared/lifecycle.js';
import { committed, grant, release, renewal, type OutcomeDeclarations } from '../shared/outcomes.js';

export { DispatchLeaseLostError, LEASE_EXPIRED, TaskNotDispatchableError };

/** Failed dispatches of one task that trip its circuit breaker: the task fails instead of returning to ready. */
export const DISPATCH_FAILURE_LIMIT = 3;

/** A dispatch's lease lifetime unless the caller says otherwise (5 minutes; heartbeat at about a third of it). */
export const DEFAULT_DISPATCH_LEASE_TTL_MS = 5 * 60_000;

/** A dispatch: a task handed to an agent's terminal within a run, with its status and lease. */
export interface Dispatch {
  readonly id: string;
  readonly taskId: string;
  readonly agentId: string | null;
  readonly terminalHandle: string;
  readonly status: DispatchStatus;
  readonly error: string | null;
  readonly createdAt: number;
  readonly updatedAt: number;
  readonly endedAt: number | null;
  readonly coordinatorRunId: string | null;
  /** The insertion order ("newest" is the highest), and the lease's fencing token. */
  readonly seq: number;
  /**
   * When the lease lapses unless renewed; null for a legacy dispatch (no lease), which
   * `reclaimExpiredDispatches` takes back `DEFAULT_DISPATCH_LEASE_TTL_MS` after `updatedAt`.
   */
  readonly leaseExpiresAt: number | null;
  /**
   * The dispatch lease while the dispatch is active (kind `dispatch`, resource the dispatch id,
   * holder the terminal, token `seq`): pass it to `heartbeatDispatch`, `completeDispatch` and
   * `tx.assertLease`. Null once the dispatch ended, and for legacy dispatches.
   */
  readonly lease: Lease<'dispatch'> | null;
  /** The dispatcher's W3C trace context (`traceparent`, `tracestate`); null if dispatched outside a traced context. */
  readonly traceContext: TraceContext | null;
}

/** What `completeDispatch` ended: the dispatch and its task, in one transaction. */
export interface CompletedDispatch {
  readonly dispatch: Dispatch;
  readonly task: Task;
  /**
   * With the `next` option only: the terminal's next dispatch, claimed in the completion's
   * transaction, or null when nothing was ready, the run no longer runs, or the terminal was
   * given another dispatch meanwhile. Absent without `next`.
   */
  readonly next?: Dispatch | null;
}

/**
 * `completeDispatch`'s `next`: the next claim for the completed dispatch's run and terminal, as
 * `dispatchNext` makes it (`true`: with its defaults).
 */
export interface NextDispatchOptions {
  readonly agentId?: string | null;
  readonly filter?: DispatchNextFilter;
  /** The next dispatch lease's lifetime (default `DEFAULT_DISPATCH_LEASE_TTL_MS`). */
  readonly ttlMs?: number;
  /** The dispatcher's W3C trace context to store with the next dispatch. Default: none. */
  readonly traceContext?: TraceContext | null;
}

/** `completeDispatch`'s options. */
export interface CompleteDispatchOptions extends DispatchReportOptions {
  /** The task's result, stored as JSON (default: the task's `result` is kept). */
  readonly result?: unknown;
  /**
   * Claim the terminal's next task in the same transaction (one round trip on PostgreSQL), as
   * `dispatchNext` would right after: the worker loop's step. Returned as `next`.
   */
  readonly next?: true | NextDispatchOptions;
}

/** Options of the reports a worker makes on its dispatch. */
export interface DispatchReportOptions extends IdempotencyOptions {
  /** The dispatch lease it holds: a superseded or reclaimed one is refused with `DispatchLeaseLostError`. */
  readonly lease?: Lease<'dispatch'>;
}

/** `dispatchNext`'s choice among the run's ready tasks. */
export interface DispatchNextFilter {
  /** Only tasks assigned to this agent (null: unassigned ones). */
  readonly assigneeAgentId?: string | null;
  /** Only tasks of at least this priority. */
  readonly minPriority?: number;
}

export interface DispatchNextInput extends IdempotencyOptions {
  readonly runId: string;
  readonly terminalHandle: string;
  readonly agentId?: string | null;
  readonly filter?: DispatchNextFilter;
  /** The dispatch lease's lifetime (default `DEFAULT_DISPATCH_LEASE_TTL_MS`). */
  readonly ttlMs?: number;
  /**
   * The dispatcher's W3C trace context to store with the dispatch (a `propagation.inject`
   * carrier); `taskfence/otel`'s `traceStore` fills it from the active span. Default: none.
   */
  readonly traceContext?: TraceContext | null;
}

export interface DispatchNextBatchInput extends IdempotencyOptions {
  readonly runId: string;
  /** Free terminals to fill, in order; a busy one is skipped. */
  readonly terminalHandles: readonly string[];
  readonly agentId?: string | null;
  readonly filter?: DispatchNextFilter;
  readonly ttlMs?: number;
  /** At most this many dispatches (default: one per terminal). */
  readonly limit?: number;
  /**
   * The dispatcher's W3C trace context to store with the dispatch (a `propagation.inject`
   * carrier); `taskfence/otel`'s `traceStore` fills it from the active span. Default: none.
   */
  readonly traceContext?: TraceContext | null;
}

/** One dispatch `reclaimExpiredDispatches` took back. */
export interface ReclaimedDispatch {
  /** The dispatch, now `failed` with error `lease_expired`. */
  readonly dispatch: Dispatch;
  readonly failureCount: number;
  readonly circuitBreakerTripped: boolean;
  /** `ready` again, or `failed` by the breaker. */
  readonly taskStatus: TaskStatus;
}

export interface CreateDispatchInput {
  /**
   * The dispatch's id (default: generated). A retry with the same id and input returns the
   * dispatch as stored (whatever its status now); other input under the id is `ALREADY_EXISTS`.
   */
  readonly id?: string;
  readonly taskId: string;
  /** The worker terminal the task is sent to; its exit is reported by this handle. */
  readonly terminalHandle: string;
  readonly agentId?: string | null;
  /**
   * The dispatching run. If given it must be running and own the task (a run never dispatches
   * another run's task); default: the task's own run.
   */
  readonly runId?: string;
  /** The dispatch lease's lifetime (default `DEFAULT_DISPATCH_LEASE_TTL_MS`). */
  readonly ttlMs?: number;
  /**
   * The dispatcher's W3C trace context to store with the dispatch (a `propagation.inject`
   * carrier); `taskfence/otel`'s `traceStore` fills it from the active span. Default: none.
   */
  readonly traceContext?: TraceContext | null;
}

export interface ListDispatchesFilter {
  /** Only dispatches of this coordinator run. */
  readonly runId?: string;
  readonly taskId?: string;
  readonly terminalHandle?: string;
  readonly status?: DispatchStatus | readonly DispatchStatus[];
}

/** Where a worker's exit is escalated: which run's coordinator must hear about it. */
export interface EscalationTarget {
  readonly runId: string;
  readonly coordinatorHandle: string;
  readonly runStatus: CoordinatorRunStatus;
  /**
   * `dispatch_run`: the dispatch's own run. Legacy dispatches with no run fall back to
   * `task_target_run` (the running run of the task's target, exact under concurrency) and only
   * then to `latest_running_run` (the most recently started running run anywhere).
   */
  readonly via: 'dispatch_run' | 'task_target_run' | 'latest_running_run';
}

export interface DispatchExitResult {
  /** The dispatch, now `failed`. */
  readonly dispatch: Dispatch;
  /** Failed dispatches of the task so far, this one included. */
  readonly failureCount: number;
  /** True when this failure reached `DISPATCH_FAILURE_LIMIT` and failed the task. */
  readonly circuitBreakerTripped: boolean;
  /** The task's status afterwards: `ready` again, `failed` by the breaker, or unchanged if it had already left flight. */
  readonly taskStatus: TaskStatus;
  /** Null only for a legacy dispatch when no run is running at all. */
  readonly escalateTo: EscalationTarget | null;
}

/** The task already has an active dispatch in this run. */
export class DispatchAlreadyActiveError extends TaskfenceError {
  readonly code = 'DISPATCH_ALREADY_ACTIVE';
  constructor(
    readonly taskId: string,
    readonly runId: string | null,
    readonly activeDispatchId: string,
    readonly terminalHandle: string,
  ) {
    super(
      `Task ${taskId} already has active dispatch ${activeDispatchId} on terminal ${terminalHandle}` +
        `${runId === null ? '' : ` in run ${runId}`}. End or fail that dispatch before dispatching the task again.`,
    );
  }
}

/** A run tried to dispatch a task it does not own. */
export class DispatchRunMismatchError extends TaskfenceError {
  readonly code = 'DISPATCH_RUN_MISMATCH';
  constructor(
    readonly taskId: string,
    readonly runId: string,
    readonly taskRunId: string | null,
  ) {
    super(
      `Run ${runId} cannot dispatch task ${taskId}: the task belongs to ${taskRunId === null ? 'no run' : `run ${taskRunId}`}. ` +
        'A run dispatches only its own tasks; adopt the task first (adoptUnownedTasks) if it is unowned.',
    );
  }
}

/** The dispatch already ended. */
export class DispatchNotActiveError extends TaskfenceError {
  readonly code = 'DISPATCH_NOT_ACTIVE';
  constructor(
    readonly dispatchId: string,
    readonly status: DispatchStatus,
  ) {
    super(
      `Dispatch ${dispatchId} is already ${status}; it was ended by someone else (for example its terminal's exit). Re-read it before acting.`,
    );
  }
}

/** The terminal already has an active dispatch: one terminal runs one dispatch at a time. */
export class TerminalBusyError extends TaskfenceError {
  readonly code = 'TERMINAL_BUSY';
  constructor(
    readonly terminalHandle: string,
    readonly activeDispatchId: string | null,
  ) {
    super(
      `Terminal ${terminalHandle} already has an active dispatch${activeDispatchId === null ? '' : ` (${activeDispatchId})`}. ` +
        'A terminal runs one dispatch at a time: complete, end or fail it first, or dispatch to a free terminal.',
    );
  }
}

/** Dispatch contexts (SPEC §3): a task sent to a worker terminal, scoped to a run. */
export interface DispatchRepository {
  /**
   * Dispatches a `ready` task to a terminal and moves it to `dispatched`, atomically: of
   * concurrent dispatches of one task exactly one succeeds, the others get
   * `TaskNotDispatchableError` (or `DispatchAlreadyActiveError`). The dispatch is stamped with
   * the task's run and carries a lease. A terminal that already has an active dispatch is
   * refused with `TerminalBusyError` (a partial unique index decides, also under a race).
   */
  createDispatch(input: CreateDispatchInput): Promise<Dispatch>;
  /**
   * Atomically picks the run's highest-priority, oldest (`seq`) `ready` task whose dependencies
   * are all done, dispatches it to the terminal and returns the dispatch; null when nothing is
   * ready. PostgreSQL claims with `FOR UPDATE SKIP LOCKED`, so concurrent claimers do not
   * serialize; SQLite's writers are serialized by `BEGIN IMMEDIATE`. A busy terminal is
   * `TerminalBusyError`.
   */
  dispatchNext(input: DispatchNextInput): Promise<Dispatch | null>;
  /** `dispatchNext` for several free terminals in one transaction: the dispatches made, at most `limit`. */
  dispatchNextBatch(input: DispatchNextBatchInput): Promise<Dispatch[]>;
  /**
   * Ends an active dispatch as completed and its task as `done` (with `result`), in one
   * transaction; dependents whose dependencies are now all done become `ready` in it too.
   * A dispatch that was reclaimed or superseded (or whose `lease` is) is `DispatchLeaseLostError`,
   * one ended otherwise `DispatchNotActiveError`; neither changes anything.
   *
   * With `next`, the same transaction then claims the next ready task of the dispatch's run for
   * its terminal, as `dispatchNext` does (returned as `next`, null when none). A refused
   * completion claims nothing; a missing `next.agentId` is `NotFoundError` before anything
   * changes; a run that no longer runs leaves the completion standing and `next` null.
   */
  completeDispatch(dispatchId: string, options?: CompleteDispatchOptions): Promise<CompletedDispatch>;
  /**
   * Renews a live dispatch lease for `ttlMs` (default: the lease's own lifetime at creation is not
   * kept; `DEFAULT_DISPATCH_LEASE_TTL_MS`). Renew never revives a lapsed lease: one lapsed but not
   * yet reclaimed is `DispatchLeaseLostError` (`expired`), as is a reclaimed one; a superseded or
   * ended one is `DispatchLeaseLostError` (`superseded`, `released`).
   */
  heartbeatDispatch(
    lease: Lease<'dispatch'>,
    options?: { ttlMs?: number } & IdempotencyOptions,
  ): Promise<Lease<'dispatch'>>;
  /**
   * Takes back every active dispatch whose lease lapsed: each ends `failed` with error
   * `lease_expired`, counts against its task's breaker, and its task returns to `ready` (or
   * `failed` at `DISPATCH_FAILURE_LIMIT`). Each dispatch is reclaimed exactly once however many
   * reclaimers race. A legacy dispatch (no lease) lapses `DEFAULT_DISPATCH_LEASE_TTL_MS` after its
   * last update. At most `limit` (default 100) per call. With an `idempotencyKey` the whole
   * call is one transaction, and a retry returns the dispatches that call reclaimed.
   */
  reclaimExpiredDispatches(
    options?: { runId?: string; limit?: number } & IdempotencyOptions,
  ): Promise<ReclaimedDispatch[]>;
  /** The dispatch with this id, or null; a plain read. */
  getDispatch(id: string): Promise<Dispatch | null>;
  /** The terminal's active dispatch (at most one, enforced by a unique index). */
  getActiveDispatchForTerminal(terminalHandle: string): Promise<Dispatch | null>;
  /**
   * On a worker terminal's exit: fails its active dispatch (exactly once, however many exit
   * reports race; with `dispatchId`, only if that is the terminal's active dispatch, so a reaper
   * acting on an old dispatch never fails the terminal's new one), counts the task's failures, trips the circuit breaker at
   * `DISPATCH_FAILURE_LIMIT` (task `failed`) or returns the task to `ready`, and names the run to
   * escalate to. Returns null if the terminal has no active dispatch.
   */
  failActiveDispatchOnExit(
    terminalHandle: string,
    options?: { error?: string; dispatchId?: string } & IdempotencyOptions,
  ): Promise<DispatchExitResult | null>;
  /**
   * Ends an active dispatch and moves its task along the table: `completed` → task `done` (as
   * `completeDispatch`), `cancelled` → task `ready` again. An ended one gets
   * `DispatchNotActiveError` (`DispatchLeaseLostError` if it was reclaimed or superseded).
   */
  endDispatch(
    dispatchId: string,
    status: 'completed' | 'cancelled',
    options?: DispatchReportOptions,
  ): Promise<Dispatch>;
  /** Dispatches matching the filter, oldest first (by `seq`, the insertion order). */
  listDispatches(filter?: ListDispatchesFilter): Promise<Dispatch[]>;
  /** Dispatch counts of one run by status (every status present, zero if none). */
  countDispatchesByStatus(runId: string): Promise<Record<DispatchStatus, number>>;
}

/** Each call's declared outcome (see shared/outcomes.ts): a dispatch is a lease, granted by a dispatch and released by its end. */
export const DISPATCH_OUTCOMES: OutcomeDeclarations<DispatchRepository> = {
  createDispatch: grant,
  dispatchNext: { returned: (d) => ({ outcome: d === null ? 'committed' : 'acquired' }), stale: 'refused' },
  dispatchNextBatch: { returned: (ds) => ({ outcome: ds.length === 0 ? 'committed' : 'acquired' }), stale: 'refused' },
  completeDispatch: release,
  heartbeatDispatch: renewal,
  reclaimExpiredDispatches: committed,
  getDispatch: committed,
  getActiveDispatchForTerminal: committed,
  failActiveDispatchOnExit: release,
  endDispatch: release,
  listDispatches: committed,
  countDispatchesByStatus: committed,
};
