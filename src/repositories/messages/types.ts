/**
 * Worker ↔ coordinator mail (SPEC §3, seed 001; issue 23). Messages are addressed by handle: each
 * run has its own `coordinator-<hex>` handle, so two runs never read each other's inbox; a
 * terminal's handle is its inbox. Payloads are JSON values, stored as text.
 *
 * Delivery is at-least-once with receipts: `receiveMessages` hands a message out under a lease
 * (`visibilityMs`); `ackMessages` with its receipt marks it processed; a message not acked before
 * its lease lapses is handed out again, `attempt + 1`; after the store's `maxAttempts` hand-outs it
 * moves to `dead` with its last error. Acking in the same `store.transaction` as the host's own
 * writes makes processing effectively-once. See the README (Messages; Failure model).
 */
import type { IdempotencyOptions } from '../idempotent.js';
import type { TraceContext } from '../shared/trace-context.js';
import { committed, type OutcomeDeclarations } from '../shared/outcomes.js';

/**
 * - `pending`: waiting, or handed out under a lease not yet acked;
 * - `delivered`: acknowledged (or handed out by the at-most-once `deliverPendingMessages`);
 * - `dead`: handed out `maxAttempts` times without an ack; listed and requeued by hand.
 */
export type MessageDeliveryStatus = 'pending' | 'delivered' | 'dead';

/** A message between two handles, with its send order (`seq`) and delivery status. */
export interface Message {
  readonly id: string;
  /**
   * The send order, store-wide: rising with every message sent. An inbox is read oldest `seq`
   * first, so the messages one sender sends one after another reach one inbox in that order.
   */
  readonly seq: number;
  readonly from: string;
  /** The inbox it is in: its recipient, or the run that took it over (see `receiveMessages`). */
  readonly to: string;
  readonly kind: string;
  readonly payload: unknown;
  readonly status: MessageDeliveryStatus;
  /** Hand-outs so far. */
  readonly attempts: number;
  readonly createdAt: number;
  /** When it was acknowledged (or delivered at most once). */
  readonly deliveredAt: number | null;
  /** The last error a consumer reported (`releaseMessages`), or why it died. */
  readonly lastError: string | null;
  readonly deadAt: number | null;
  /**
   * The sender's W3C trace context (`traceparent`, `tracestate`), kept across redeliveries;
   * null if it was sent outside a traced context. See `taskfence/otel`.
   */
  readonly traceContext: TraceContext | null;
}

/** A message handed out under a lease. */
export interface ReceivedMessage extends Message {
  /** The opaque token that acks or releases this hand-out (and no other). */
  readonly receipt: string;
  /** 1 on the first hand-out, +1 on each redelivery. */
  readonly attempt: number;
  /** When the lease lapses: unacked by then, the message is handed out again (epoch ms). */
  readonly visibleAgainAt: number;
}

/** What `sendMessage` and each item of `sendMessages` take. */
export interface SendMessageInput {
  /**
   * The message's id, chosen by the caller so a retry cannot send it twice: the same id with the
   * same input returns the stored message; other input is `ALREADY_EXISTS`. Ids are remembered
   * for at least 24 hours (`IDEMPOTENCY_WINDOW_MS`; `prune` keeps them). Default: a new UUID.
   */
  readonly id?: string;
  readonly from: string;
  readonly to: string;
  readonly kind: string;
  /** Any JSON-serializable value; omitted = null. */
  readonly payload?: unknown;
  /**
   * Send even if no run's coordinator and no dispatch's terminal has the handle `to`. Default
   * false: an unknown recipient is `UNKNOWN_RECIPIENT` (a misspelt handle would never be read).
   */
  readonly allowUnknownRecipient?: boolean;
  /**
   * The sender's W3C trace context to store with the message (a `propagation.inject` carrier);
   * `taskfence/otel`'s `traceStore` fills it from the active span. Default: none.
   */
  readonly traceContext?: TraceContext | null;
}

/** Options of `receiveMessages`: how many, and how long each hand-out's lease lasts. */
export interface ReceiveOptions {
  /** At most this many messages (default 100, at most 10 000). */
  readonly limit?: number;
  /** How long each hand-out's lease lasts before it is handed out again (ms, default 30 000). */
  readonly visibilityMs?: number;
}

/**
 * Why a receipt was refused:
 * - `superseded`: the message was handed out again (or acked) under a newer receipt;
 * - `expired`: this receipt's lease lapsed (it will be, or was, handed out again);
 * - `released`: this receipt's hand-out was released;
 * - `dead`: the message was dead-lettered;
 * - `never_granted`: no such receipt in this inbox.
 */
export type ReceiptRefusalReason = 'superseded' | 'expired' | 'released' | 'dead' | 'never_granted';

export interface ReceiptRefusal {
  readonly receipt: string;
  readonly reason: ReceiptRefusalReason;
}

export interface AckResult {
  /** Receipts acknowledged now, or before (an ack is idempotent by receipt). */
  readonly acked: readonly string[];
  readonly refused: readonly ReceiptRefusal[];
}

export interface ReleaseOptions extends IdempotencyOptions {
  /** Hand the messages out again only after this long (ms, default 0: at once). */
  readonly delayMs?: number;
  /** What went wrong, kept as the message's `lastError` (and its death's reason). */
  readonly error?: string;
}

export interface ReleaseResult {
  /** Receipts released (visible again, after `delayMs`). */
  readonly released: readonly string[];
  /** Receipts whose message had used its `maxAttempts` and moved to `dead` instead. */
  readonly deadLettered: readonly string[];
  readonly refused: readonly ReceiptRefusal[];
}

