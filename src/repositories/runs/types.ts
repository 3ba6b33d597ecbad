/** The public types of `store.runs` (SPEC §3): coordinator runs, their errors and guarantees. */
import { TaskfenceError } from '../../errors.js';
import type { CoordinatorRunStatus } from '../../schema/database.js';
import type { CoordinatorRunLease } from '../shared/running-run.js';
import type { IdempotencyOptions } from '../idempotent.js';
import { claim, committed, grant, release, renewal, type OutcomeDeclarations } from '../shared/outcomes.js';

/** A coordinator run: the scope of a coordinator's dispatches, gates and messages (SPEC §3). */
export interface CoordinatorRun {
  readonly id: string;
  /** Unique per run (`coordinator-<hex>` unless the caller chose one): the run's message inbox. */
  readonly coordinatorHandle: string;
  readonly status: CoordinatorRunStatus;
  /** The orchestration target (`worktree:<id>`); null runs share one slot. */
  readonly targetKey: string | null;
  readonly spec: string | null;
  readonly startedAt: number;
  readonly endedAt: number | null;
  readonly heartbeatAt: number | null;
}

export interface StartCoordinatorRunInput {
  /**
   * Default: a fresh id. Name the run yourself to make the start retryable: a start with the id of
   * an existing run with the same target, spec and handle returns that run (with
   * `adoptedTaskCount: 0`) instead of a conflict, so a retry after `COMMIT_OUTCOME_UNKNOWN` converges.
   */
  readonly id?: string;
  /** From `resolveOrchestrationTargetKey`; `null` is the shared null target. Required: the caller decides. */
  readonly targetKey: string | null;
  readonly spec?: string | null;
  /** Default: a fresh `coordinator-<hex>`. Must be unique across all runs. */
  readonly coordinatorHandle?: string;
}

export interface StartedCoordinatorRun extends CoordinatorRun {
  /** How many unowned tasks of the target the run adopted in its start transaction. */
  readonly adoptedTaskCount: number;
}

export type StoppedRunStatus = Exclude<CoordinatorRunStatus, 'running'>;

export interface ListCoordinatorRunsFilter {
  readonly status?: CoordinatorRunStatus | readonly CoordinatorRunStatus[];
  /** `null` selects null-target runs. */
  readonly targetKey?: string | null;
}

/** The running run a `tryStartCoordinatorRun` lost to (`expiresAt`: runs have no TTL, so `Number.MAX_SAFE_INTEGER`). */
export interface CoordinatorRunHolder {
  readonly holder: string;
  readonly expiresAt: number;
  readonly runId: string;
  readonly targetKey: string | null;
}

/** `tryStartCoordinatorRun`'s result. */
export type CoordinatorRunClaim =
  | { readonly status: 'acquired'; readonly run: StartedCoordinatorRun; readonly lease: CoordinatorRunLease }
  | { readonly status: 'busy'; readonly heldBy: CoordinatorRunHolder };

/** Another run is already running on the target; the database refused a second one. */
export class CoordinatorRunConflictError extends TaskfenceError {
  readonly code = 'COORDINATOR_RUN_CONFLICT';
  constructor(
    readonly targetKey: string | null,
    readonly runningRunId: string,
    readonly runningCoordinatorHandle: string,
  ) {
    super(
      `A coordinator run is already running on ${targetKey === null ? 'the null target' : `target ${JSON.stringify(targetKey)}`} ` +
        `(run ${runningRunId}, handle ${runningCoordinatorHandle}). Nothing was started. Stop that run by id, ` +
        'or, if its process died, let reconcileStaleRuns fail it once its heartbeat is stale; or pass a different --worktree.',
    );
  }
}

/** An explicitly chosen coordinator handle is already used by another run. */
export class CoordinatorHandleTakenError extends TaskfenceError {
  readonly code = 'COORDINATOR_HANDLE_TAKEN';
  constructor(
    readonly coordinatorHandle: string,
    readonly existingRunId: string,
  ) {
    super(
      `The coordinator handle ${JSON.stringify(coordinatorHandle)} already belongs to run ${existingRunId}. ` +
        'Handles are inboxes and must be unique per run: omit coordinatorHandle to get a fresh coordinator-<hex> one.',
    );
  }
}

