import diagnostics_channel from 'node:diagnostics_channel';
import type { ErrorKind } from './dialects/types.js';
import { TaskfenceError } from './errors.js';
import type { MigrationEvent } from './migrator/migrator.js';
import type { PruneResult } from './repositories/maintenance.js';
import { declarationOf, type Repositories } from './repositories/index.js';
import { outcomeOfCode, type CallOutcome } from './repositories/shared/outcomes.js';

/**
 * What a store reports while it works, on `node:diagnostics_channel` (publishing costs nothing
 * while nobody subscribes) and to the `onEvent` store option. Subscribe with
 * `diagnostics_channel.subscribe(TASKFENCE_CHANNELS.conflict, (event) => …)`.
 */
export const TASKFENCE_CHANNELS = Object.freeze({
  /** A write transaction failed transiently (SQLITE_BUSY, serialization, deadlock, connection loss before COMMIT) and is retried. */
  retry: 'taskfence:transaction:retry',
  /** A claim, start or transfer lost to someone else (busy lock, running run, path conflict, …). */
  conflict: 'taskfence:conflict',
  /** A stale fencing token, generation or claim was refused. */
  refused: 'taskfence:refused',
  /** A holder learned on renewal that its lease, lock or claim expired or was taken. */
  leaseLost: 'taskfence:lease:lost',
  /** `reconcileStaleRuns` failed a run whose heartbeat went stale. */
  runReconciled: 'taskfence:run:reconciled',
  /** A migration step or backfill progress. */
  migration: 'taskfence:migration',
  /** A prune finished. */
  prune: 'taskfence:prune',
  /** PostgreSQL: an idle pooled connection lost its server (terminated backend, restart, network); the pool drops it. */
  connectionLost: 'taskfence:connection:lost',
});

/** Every event a store emits (`onEvent`, and the `TASKFENCE_CHANNELS` diagnostics channels), told apart by `type`. */
export type TaskfenceEvent =
  | { readonly type: 'transaction.retry'; readonly kind: ErrorKind; readonly attempt: number; readonly delayMs: number }
  | { readonly type: 'conflict'; readonly operation: string; readonly code: string | null }
  | { readonly type: 'refused'; readonly operation: string; readonly code: string }
  | {
      readonly type: 'lease.lost';
      readonly operation: string;
      readonly code: string | null;
      readonly keys?: readonly string[];
    }
  | { readonly type: 'run.reconciled'; readonly runId: string; readonly targetKey: string | null }
  | { readonly type: 'migration'; readonly event: MigrationEvent }
  | { readonly type: 'prune'; readonly result: PruneResult }
  | { readonly type: 'connection.lost'; readonly code: string | null; readonly message: string };

const CHANNEL_OF: Record<TaskfenceEvent['type'], string> = {
  'transaction.retry': TASKFENCE_CHANNELS.retry,
  conflict: TASKFENCE_CHANNELS.conflict,
  refused: TASKFENCE_CHANNELS.refused,
  'lease.lost': TASKFENCE_CHANNELS.leaseLost,
  'run.reconciled': TASKFENCE_CHANNELS.runReconciled,
  migration: TASKFENCE_CHANNELS.migration,
  prune: TASKFENCE_CHANNELS.prune,
  'connection.lost': TASKFENCE_CHANNELS.connectionLost,
};

/**
 * Counters of one store since it opened (`store.stats()`).
 *
 * Calls made through a transaction (`store.transaction`'s `tx`, `store.withTransaction(trx)`)
 * count and report events like the store's own calls, when they return: a conflict the callback
 * saw is counted even if the callback then throws and the transaction rolls back. When a
 * `store.transaction` callback is retried (SQLITE_BUSY, serialization failure, deadlock,
 * connection loss before COMMIT), each attempt's calls count again, as each attempt is another
 * transaction in `transactions`; the `transaction.retry` event between them tells the attempts
 * apart. Such calls run in savepoints of the host's transaction, not transactions of their own,
 * so they add nothing to `transactions`.
 */
