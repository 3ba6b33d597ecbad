import type { RawBuilder, Transaction } from 'kysely';
import type { Database } from '../schema/database.js';
import { clampTimerMs } from '../timers.js';

/**
 * Wake-ups for waiters (a blocked `acquirePaths`, `waitForMessages`): a writer announces a topic
 * when its transaction commits, and waiters on that topic re-check at once instead of at their
 * next poll. A notification is only a hint: waiters always re-check the database, and a waiter
 * whose notification was lost wakes anyway after `fallbackMs`, so correctness never rests on it.
 *
 * Implementations: `postgres/postgres-wakeups.ts` (LISTEN/NOTIFY) and `sqlite/sqlite-wakeups.ts`
 * (COMMIT hook and `PRAGMA data_version`); both keep their waiters in a `WaiterRegistry`.
 */
export interface Wakeups {
  /** Announces `topic` when `trx` commits (nothing if it rolls back). */
  notify(trx: Transaction<Database>, topic: string): Promise<void>;
  /**
   * `notify` as an expression, for the RETURNING of the statement that writes the rows waiters
   * watch: it announces `topic` once a returned row exists (PostgreSQL delivers the identical
   * notifications of one transaction once), saving a round trip. Null where announcing is not a
   * statement (SQLite's COMMIT hook) or wake-ups are off: call `notify` instead, as before.
   */
  notifyExpression(topic: string): RawBuilder<unknown> | null;
  /**
   * Subscribes to `topic` now; the returned promise resolves when the topic is announced (by any
   * process) or after `fallbackMs`. Subscribe before checking the database, then await: an
   * announcement between the check and the wait is not missed.
   */
  subscribe(topic: string, fallbackMs?: number): { readonly woken: Promise<'notified' | 'fallback'>; cancel(): void };
  /** How long a waiter waits without a notification before it re-checks anyway. */
  readonly fallbackMs: number;
  close(): Promise<void>;
}

/** `wakeFallbackMs` default: a lost notification costs at most this much latency. */
export const DEFAULT_WAKE_FALLBACK_MS = 1_000;

/** Waiters by topic, shared by both dialects' implementations. */
export class WaiterRegistry {
  readonly #waiters = new Map<string, Set<() => void>>();

  get size(): number {
    return this.#waiters.size;
  }

  subscribe(
    topic: string,
    fallbackMs: number,
    onFirst?: () => void,
  ): { woken: Promise<'notified' | 'fallback'>; cancel(): void } {
    let settle!: (how: 'notified' | 'fallback') => void;
    const woken = new Promise<'notified' | 'fallback'>((resolve) => (settle = resolve));
    let set = this.#waiters.get(topic);
    if (!set) this.#waiters.set(topic, (set = new Set()));
    const wake = () => done('notified');
    const timer = Number.isFinite(fallbackMs)
      ? setTimeout(() => done('fallback'), clampTimerMs(fallbackMs))
      : undefined;
    const done = (how: 'notified' | 'fallback') => {
      if (timer) clearTimeout(timer);
      const waiting = this.#waiters.get(topic);
      waiting?.delete(wake);
      if (waiting && waiting.size === 0) this.#waiters.delete(topic);
      settle(how);
    };
    set.add(wake);
    onFirst?.();
    return { woken, cancel: () => done('fallback') };
  }

  /** Wakes the waiters of `topic`, or of every topic when `topic` is undefined. */
  wake(topic?: string): void {
    const sets =
      topic === undefined ? [...this.#waiters.values()] : [this.#waiters.get(topic)].filter((s) => s !== undefined);
    for (const set of sets) for (const wake of [...set]) wake();
  }
}