/** Coordinator runs (SPEC §3): one running run per target, adoption, heartbeats and crash recovery. */
export interface RunRepository {
  /**
   * Starts a run on `targetKey` and, in the same transaction, adopts the target's unowned tasks.
   * The partial unique index on running runs decides: across processes and connections at most
   * one run is running per target (null targets share one slot); every loser gets
   * `CoordinatorRunConflictError` naming the running run, with its transaction rolled back.
   *
   * @example
   * const run = await store.runs.startCoordinatorRun({ targetKey: 'worktree:7f3a' });
   */
  startCoordinatorRun(input: StartCoordinatorRunInput): Promise<StartedCoordinatorRun>;
  /**
   * `startCoordinatorRun` with losing the race returned, not thrown (issue 21): `{ status:
   * 'acquired', run, lease }` (the run and its `coordinatorRunLease`), or `{ status: 'busy',
   * heldBy }` naming the running run where `startCoordinatorRun` throws
   * `CoordinatorRunConflictError`. Every other refusal still throws.
   *
   * @example
   * const r = await store.runs.tryStartCoordinatorRun({ targetKey: 'worktree:7f3a' });
   * if (r.status === 'busy') console.log(`run ${r.heldBy.runId} is running`);
   */
  tryStartCoordinatorRun(input: StartCoordinatorRunInput): Promise<CoordinatorRunClaim>;
  /**
   * Gives the running run `runId` the target's unowned tasks (no run, or a run that is not
   * running) and re-points their dispatches and gates, atomically; never a live run's tasks or
   * another target's. Returns how many tasks it adopted.
   */
  adoptUnownedTasks(runId: string, targetKey: string | null): Promise<number>;
  /** The running run of a target (null targets share one), or null. */
  getActiveCoordinatorRunForTarget(targetKey: string | null): Promise<CoordinatorRun | null>;
  /** The run with this id in whatever status it is, or null; a plain read. */
  getCoordinatorRun(runId: string): Promise<CoordinatorRun | null>;
  /** Runs matching the filter, oldest first (by start time, then id). */
  listCoordinatorRuns(filter?: ListCoordinatorRunsFilter): Promise<CoordinatorRun[]>;
  /**
   * Stops the run with this id (never "the latest run") if it is still running; a run that
   * already stopped or was reconciled gets `CoordinatorRunNotRunningError`.
   */
  stopCoordinatorRun(runId: string, status: StoppedRunStatus, options?: IdempotencyOptions): Promise<CoordinatorRun>;
  /**
   * Records that the run's holder is alive. Only a running run can heartbeat: once reconciled
   * or stopped, the call fails with `CoordinatorRunNotRunningError` and the run stays dead.
   */
  heartbeatCoordinatorRun(runId: string, options?: IdempotencyOptions): Promise<CoordinatorRun>;
  /**
   * Fails, in one statement, every running run whose last heartbeat is older than
   * `staleAfterMs`, freeing its target; a heartbeat that commits first keeps its run alive.
   * Returns the runs it failed.
   */
  reconcileStaleRuns(options: { staleAfterMs: number }): Promise<CoordinatorRun[]>;
}

/** Each call's declared outcome (see shared/outcomes.ts): stopping a run releases it, a heartbeat renews it. */
export const RUN_OUTCOMES: OutcomeDeclarations<RunRepository> = {
  tryStartCoordinatorRun: claim,
  startCoordinatorRun: grant,
  adoptUnownedTasks: committed,
  getActiveCoordinatorRunForTarget: committed,
  getCoordinatorRun: committed,
  listCoordinatorRuns: committed,
  stopCoordinatorRun: release,
  heartbeatCoordinatorRun: renewal,
  reconcileStaleRuns: {
    returned: () => ({ outcome: 'committed' }),
    stale: 'refused',
    events: (runs) => runs.map((run) => ({ type: 'run.reconciled', runId: run.id, targetKey: run.targetKey })),
  },
};
