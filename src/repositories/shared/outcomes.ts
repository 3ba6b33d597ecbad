/**
 * Declared outcomes (issue 21): every repository call's outcome is declared by its area, beside
 * its functions, never guessed from a name or a result's shape. The event hub (`events.ts`) and
 * the OpenTelemetry spans (`otel/`) read the same declarations and the same table of error codes.
 *
 * - A call that returns: its area's declaration maps the result (of that call's own type) to an
 *   outcome, e.g. a claim's `{ status: 'busy' }` is `busy`.
 * - A call that throws: `ERROR_OUTCOMES` says what the code means (`busy`: someone else won or
 *   the request conflicts with the current state; `stale`: a lost lease, stale token, generation
 *   or claim). A stale code is `lost` for a call the declaration marks as the holder's own
 *   renewal (`renew`, `heartbeat`), and `refused` for every other call.
 */
import type { TaskfenceEvent } from '../../events.js';

/** What a repository call came to. */
export type CallOutcome =
  /** A claim granted the lease. */
  | 'acquired'
  /** Someone else holds it, or the request conflicts with the current state (a conflict). */
  | 'busy'
  /** A renewal or heartbeat learned that the lease is gone. */
  | 'lost'
  /** A renewal extended the lease. */
  | 'renewed'
  /** A release freed the lease (or had already). */
  | 'released'
  /** A stale token, generation or claim was refused. */
  | 'refused'
  /** Any other call that returned: a write committed, or a read. */
  | 'committed'
  /** `COMMIT_OUTCOME_UNKNOWN`: the connection was lost during COMMIT. */
  | 'unknown'
  /** Anything else that threw (invalid argument, not found, a database failure, …). */
  | 'error';

/** What a declaration may say about a result (lost keys go with `lost`, reconciled runs are reported one by one). */
export interface DeclaredResult {
  readonly outcome: Exclude<CallOutcome, 'unknown' | 'error'>;
  /** `lost`: the keys the holder no longer holds (the deprecated `renewPaths` by-name form). */
  readonly keys?: readonly string[];
}

/** One method's declaration. */
export interface OutcomeDeclaration<R> {
  /** The outcome of a call that returned `result`. */
  readonly returned: (result: R) => DeclaredResult;
  /** A stale code thrown by this call means the holder's lease is `lost` (its own renewal) or the call was `refused`. */
  readonly stale: 'lost' | 'refused';
  /** Events the result carries besides its outcome (the runs a reconcile failed, a prune's counts). */
  readonly events?: (result: R) => readonly TaskfenceEvent[];
}

/** Every method of a repository group, declared (a method without a declaration does not type-check). */
export type OutcomeDeclarations<Group> = {
  readonly [K in keyof Group]-?: Group[K] extends (...args: never[]) => Promise<infer R>
    ? OutcomeDeclaration<R>
    : never;
};

/** A call whose every return is `outcome`. */
function always(outcome: DeclaredResult['outcome'], stale: 'lost' | 'refused'): OutcomeDeclaration<unknown> {
  const result: DeclaredResult = Object.freeze({ outcome });
  return Object.freeze({ returned: () => result, stale });
}

/** A call that returns normally and is no claim, renewal or release: a write committed, or a read. */
export const committed = always('committed', 'refused');

/** A non-blocking claim: `{ status: 'acquired' }` or `{ status: 'busy' }`. */
export const claim: OutcomeDeclaration<{ readonly status: 'acquired' | 'busy' }> = Object.freeze({
  returned: (r: { readonly status: 'acquired' | 'busy' }): DeclaredResult => ({
    outcome: r.status === 'busy' ? 'busy' : 'acquired',
  }),
  stale: 'refused',
});

/** A claim that returns the grant itself or throws (blocking waits, throwing forms kept for one release). */
export const grant = always('acquired', 'refused');

/** The holder's own renewal or heartbeat: a stale code means its lease is lost. */
export const renewal = always('renewed', 'lost');

/** A release of a lease. */
export const release = always('released', 'refused');

/**
 * The one table of error codes that are answers of the protocol rather than failures: `busy`
 * (someone else won, or the state refuses the request: a `conflict` event) and `stale` (a lost
 * lease, stale token, generation or claim: a `refused` or `lease.lost` event). Codes not here are
 * `error` (and `COMMIT_OUTCOME_UNKNOWN` is `unknown`).
 */
export const ERROR_OUTCOMES: Readonly<Record<string, 'busy' | 'stale'>> = Object.freeze({
  // someone else won
  COORDINATOR_RUN_CONFLICT: 'busy',
  COORDINATOR_HANDLE_TAKEN: 'busy',
  DISPATCH_ALREADY_ACTIVE: 'busy',
  TERMINAL_BUSY: 'busy',
  GATE_ALREADY_RESOLVED: 'busy',
  RESOLUTION_ALREADY_CONSUMED: 'busy',
  CLEANUP_IN_PROGRESS: 'busy',
  CLEANUP_BARRIER: 'busy',
  OWNERSHIP_CHANGED: 'busy',
  PARENT_CHANGED: 'busy',
  PATH_LEASE_TIMEOUT: 'busy',
  SEMAPHORE_TIMEOUT: 'busy',
  PATH_CLAIM_REFUSED: 'busy',
  ALREADY_EXISTS: 'busy',
  // the state refuses the request: a task that is not runnable, an open gate
  TASK_NOT_DISPATCHABLE: 'busy',
  GATE_OPEN: 'busy',
  // a lost lease, stale token, generation or claim (every LeaseLostError code is here)
  STALE_WORKSPACE_LOCK: 'stale',
  STALE_TASK_LEASE: 'stale',
  STALE_OWNERSHIP: 'stale',
  CLEANUP_CLAIM_LOST: 'stale',
  COORDINATOR_RUN_NOT_RUNNING: 'stale',
  SEMAPHORE_LEASE_LOST: 'stale',
  PATH_LEASE_LOST: 'stale',
  DISPATCH_LEASE_LOST: 'stale',
});

/** The outcome of a call declared by `declaration` that threw an error with `code` (null: not a `TaskfenceError`). */
export function outcomeOfCode(declaration: OutcomeDeclaration<never>, code: string | null): CallOutcome {
  if (code === null) return 'error';
  if (code === 'COMMIT_OUTCOME_UNKNOWN') return 'unknown';
  const meaning = ERROR_OUTCOMES[code];
  if (meaning === 'busy') return 'busy';
  if (meaning === 'stale') return declaration.stale;
  return 'error';
}
