import type { MessageRow, MessageStatus } from '../schema/database.js';
import type { StoreContext } from './context.js';
import { clampTimerMs } from '../timers.js';
import { prepared } from '../query/prepared.js';
import { optionalInput, requireId, requireInput, requireJson, requireLimit, requirePositiveMs } from './validate.js';

/**
 * Worker → coordinator mail (SPEC §3, seed 001). Messages are addressed by handle: each run has
 * its own `coordinator-<hex>` handle, so two runs never read each other's inbox. Payloads are
 * JSON values, stored as text.
 */
export interface Message {
  readonly id: string;
  readonly from: string;
  readonly to: string;
  readonly kind: string;
  readonly payload: unknown;
  readonly status: MessageStatus;
  readonly createdAt: number;
  readonly deliveredAt: number | null;
}

export interface SendMessageInput {
  readonly from: string;
  readonly to: string;
  readonly kind: string;
  /** Any JSON-serializable value; omitted = null. */
  readonly payload?: unknown;
}

/** Default and upper bound of `deliverPendingMessages`' batch. */
export const DEFAULT_DELIVERY_LIMIT = 100;
export const MAX_DELIVERY_LIMIT = 10_000;

/** Messages between handles (SPEC §3). */
export interface MessageRepository {
  /** Queues a message in `to`'s inbox as pending. */
  sendMessage(input: SendMessageInput): Promise<Message>;
  /**
   * Takes up to `limit` pending messages of the inbox, oldest first, and marks them delivered in
   * the same transaction: however many consumers drain one inbox at once, each message is
   * returned by exactly one call. On PostgreSQL consumers of one inbox run in parallel (each
   * skips the rows another in-flight claim holds); on SQLite writers are serialized.
   */
  deliverPendingMessages(handle: string, options?: { limit?: number }): Promise<Message[]>;
  /** How many messages wait in the inbox. */
  countPendingMessages(handle: string): Promise<number>;
  /**
   * Like `deliverPendingMessages`, but when the inbox is empty it waits, up to `timeoutMs`, for a
   * message to arrive: it wakes when a sender's transaction commits (LISTEN/NOTIFY on PostgreSQL,
   * the commit itself or the file's data version on SQLite), re-checking at least every
   * `wakeFallbackMs` so that a lost notification never strands it. Returns `[]` at the timeout.
   *
   * @example
   * const messages = await store.messages.waitForMessages(run.coordinatorHandle, { timeoutMs: 30_000 });
   */
  waitForMessages(handle: string, options: { timeoutMs: number; limit?: number }): Promise<Message[]>;
}

/** Maps a `messages` row to the public shape (payload parsed from JSON). */
export function toMessage(row: MessageRow): Message {
  return {
    id: row.id,
    from: row.from_handle,
    to: row.to_handle,
    kind: row.kind,
    payload: row.payload === null ? null : JSON.parse(row.payload),
    status: row.status,
    createdAt: row.created_at,
    deliveredAt: row.delivered_at,
  };
}

/**
 * Claims up to `limit` of an inbox's oldest pending messages where rows cannot be locked one by
 * one (SQLite: every writer is serialized by BEGIN IMMEDIATE anyway). `status = 'pending'` is
 * re-checked on each row, so a message is delivered at most once.
 */
const DELIVER_SERIALIZED = prepared((db, p: { handle: string; now: number; limit: number }) =>
  db
    .updateTable('messages')
    .set({ status: 'delivered', delivered_at: p.now })
    .where('id', 'in', (eb) =>
      eb
        .selectFrom('messages as m')
        .select('m.id')
        .where('m.to_handle', '=', p.handle)
        .where('m.status', '=', 'pending')
        .orderBy('m.created_at')
        .orderBy('m.id')
        .limit(p.limit),
    )
    .where('status', '=', 'pending')
    .returningAll(),
);

/**
 * The same claim for PostgreSQL, where consumers of one inbox work in parallel: the oldest
 * pending rows are locked with `FOR UPDATE SKIP LOCKED` in a materialized CTE, so each consumer
 * takes rows no other in-flight claim holds, and the update re-checks `status = 'pending'`.
 */
