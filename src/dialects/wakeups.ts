import pg from 'pg';
import { sql, type Transaction } from 'kysely';
import type { Database } from '../schema/database.js';
import { clampTimerMs } from '../timers.js';

/**
 * Wake-ups for waiters (a blocked `acquirePaths`, `waitForMessages`): a writer announces a topic
 * when its transaction commits, and waiters on that topic re-check at once instead of at their
 * next poll. A notification is only a hint: waiters always re-check the database, and a waiter
 * whose notification was lost wakes anyway after `fallbackMs`, so correctness never rests on it.
 */
export interface Wakeups {
  /** Announces `topic` when `trx` commits (nothing if it rolls back). */
  notify(trx: Transaction<Database>, topic: string): Promise<void>;
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

const CHANNEL = 'taskfence_wake';

/**
 * PostgreSQL: `pg_notify` inside the writer's transaction (delivered at commit), and one
 * dedicated LISTEN connection per store, opened when the first waiter subscribes. It reconnects
 * after a fault with backoff; while it is down, waiters fall back to their interval. Through a
 * transaction-mode pooler LISTEN does not work, and the fallback interval is what remains.
 */
export class PostgresWakeups implements Wakeups {
  readonly #registry = new WaiterRegistry();
  readonly #config: pg.ClientConfig;
  #client: pg.Client | undefined;
  #connecting: Promise<void> | undefined;
  #closed = false;
  #backoffMs = 50;

  /** Installs in different schemas of one database share the channel: topics carry the schema. */
  readonly #prefix: string;

  constructor(
    config: pg.ClientConfig,
    readonly fallbackMs = DEFAULT_WAKE_FALLBACK_MS,
    readonly enabled = true,
    schema?: string,
  ) {
    this.#config = { ...config, application_name: 'taskfence-listen' };
    this.#prefix = schema === undefined ? '' : `${schema}/`;
  }

  async notify(trx: Transaction<Database>, topic: string): Promise<void> {
    if (!this.enabled) return;
    await sql`select pg_notify(${CHANNEL}, ${this.#prefix + topic})`.execute(trx);
  }

  subscribe(topic: string, fallbackMs = this.fallbackMs) {
    return this.#registry.subscribe(this.#prefix + topic, fallbackMs, () => {
      if (this.enabled) this.#ensureListening();
    });
  }

  #ensureListening(): void {
    if (this.#client || this.#connecting || this.#closed) return;
    this.#connecting = this.#connect().finally(() => (this.#connecting = undefined));
  }

  async #connect(): Promise<void> {
    const client = new pg.Client(this.#config);
    // A fault on the listener must never crash the host: drop it and reconnect.
    client.on('error', () => this.#lost(client));
    client.on('end', () => this.#lost(client));
    client.on('notification', (message) => {
      if (message.channel === CHANNEL) this.#registry.wake(message.payload);
    });
    try {
      await client.connect();
      await client.query(`listen ${CHANNEL}`);
      if (this.#closed) {
        await client.end().catch(() => {});
        return;
      }
      this.#client = client;
      this.#backoffMs = 50;
      // Whatever was announced while nobody listened is unknown: let every waiter re-check.
      this.#registry.wake();
    } catch {
      await client.end().catch(() => {});
      this.#retryLater();
    }
  }

  #lost(client: pg.Client): void {
    if (this.#client !== client) return;
    this.#client = undefined;
    client.end().catch(() => {});
    this.#retryLater();
  }

  #retryLater(): void {
    if (this.#closed || this.#registry.size === 0) return;
    const wait = this.#backoffMs * (0.5 + Math.random());
    this.#backoffMs = Math.min(this.#backoffMs * 2, 5_000);
    setTimeout(() => this.#ensureListening(), wait).unref();
  }

  /** The listening connection's backend pid, for tests that cut it. */
  async listenerPid(): Promise<number | undefined> {
    const { rows } = (await this.#client?.query<{ pid: number }>('select pg_backend_pid() as pid')) ?? { rows: [] };
    return rows[0]?.pid;
  }

  async close(): Promise<void> {
    this.#closed = true;
    this.#registry.wake();
    await this.#connecting;
    const client = this.#client;
    this.#client = undefined;
    await client?.end().catch(() => {});
  }
}

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

  constructor(
    dataVersion: () => number,
    readonly fallbackMs = DEFAULT_WAKE_FALLBACK_MS,
    readonly enabled = true,
    readonly pollMs = 5,
  ) {
    this.#dataVersion = dataVersion;
  }

  async notify(_trx: Transaction<Database>, topic: string): Promise<void> {
    if (this.enabled) this.#pending.push(topic);
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