export interface StoreStats {
  /** Write and read transactions attempted (each retry is another attempt). */
  readonly transactions: number;
  /** Retries by kind of transient failure. */
  readonly retries: Readonly<Partial<Record<ErrorKind, number>>>;
  readonly conflicts: number;
  readonly refusals: number;
  readonly leasesLost: number;
  readonly runsReconciled: number;
  /** PostgreSQL: idle pooled connections that lost their server (each a `connection.lost` event). */
  readonly connectionsLost: number;
  /** PostgreSQL pool usage now; null on SQLite (one connection). */
  readonly pool: { readonly total: number; readonly idle: number; readonly waiting: number } | null;
}

/** Counts, publishes and forwards a store's events. */
export class EventHub {
  readonly #onEvent: ((event: TaskfenceEvent) => void) | undefined;
  readonly counters = {
    transactions: 0,
    retries: {} as Partial<Record<ErrorKind, number>>,
    conflicts: 0,
    refusals: 0,
    leasesLost: 0,
    runsReconciled: 0,
    connectionsLost: 0,
  };

  constructor(onEvent?: (event: TaskfenceEvent) => void) {
    this.#onEvent = onEvent;
  }

  emit(event: TaskfenceEvent): void {
    const c = this.counters;
    if (event.type === 'transaction.retry') c.retries[event.kind] = (c.retries[event.kind] ?? 0) + 1;
    else if (event.type === 'conflict') c.conflicts++;
    else if (event.type === 'refused') c.refusals++;
    else if (event.type === 'lease.lost') c.leasesLost++;
    else if (event.type === 'run.reconciled') c.runsReconciled++;
    else if (event.type === 'connection.lost') c.connectionsLost++;
    const channel = diagnostics_channel.channel(CHANNEL_OF[event.type]);
    if (channel.hasSubscribers) channel.publish(event);
    if (this.#onEvent) {
      try {
        this.#onEvent(event);
      } catch {
        // an observer's failure must not fail the operation it observes
      }
    }
  }

  /**
   * Wraps every repository function: each call reports the outcome its area declares
   * (`OUTCOMES`, shared/outcomes.ts): `busy` is a `conflict` event, `refused` a `refused` event,
   * `lost` a `lease.lost` event, and a declaration's own events (reconciled runs, prunes) follow.
   * Nothing is inferred from a call's name or its result's shape.
   */
  observe(repositories: Repositories): Repositories {
    const observed: Record<string, object> = {};
    for (const [area, repository] of Object.entries(repositories) as [string, Record<string, unknown>][]) {
      const wrapped: Record<string, unknown> = {};
      for (const [name, fn] of Object.entries(repository)) {
        if (typeof fn !== 'function') {
          wrapped[name] = fn;
          continue;
        }
        const operation = `${area}.${name}`;
        const declaration = declarationOf(area, name);
        wrapped[name] = (...args: unknown[]) =>
          (fn as (...a: unknown[]) => Promise<unknown>)(...args).then(
            (result) => {
              const declared = declaration.returned(result as never);
              this.#report(operation, declared.outcome, null, declared.keys);
              if (declaration.events) for (const event of declaration.events(result as never)) this.emit(event);
              return result;
            },
            (error: unknown) => {
              const code = error instanceof TaskfenceError ? error.code : null;
              this.#report(operation, outcomeOfCode(declaration, code), code);
              throw error;
            },
          );
      }
      observed[area] = Object.freeze(wrapped);
    }
    return observed as unknown as Repositories;
  }

  /** The event of a declared outcome, if it has one (`acquired`, `renewed`, `released`, `committed` and `error` have none). */
  #report(operation: string, outcome: CallOutcome, code: string | null, keys?: readonly string[]): void {
    if (outcome === 'busy') this.emit({ type: 'conflict', operation, code });
    else if (outcome === 'refused' && code !== null) this.emit({ type: 'refused', operation, code });
    else if (outcome === 'lost')
      this.emit({ type: 'lease.lost', operation, code, ...(keys === undefined ? {} : { keys }) });
  }
}