const DELIVER_SKIP_LOCKED = prepared((db, p: { handle: string; now: number; limit: number }) =>
  db
    .with(
      (cte) => cte('next').materialized(),
      (qb) =>
        qb
          .selectFrom('messages')
          .select('id')
          .where('to_handle', '=', p.handle)
          .where('status', '=', 'pending')
          .orderBy('created_at')
          .orderBy('id')
          .limit(p.limit)
          .forUpdate()
          .skipLocked(),
    )
    .updateTable('messages')
    .set({ status: 'delivered', delivered_at: p.now })
    .where('id', 'in', (eb) => eb.selectFrom('next').select('next.id'))
    .where('status', '=', 'pending')
    .returningAll(),
);

/** Oldest first: creation time, then id. */
const byAge = (a: MessageRow, b: MessageRow) => a.created_at - b.created_at || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0);

/** The wake-up topic of an inbox: announced when a message to it commits. */
const inboxTopic = (handle: string) => `inbox:${handle}`;

/** The message repository on a store context (wired as `store.messages`). */
export function createMessageRepository(ctx: StoreContext): MessageRepository {
  const { dialect } = ctx;
  const { db } = dialect;
  return {
    async sendMessage(input) {
      requireInput('input', input);
      const payload = requireJson('payload', input.payload);
      const row: MessageRow = {
        id: ctx.newId(),
        from_handle: requireId('from', input.from),
        to_handle: requireId('to', input.to),
        kind: requireId('kind', input.kind),
        payload,
        status: 'pending',
        created_at: ctx.clock.now(),
        delivered_at: null,
      };
      // Through the write transaction so SQLITE_BUSY under contention is retried, not surfaced.
      await ctx.dialect.writeTransaction(async (trx) => {
        await trx.insertInto('messages').values(row).execute();
        // Consumers waiting on the inbox wake when this commits.
        await dialect.wakeups.notify(trx, inboxTopic(row.to_handle));
      });
      return toMessage(row);
    },

    async deliverPendingMessages(handle, options) {
      requireId('handle', handle);
      const limit = requireLimit(
        'limit',
        optionalInput('options', options).limit,
        MAX_DELIVERY_LIMIT,
        DEFAULT_DELIVERY_LIMIT,
      );
      const deliver = dialect.supportsSkipLocked ? DELIVER_SKIP_LOCKED : DELIVER_SERIALIZED;
      const rows = await dialect.writeTransaction((trx) =>
        deliver.execute(trx, { handle, now: ctx.clock.now(), limit }),
      );
      return rows.sort(byAge).map(toMessage);
    },

    async waitForMessages(handle, options) {
      requireId('handle', handle);
      const input = requireInput('options', options);
      const timeoutMs = requirePositiveMs('timeoutMs', input.timeoutMs);
      const limit = requireLimit('limit', input.limit, MAX_DELIVERY_LIMIT, DEFAULT_DELIVERY_LIMIT);
      const deadline = performance.now() + timeoutMs;
      const deliver = dialect.supportsSkipLocked ? DELIVER_SKIP_LOCKED : DELIVER_SERIALIZED;
      for (;;) {
        // Subscribe first: a message committed between the check and the wait still wakes us.
        const wake = dialect.wakeups.subscribe(inboxTopic(handle));
        let rows: MessageRow[];
        try {
          rows = await dialect.writeTransaction((trx) => deliver.execute(trx, { handle, now: ctx.clock.now(), limit }));
        } catch (error) {
          wake.cancel();
          throw error;
        }
        const left = deadline - performance.now();
        if (rows.length > 0 || left <= 0) {
          wake.cancel();
          return rows.sort(byAge).map(toMessage);
        }
        const deadlineTimer = setTimeout(() => wake.cancel(), clampTimerMs(left));
        await wake.woken;
        clearTimeout(deadlineTimer);
      }
    },

    async countPendingMessages(handle) {
      requireId('handle', handle);
      const row = await db
        .selectFrom('messages')
        .select((eb) => eb.fn.countAll<number>().as('n'))
        .where('to_handle', '=', handle)
        .where('status', '=', 'pending')
        .executeTakeFirstOrThrow();
      return Number(row.n);
    },
  };
}
