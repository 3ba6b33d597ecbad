import type { Transaction } from 'kysely';
import type { Database } from '../../schema/database.js';
import { DEFAULT_WAKE_FALLBACK_MS, WaiterRegistry, type Wakeups } from '../wakeups.js';

/**
 * SQLite: commits of this connection wake waiters directly after COMMIT; commits of other
 * processes are seen through `PRAGMA data_version`, which changes when another connection
 * commits to the file. It is read every `pollMs` while someone waits (a cheap, lock-free read).
 */
export class SqliteWakeups implements Wakeups {
  readonly #registry = new WaiterRegistry();
  readonly #dataVersion: () => number;
  readonly #pending: string[] = [];
  #timer: NodeJS.Timeout | undefined;
  #last = -1;

  readonly fallbackMs: number;
  /** False: notifications are off, and waiters only poll every `fallbackMs` (tests). */
  readonly enabled: boolean;
  /** How often `PRAGMA data_version` is read while someone waits. */
  readonly pollMs: number;

  constructor(options: {
    /** Reads `PRAGMA data_version` on the store's connection. */
    readonly dataVersion: () => number;
    readonly fallbackMs?: number;
    readonly enabled?: boolean;
    readonly pollMs?: number;
  }) {
    this.#dataVersion = options.dataVersion;
    this.fallbackMs = options.fallbackMs ?? DEFAULT_WAKE_FALLBACK_MS;
    this.enabled = options.enabled ?? true;
    this.pollMs = options.pollMs ?? 5;
  }

  async notify(_trx: Transaction<Database>, topic: string): Promise<void> {
    if (this.enabled) this.#pending.push(topic);
  }

  notifyExpression(): null {
    return null;
  }

  /** Called by the dialect after COMMIT (`committed`) or ROLLBACK of a write transaction. */
  afterTransaction(committed: boolean): void {
    if (this.#pending.length === 0) return;
    const topics = this.#pending.splice(0);
    if (committed) for (const topic of topics) this.#registry.wake(topic);
  }

  subscribe(topic: string, fallbackMs = this.fallbackMs) {
    const subscription = this.#registry.subscribe(topic, fallbackMs, () => {
      if (this.enabled && !this.#timer) {
        this.#last = this.#dataVersion();
        this.#timer = setInterval(() => this.#poll(), this.pollMs);
        this.#timer.unref();
      }
    });
    void subscription.woken.then(() => {
      if (this.#registry.size === 0 && this.#timer) {
        clearInterval(this.#timer);
        this.#timer = undefined;
      }
    });
    return subscription;
  }

  #poll(): void {
    let version: number;
    try {
      version = this.#dataVersion();
    } catch {
      return; // the connection is closing
    }
    if (version !== this.#last) {
      this.#last = version;
      // Another process committed: we cannot tell what, so every waiter re-checks.
      this.#registry.wake();
    }
  }

  async close(): Promise<void> {
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = undefined;
    this.#registry.wake();
  }
}