export interface WaitOptions {
  readonly timeoutMs: number;
  readonly limit?: number;
}

/** Default and upper bound of a hand-out batch. */
export const DEFAULT_DELIVERY_LIMIT = 100;
export const MAX_DELIVERY_LIMIT = 10_000;
/** Default lease of a hand-out. */
export const DEFAULT_VISIBILITY_MS = 30_000;

/** Messages between handles (SPEC §3). */
export interface MessageRepository {
  /**
   * Queues a message in `to`'s inbox. With an `id`, idempotent: a retry after
   * `COMMIT_OUTCOME_UNKNOWN` returns the stored message. An unknown `to` is `UNKNOWN_RECIPIENT`
   * unless `allowUnknownRecipient`.
   */
  sendMessage(input: SendMessageInput): Promise<Message>;
  /**
   * Queues up to `MAX_MESSAGE_BATCH` messages in one write transaction (one commit): **atomic**,
   * every message is queued or none is (an unknown recipient is `UNKNOWN_RECIPIENT` for the whole
   * batch). Each is checked and is idempotent by `id` as `sendMessage`'s is. Messages get their
   * `seq` in input order, so one inbox hands a batch out in the order it was given. Returns the
   * messages in input order.
   *
   * @example
   * await store.messages.sendMessages(results.map((r) => ({ id: r.id, from: terminal, to: coordinator, kind: 'result', payload: r })));
   */
  sendMessages(inputs: readonly SendMessageInput[]): Promise<Message[]>;
  /**
   * Hands out up to `limit` visible messages of the inbox, oldest first, each under a lease of
   * `visibilityMs` with a fresh `receipt`. A message not acked before its lease lapses is handed
   * out again (`attempt + 1`); one handed out `maxAttempts` times moves to `dead` when its last
   * lease lapses. On PostgreSQL consumers of one inbox receive in parallel (`SKIP LOCKED`).
   *
   * The inbox of a running run's coordinator takes over the pending messages addressed to the
   * coordinators of the earlier, stopped runs of its target (the runs it adopted from), so a
   * report sent to a dead coordinator reaches the run that owns the work.
   *
   * @example
   * for (const m of await store.messages.receiveMessages(run.coordinatorHandle, { visibilityMs: 60_000 })) {
   *   await handle(m);
   *   await store.messages.ackMessages(run.coordinatorHandle, [m.receipt]);
   * }
   */
  receiveMessages(handle: string, options?: ReceiveOptions): Promise<ReceivedMessage[]>;
  /**
   * Marks handed-out messages processed. Each receipt is acked, or refused in `refused` with its
   * reason (a lapsed, superseded or unknown receipt), never by an exception for the whole batch.
   * Acking an acked receipt again reports it acked. Inside `store.transaction`
   * (`tx.messages.ackMessages`) the ack commits or rolls back with the host's writes.
   */
  ackMessages(handle: string, receipts: readonly string[], options?: IdempotencyOptions): Promise<AckResult>;
  /** Puts handed-out messages back, visible again after `delayMs`, recording `error`. */
  releaseMessages(handle: string, receipts: readonly string[], options?: ReleaseOptions): Promise<ReleaseResult>;
  /** The inbox's dead messages, oldest first. */
  listDeadMessages(handle: string, options?: { limit?: number }): Promise<Message[]>;
  /** Makes dead messages of the inbox pending again with their attempts reset; returns those requeued. */
  requeueDeadMessages(handle: string, ids: readonly string[], options?: IdempotencyOptions): Promise<Message[]>;
  /**
   * The seed's push-on-idle call: receives and acks up to `limit` visible messages in one
   * transaction, oldest first. At most once: a consumer that crashes after this returns loses
   * them. Use `receiveMessages` and `ackMessages` for at-least-once.
   */
  deliverPendingMessages(handle: string, options?: { limit?: number }): Promise<Message[]>;
  /** How many messages wait in the inbox (pending, not dead, leased or not). */
  countPendingMessages(handle: string): Promise<number>;
  /**
   * When the inbox has nothing visible, waits up to `timeoutMs` for a message: it wakes when a
   * sender's transaction commits (LISTEN/NOTIFY on PostgreSQL, the commit itself or the file's
   * data version on SQLite) and when a leased message's lease lapses, re-checking at least every
   * `wakeFallbackMs`. With `visibilityMs` it receives (leased, like `receiveMessages`); without,
   * it delivers at most once (like `deliverPendingMessages`). Returns `[]` at the timeout.
   *
   * @example
   * const messages = await store.messages.waitForMessages(run.coordinatorHandle, { timeoutMs: 30_000, visibilityMs: 60_000 });
   */
  waitForMessages(handle: string, options: WaitOptions & { visibilityMs: number }): Promise<ReceivedMessage[]>;
  waitForMessages(handle: string, options: WaitOptions): Promise<Message[]>;
}

/** Each call's declared outcome (see shared/outcomes.ts): a refused receipt is an answer in the result, not an outcome of the call. */
export const MESSAGE_OUTCOMES: OutcomeDeclarations<MessageRepository> = {
  sendMessage: committed,
  sendMessages: committed,
  receiveMessages: committed,
  ackMessages: committed,
  releaseMessages: committed,
  listDeadMessages: committed,
  requeueDeadMessages: committed,
  deliverPendingMessages: committed,
  waitForMessages: committed,
  countPendingMessages: committed,
};
