import pg from 'pg';
import { sql, type RawBuilder, type Transaction } from 'kysely';
import type { Database } from '../../schema/database.js';
import { Backoff } from '../backoff.js';
import { schemaTopic, WAKE_CHANNEL } from '../../protocol.js';
import { DEFAULT_WAKE_FALLBACK_MS, WaiterRegistry, type Wakeups } from '../wakeups.js';
import { extend } from '../../objects.js';

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
  readonly #backoff = new Backoff(50, 5_000);

  /** Installs in different schemas of one database share the channel: topics carry the schema. */
  readonly #schema: string | undefined;

  readonly fallbackMs: number;
  /** False: notifications are off, and waiters only poll every `fallbackMs` (tests). */
  readonly enabled: boolean;
  /** The client class of the LISTEN connection: a host list's routed client follows a failover. */
  readonly #Client: typeof pg.Client;

  constructor(options: {
    /** The client configuration the LISTEN connection is opened with. */
    readonly clientConfig: pg.ClientConfig;
    readonly fallbackMs?: number;
    readonly enabled?: boolean;
    /** The configured schema, if any. */
    readonly schema?: string | undefined;
    readonly Client?: typeof pg.Client;
  }) {
    this.#config = extend(options.clientConfig, { application_name: 'taskfence-listen' });
    this.fallbackMs = options.fallbackMs ?? DEFAULT_WAKE_FALLBACK_MS;
    this.enabled = options.enabled ?? true;
    this.#schema = options.schema;
    this.#Client = options.Client ?? pg.Client;
  }

  async notify(trx: Transaction<Database>, topic: string): Promise<void> {
    if (!this.enabled) return;
    await sql`select pg_notify(${WAKE_CHANNEL}, ${schemaTopic(this.#schema, topic)})`.execute(trx);
  }

  notifyExpression(topic: string): RawBuilder<unknown> | null {
    if (!this.enabled) return null;
    return sql`pg_notify(${WAKE_CHANNEL}, ${schemaTopic(this.#schema, topic)})`;
  }

  subscribe(topic: string, fallbackMs = this.fallbackMs) {
    return this.#registry.subscribe(schemaTopic(this.#schema, topic), fallbackMs, () => {
      if (this.enabled) this.#ensureListening();
    });
  }

  #ensureListening(): void {
    if (this.#client || this.#connecting || this.#closed) return;
    this.#connecting = this.#connect().finally(() => (this.#connecting = undefined));
  }

  async #connect(): Promise<void> {
    const client = new this.#Client(this.#config);
    // A fault on the listener must never crash the host: drop it and reconnect.
    client.on('error', () => this.#lost(client));
    client.on('end', () => this.#lost(client));
    client.on('notification', (message) => {
      if (message.channel === WAKE_CHANNEL) this.#registry.wake(message.payload);
    });
    try {
      await client.connect();
      await client.query(`listen ${WAKE_CHANNEL}`);
      if (this.#closed) {
        await client.end().catch(() => {});
        return;
      }
      this.#client = client;
      this.#backoff.reset();
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
    setTimeout(() => this.#ensureListening(), this.#backoff.next()).unref();
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
