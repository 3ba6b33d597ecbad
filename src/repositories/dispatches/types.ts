/** The public types of `store.dispatches` (SPEC §3): dispatch contexts, their errors and guarantees. */
import { TaskfenceError } from '../../errors.js';
import type { CoordinatorRunStatus, DispatchStatus, TaskStatus } from '../../schema/database.js';

/** Failed dispatches of one task that trip its circuit breaker: the task fails instead of returning to ready. */
export const DISPATCH_FAILURE_LIMIT = 3;

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
}

export interface CreateDispatchInput {
  readonly taskId: string;
  /** The worker terminal the task is sent to; its exit is reported by this handle. */
  readonly terminalHandle: string;
  readonly agentId?: string | null;
  /**
   * The dispatching run. If given it must be running and own the task (a run never dispatches
   * another run's task); default: the task's own run.
   */
  readonly runId?: string;
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

/** The task is not `ready`, so it cannot be dispatched. */
export class TaskNotDispatchableError extends TaskfenceError {
  readonly code = 'TASK_NOT_DISPATCHABLE';
  constructor(
    readonly taskId: string,
    readonly status: TaskStatus,
  ) {
    super(
      `Task ${taskId} is ${status}, not ready, so it cannot be dispatched. Dispatch it once it is ready (a failed dispatch returns it to ready).`,
    );
  }
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

/** Dispatch contexts (SPEC §3): a task sent to a worker terminal, scoped to a run. */
export interface DispatchRepository {
  /**
   * Dispatches a `ready` task to a terminal and moves it to `dispatched`, atomically: of
   * concurrent dispatches of one task exactly one succeeds, the others get
   * `TaskNotDispatchableError` (or `DispatchAlreadyActiveError`). The dispatch is stamped with the task's run.
   */
  createDispatch(input: CreateDispatchInput): Promise<Dispatch>;
  /** The dispatch with this id, or null; a plain read. */
  getDispatch(id: string): Promise<Dispatch | null>;
  /** The terminal's active dispatch; if it has several, deterministically the newest (by creation time, then id). */
  getActiveDispatchForTerminal(terminalHandle: string): Promise<Dispatch | null>;
  /**
   * On a worker terminal's exit: fails its active dispatch (exactly once, however many exit
   * reports race), counts the task's failures, trips the circuit breaker at
   * `DISPATCH_FAILURE_LIMIT` (task `failed`) or returns the task to `ready`, and names the run to
   * escalate to. Returns null if the terminal has no active dispatch.
   */
  failActiveDispatchOnExit(terminalHandle: string, options?: { error?: string }): Promise<DispatchExitResult | null>;
  /** Ends an active dispatch as completed or cancelled; an ended one gets `DispatchNotActiveError`. */
  endDispatch(dispatchId: string, status: 'completed' | 'cancelled'): Promise<Dispatch>;
  /** Dispatches matching the filter, oldest first. */
  listDispatches(filter?: ListDispatchesFilter): Promise<Dispatch[]>;
  /** Dispatch counts of one run by status (every status present, zero if none). */
  countDispatchesByStatus(runId: string): Promise<Record<DispatchStatus, number>>;
}
