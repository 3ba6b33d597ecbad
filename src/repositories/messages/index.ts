import type { Transaction } from 'kysely';
import { InvalidArgumentError, UnknownRecipientError } from '../../errors.js';
import type { Database, MessageRow } from '../../schema/database.js';
import { inboxTopic } from '../../protocol.js';
import { clampTimerMs } from '../../timers.js';
import { extend } from '../../objects.js';
import { runBound } from '../../query/prepared.js';
import { optionalTraceContext, toTraceContext } from '../shared/trace-context.js';
import type { StoreContext } from '../context.js';
import {
  createOnce,
  idempotentInOneTrip,
  keyedWrite,
  requireSameCreate,
  runIdempotent,
  type IdempotentCall,
} from '../idempotent.js';
import {
  optionalInput,
  optionalText,
  requireBoolean,
  requireId,
  requireInput,
  requireJson,
  requireLimit,
  requirePositiveMs,
} from '../validate.js';
import {
  DEAD_LETTER_LAPSED,
  DELIVER_SERIALIZED,
  DELIVER_SKIP_LOCKED,
  RECEIVE_SERIALIZED,
  RECEIVE_SKIP_LOCKED,
  TAKE_OVER,
  sendFolded,
} from './statements.js';
import { ackReceipts, ackStatement, releaseReceipts, requireReceipts } from './receipts.js';
import {
  DEFAULT_DELIVERY_LIMIT,
  DEFAULT_VISIBILITY_MS,
  MAX_DELIVERY_LIMIT,
  type Message,
  type MessageRepository,
  type ReceivedMessage,
  type SendMessageInput,
} from './types.js';

export * from './types.js';

/** Maps a `messages` row to the public shape (payload parsed from JSON). */
export function toMessage(row: MessageRow): Message {
  return {
    id: row.id,
    seq: Number(row.seq),
    from: row.from_handle,
    to: row.to_handle,
    kind: row.kind,
    payload: row.payload === null ? null : JSON.parse(row.payload),
    status: row.dead_at !== null ? 'dead' : row.status,
    attempts: Number(row.attempts),
    createdAt: row.created_at,
    deliveredAt: row.delivered_at,
    lastError: row.last_error,
    deadAt: row.dead_at,
    traceContext: toTraceContext(row.trace_context),
  };
}

/** A handed-out row as a received message. */
function toReceived(row: MessageRow): ReceivedMessage {
  return extend(toMessage(row), {
    receipt: row.receipt!,
    attempt: Number(row.attempts),
    visibleAgainAt: row.visible_at!,
  });
}

/** Oldest first: the send order. */
const bySeq = (a: MessageRow, b: MessageRow) => Number(a.seq) - Number(b.seq);

/** A hand-out's lease: the default, or any duration `requirePositiveMs` allows. */
function visibilityOf(value: unknown): number {
  return value === undefined ? DEFAULT_VISIBILITY_MS : requirePositiveMs('visibilityMs', value);
}

/** The key of a call, or null; validated before any statement. */
function keyed(operation: string, key: unknown, input: unknown, refusals: IdempotentCall['refusals'] = []) {
  if (key === undefined) return null;
  return { operation, key: requireId('idempotencyKey', key), input, refusals } satisfies IdempotentCall;
}

/** The message repository on a store context (wired as `store.messages`). */
export function createMessageRepository(ctx: StoreContext): MessageRepository {
  const { dialect } = ctx;
  const { db } = dialect;
  const now = () => ctx.clock.now();

  /**
   * Queues `items` in the caller's write transaction: named ids already stored are answered as a
   * retry (same input) or refused (`ALREADY_EXISTS`); every new recipient must be known (one
   * lookup per distinct handle); the rows go in with one INSERT per chunk, in input order; each
   * inbox (and the inbox that will take it over) is woken once, on commit. Rows come back in input order.
   */
  async function sendIn(trx: Transaction<Database>, items: readonly PreparedSend[]): Promise<MessageRow[]> {
    const stored = new Map<string, MessageRow>();
    const named = items.filter((item) => item.named).map((item) => item.id);
    for (const chunk of chunked(named))
      for (const row of await trx.selectFrom('messages').selectAll().where('id', 'in', chunk).execute())
        stored.set(row.id, row);
    for (const item of items) {
      const row = stored.get(item.id);
      if (row)
        requireSameCreate('message', item.id, {
          from: [item.from, row.from_handle],
          to: [item.to, row.to_handle],
          kind: [item.kind, row.kind],
          payload: [item.payload, row.payload],
        });
    }
    const fresh = items.filter((item) => !stored.has(item.id));
    const wake = new Set<string>();
    for (const to of new Set(fresh.map((item) => item.to))) {
      const recipient = await trx
        .selectFrom('coordinator_runs as r')
        .select((eb) => [
          'r.status',
          eb
            .selectFrom('coordinator_runs as s')
            .select('s.coordinator_handle')
            .whereRef('s.target_key', '=', 'r.target_key')
            .where('s.status', '=', 'running')
            .limit(1)
            .as('successor'),
        ])
        .where('r.coordinator_handle', '=', to)
        .executeTakeFirst();
      if (!recipient && fresh.some((item) => item.to === to && !item.allowUnknown)) {
        const terminal = await trx
          .selectFrom('dispatch_contexts')
          .select('id')
          .where('terminal_handle', '=', to)
          .limit(1)
          .executeTakeFirst();
        if (!terminal) throw new UnknownRecipientError(to);
      }
      wake.add(to);
      if (recipient && recipient.successor !== null && recipient.successor !== to) wake.add(recipient.successor);
    }
    const createdAt = now();
    const rows = fresh.map((item) => ({
      id: item.id,
      from_handle: item.from,
      to_handle: item.to,
      kind: item.kind,
      payload: item.payload,
      status: 'pending' as const,
      created_at: createdAt,
      delivered_at: null,
      receipt: null,
      visible_at: null,
      dead_at: null,
      last_error: null,
    }));
    for (const chunk of chunked(rows)) await trx.insertInto('messages').values(chunk).execute();
    // Consumers waiting on the inbox (or on the run that will take it over) wake when this commits.
    for (const handle of wake) await dialect.wakeups.notify(trx, inboxTopic(handle));
    // The sequence is assigned by the database (a default, or SQLite's trigger): read it back.
    for (const chunk of chunked(fresh.map((item) => item.id)))
      for (const row of await trx.selectFrom('messages').selectAll().where('id', 'in', chunk).execute())
        stored.set(row.id, row);
    return items.map((item) => stored.get(item.id)!);
  }

  /** Takes over adopted runs' messages, dead-letters lapsed last attempts, hands out the rest. */
  /**
   * A receive: its parameters, and on PostgreSQL its one statement, bound before BEGIN, which
   * sends it (one round trip less). Its time is read before BEGIN, so it is early: a lapsed lease
   * is judged live a little longer, and the new lease ends a little early, never late.
   */
  function receiving(handle: string, limit: number, visibilityMs: number) {
    const at = now();
    const params = {
      handle,
      now: at,
      limit,
      visibleAt: at + visibilityMs,
      nonce: ctx.newNonce(),
      maxAttempts: ctx.settings.maxAttempts,
    };
    // PostgreSQL takes over and dead-letters in the hand-out statement itself.
    const first = dialect.supportsSkipLocked ? RECEIVE_SKIP_LOCKED.bind(db, params) : undefined;
    return { params, first, options: first ? { first } : undefined };
  }

  async function receiveIn(trx: Transaction<Database>, receive: ReturnType<typeof receiving>) {
    const { params, first } = receive;
    if (first) return (dialect.beginResult(first) ?? (await runBound(trx, first))).rows;
    await TAKE_OVER.run(trx, { handle: params.handle });
    await DEAD_LETTER_LAPSED.run(trx, params);
    return RECEIVE_SERIALIZED.execute(trx, params);
  }

  /** A delivery, bound before BEGIN as a receive is (`receiving`). */
  function delivering(handle: string, limit: number) {
    const params = { handle, now: now(), limit, maxAttempts: ctx.settings.maxAttempts };
    // A message whose last lease lapsed is dead, not handed out once more. PostgreSQL takes over
    // and dead-letters in the hand-out statement itself.
    const first = dialect.supportsSkipLocked ? DELIVER_SKIP_LOCKED.bind(db, params) : undefined;
    return { params, first, options: first ? { first } : undefined };
  }

  async function deliverIn(trx: Transaction<Database>, deliver: ReturnType<typeof delivering>) {
    const { params, first } = deliver;
    if (first) return (dialect.beginResult(first) ?? (await runBound(trx, first))).rows;
    await TAKE_OVER.run(trx, { handle: params.handle });
    await DEAD_LETTER_LAPSED.run(trx, params);
    return DELIVER_SERIALIZED.execute(trx, params);
  }

  /** When the inbox's next leased message becomes visible again, or null. */
  async function nextVisibleAt(handle: string): Promise<number | null> {
    const row = await db
      .selectFrom('messages')
      .select((eb) => eb.fn.min('visible_at').as('at'))
      .where('to_handle', '=', handle)
      .where('status', '=', 'pending')
      .where('dead_at', 'is', null)
      .where('visible_at', '>', now())
      .executeTakeFirst();
    return row?.at === null || row?.at === undefined ? null : Number(row.at);
  }

  const repository = {
    async sendMessage(input) {
      requireInput('input', input);
      const id = input.id === undefined ? ctx.newId() : requireId('id', input.id);
      const payload = requireJson('payload', input.payload);
      const from = requireId('from', input.from);
      const to = requireId('to', input.to);
      const kind = requireId('kind', input.kind);
      const allowUnknown =
        input.allowUnknownRecipient === undefined
          ? false
          : requireBoolean('allowUnknownRecipient', input.allowUnknownRecipient);
      const traceContext = optionalTraceContext('traceContext', input.traceContext);
      const row = await createOnce(dialect, [], () =>
        // Through the write transaction so SQLITE_BUSY under contention is retried, not surfaced.
        dialect.writeTransaction(async (trx) => {
          if (input.id !== undefined) {
            const stored = await trx.selectFrom('messages').selectAll().where('id', '=', id).executeTakeFirst();
            if (stored) {
              requireSameCreate('message', id, {
                from: [from, stored.from_handle],
                to: [to, stored.to_handle],
                kind: [kind, stored.kind],
                payload: [payload, stored.payload],
              });
              return stored;
            }
          }
          if (dialect.writableCtes) {
            const announce = dialect.wakeups.notifyExpression(inboxTopic(to));
            const values = { id, from, to, kind, payload, now: now(), traceContext, allowUnknown };
            const { rows } = await sendFolded(trx, values, announce).execute(trx);
            const { known, successor, ...made } = rows[0]!;
            if (!known) throw new UnknownRecipientError(to);
            if (!announce) await dialect.wakeups.notify(trx, inboxTopic(to));
            if (successor !== null && successor !== to) await dialect.wakeups.notify(trx, inboxTopic(successor));
            return made;
          }
          const recipient = await trx
            .selectFrom('coordinator_runs as r')
            .select((eb) => [
              'r.status',
              eb
                .selectFrom('coordinator_runs as s')
                .select('s.coordinator_handle')
                .whereRef('s.target_key', '=', 'r.target_key')
                .where('s.status', '=', 'running')
                .limit(1)
                .as('successor'),
            ])
            .where('r.coordinator_handle', '=', to)
            .executeTakeFirst();
          if (!recipient && !allowUnknown) {
            const terminal = await trx
              .selectFrom('dispatch_contexts')
              .select('id')
              .where('terminal_handle', '=', to)
              .limit(1)
              .executeTakeFirst();
            if (!terminal) throw new UnknownRecipientError(to);
          }
          const insert = trx.insertInto('messages').values({
            id,
            from_handle: from,
            to_handle: to,
            kind,
            payload,
            status: 'pending',
            created_at: now(),
            delivered_at: null,
            receipt: null,
            visible_at: null,
            dead_at: null,
            last_error: null,
            trace_context: traceContext,
          });
          // Consumers waiting on the inbox (or on the run that will take it over) wake when this
          // commits. PostgreSQL announces the inbox in the insert itself, whose RETURNING sees the
          // sequence the database assigned; SQLite assigns it in a trigger: read it back.
          const announce = dialect.insertReturnsSeq ? dialect.wakeups.notifyExpression(inboxTopic(to)) : null;
          let row: MessageRow | undefined;
          if (dialect.insertReturnsSeq)
            row = await insert
              .returningAll()
              .$if(announce !== null, (q) => q.returning(announce!.as('announced')))
              .executeTakeFirstOrThrow();
          else await insert.execute();
          if (!announce) await dialect.wakeups.notify(trx, inboxTopic(to));
          if (recipient && recipient.successor !== null && recipient.successor !== to) {
            await dialect.wakeups.notify(trx, inboxTopic(recipient.successor));
          }
          return row ?? trx.selectFrom('messages').selectAll().where('id', '=', id).executeTakeFirstOrThrow();
        }),
      );
      return toMessage(row);
    },

    async sendMessages(inputs) {
      if (!Array.isArray(inputs)) throw new InvalidArgumentError('inputs', 'must be an array of sendMessage inputs');
      if (inputs.length > MAX_MESSAGE_BATCH)
        throw new InvalidArgumentError('inputs', `must hold at most ${MAX_MESSAGE_BATCH} messages`);
      const items = (inputs as readonly SendMessageInput[]).map((input, i) => {
        try {
          requireInput('input', input);
          return prepareSend(ctx, input);
        } catch (error) {
          if (error instanceof InvalidArgumentError)
            throw new InvalidArgumentError(`inputs[${i}].${error.field}`, error.reason);
          throw error;
        }
      });
      const seen = new Set<string>();
      items.forEach((item, i) => {
        if (seen.has(item.id)) throw new InvalidArgumentError(`inputs[${i}].id`, `repeats message id ${item.id}`);
        seen.add(item.id);
      });
      if (items.length === 0) return [];
      const rows = await createOnce(
        dialect,
        [],
        () => dialect.writeTransaction((trx) => sendIn(trx, items)),
        items.length + 1,
      );
      return rows.map(toMessage);
    },

    async receiveMessages(handle, options) {
      requireId('handle', handle);
      const input = optionalInput('options', options);
      const limit = requireLimit('limit', input.limit, MAX_DELIVERY_LIMIT, DEFAULT_DELIVERY_LIMIT);
      const visibilityMs = visibilityOf(input.visibilityMs);
      const receive = receiving(handle, limit, visibilityMs);
      const rows = await dialect.writeTransaction((trx) => receiveIn(trx, receive), receive.options);
      return rows.sort(bySeq).map(toReceived);
    },

    async ackMessages(handle, receipts, options) {
      requireId('handle', handle);
      const list = requireReceipts(receipts);
      const key = optionalInput('options', options).idempotencyKey;
      const call = keyed('messages.ackMessages', key, { handle, receipts: list });
      // Bound before BEGIN, which sends it (PostgreSQL, one round trip less). Its time is early:
      // a lease that lapsed meanwhile still acks, unless another consumer received the message.
      const at = now();
      const ack = ackStatement(db, handle, list, at);
      const ordinary = () =>
        keyedWrite(
          ctx,
          call,
          (trx) => ackReceipts(trx, handle, list, at, ack, ack ? dialect.beginResult(ack) : undefined),
          undefined,
          ack ?? undefined,
        );
      if (ack === null) return ordinary();
      // Unkeyed on PostgreSQL: BEGIN, the ack and COMMIT in one round trip; a receipt it missed is
      // explained by the ordinary path, where the receipts it acked are acked already (settled).
      const settle = (rows: readonly { receipt: string | null }[]) =>
        rows.length === list.length ? { value: { acked: list, refused: [] } } : null;
      return idempotentInOneTrip(ctx, dialect.writableCtes && call === null, ack, settle, ordinary);
    },

    async releaseMessages(handle, receipts, options) {
      requireId('handle', handle);
      const list = requireReceipts(receipts);
      const input = optionalInput('options', options);
      const delayMs = input.delayMs === undefined ? 0 : requirePositiveMs('delayMs', input.delayMs, 0);
      const error = optionalText('error', input.error);
      const call = keyed('messages.releaseMessages', input.idempotencyKey, { handle, receipts: list, delayMs, error });
      return runIdempotent(dialect, now, call, (trx) =>
        releaseReceipts(trx, handle, list, { now: now(), delayMs, error, maxAttempts: ctx.settings.maxAttempts }),
      );
    },

    async listDeadMessages(handle, options) {
      requireId('handle', handle);
      const limit = requireLimit(
        'limit',
        optionalInput('options', options).limit,
        MAX_DELIVERY_LIMIT,
        DEFAULT_DELIVERY_LIMIT,
      );
      const rows = await db
        .selectFrom('messages')
        .selectAll()
        .where('to_handle', '=', handle)
        .where('status', '=', 'pending')
        .where('dead_at', 'is not', null)
        .orderBy('seq')
        .limit(limit)
        .execute();
      return rows.map(toMessage);
    },

    async requeueDeadMessages(handle, ids, options) {
      requireId('handle', handle);
      const list = requireIdList('ids', ids);
      if (list.length === 0) return [];
      const call = keyed('messages.requeueDeadMessages', optionalInput('options', options).idempotencyKey, {
        handle,
        ids: list,
      });
      const rows = await runIdempotent(dialect, now, call, async (trx) => {
        const requeued = await trx
          .updateTable('messages')
          .set({ dead_at: null, attempts: 0, receipt: null, visible_at: null })
          .where('id', 'in', list)
          .where('to_handle', '=', handle)
          .where('status', '=', 'pending')
          .where('dead_at', 'is not', null)
          .returningAll()
          .execute();
        if (requeued.length > 0) await dialect.wakeups.notify(trx, inboxTopic(handle));
        return requeued;
      });
      return rows.sort(bySeq).map(toMessage);
    },

    async deliverPendingMessages(handle, options) {
      requireId('handle', handle);
      const limit = requireLimit(
        'limit',
        optionalInput('options', options).limit,
        MAX_DELIVERY_LIMIT,
        DEFAULT_DELIVERY_LIMIT,
      );
      const deliver = delivering(handle, limit);
      const rows = await dialect.writeTransaction((trx) => deliverIn(trx, deliver), deliver.options);
      return rows.sort(bySeq).map(toMessage);
    },

    async waitForMessages(handle: string, options: { timeoutMs: number; limit?: number; visibilityMs?: number }) {
      requireId('handle', handle);
      const input = requireInput('options', options);
      const timeoutMs = requirePositiveMs('timeoutMs', input.timeoutMs);
      const limit = requireLimit('limit', input.limit, MAX_DELIVERY_LIMIT, DEFAULT_DELIVERY_LIMIT);
      const leased = input.visibilityMs !== undefined;
      const visibilityMs = leased ? visibilityOf(input.visibilityMs) : 0;
      const deadline = performance.now() + timeoutMs;
      for (;;) {
        // Subscribe first: a message committed between the check and the wait still wakes us.
        const wake = dialect.wakeups.subscribe(inboxTopic(handle));
        let rows: MessageRow[];
        let visibleAt: number | null = null;
        try {
          if (leased) {
            const receive = receiving(handle, limit, visibilityMs);
            rows = await dialect.writeTransaction((trx) => receiveIn(trx, receive), receive.options);
          } else {
            const deliver = delivering(handle, limit);
            rows = await dialect.writeTransaction((trx) => deliverIn(trx, deliver), deliver.options);
          }
          if (rows.length === 0) visibleAt = await nextVisibleAt(handle);
        } catch (error) {
          wake.cancel();
          throw error;
        }
        const left = deadline - performance.now();
        if (rows.length > 0 || left <= 0) {
          wake.cancel();
          rows.sort(bySeq);
          return leased ? rows.map(toReceived) : rows.map(toMessage);
        }
        // A leased message whose lease lapses before the deadline wakes us too.
        const until = visibleAt === null ? left : Math.min(left, Math.max(1, visibleAt - now() + 1));
        const timer = setTimeout(() => wake.cancel(), clampTimerMs(until));
        await wake.woken;
        clearTimeout(timer);
      }
    },

    async countPendingMessages(handle) {
      requireId('handle', handle);
      const row = await db
        .selectFrom('messages')
        .select((eb) => eb.fn.countAll<number>().as('n'))
        .where('to_handle', '=', handle)
        .where('status', '=', 'pending')
        .where('dead_at', 'is', null)
        .executeTakeFirstOrThrow();
      return Number(row.n);
    },
  } satisfies Omit<MessageRepository, 'waitForMessages'> & { waitForMessages: unknown };
  return repository as MessageRepository;
}

/** A list of ids (message ids to requeue): an array of at most `MAX_DELIVERY_LIMIT` ids. */
function requireIdList(field: string, value: unknown): string[] {
  if (!Array.isArray(value) || value.length > MAX_DELIVERY_LIMIT) {
    throw new InvalidArgumentError(field, `must be an array of at most ${MAX_DELIVERY_LIMIT} ids`);
  }
  return [...new Set(value.map((id, i) => requireId(`${field}[${i}]`, id)))];
}

/** Most messages one `sendMessages` call queues. */
export const MAX_MESSAGE_BATCH = 1_000;
/** Rows or ids per statement in a batch (SQLite binds at most 32,766 parameters per statement). */
const BATCH_CHUNK = 500;

function chunked<T>(list: readonly T[]): T[][] {
  const out: T[][] = [];
  for (let i = 0; i < list.length; i += BATCH_CHUNK) out.push(list.slice(i, i + BATCH_CHUNK));
  return out;
}

/** A `sendMessage` input, checked before the transaction. */
interface PreparedSend {
  readonly id: string;
  /** The caller chose the id (so a stored row with it is a retry). */
  readonly named: boolean;
  readonly from: string;
  readonly to: string;
  readonly kind: string;
  readonly payload: string | null;
  readonly allowUnknown: boolean;
}

function prepareSend(ctx: StoreContext, input: SendMessageInput): PreparedSend {
  const id = input.id === undefined ? ctx.newId() : requireId('id', input.id);
  const payload = requireJson('payload', input.payload);
  const from = requireId('from', input.from);
  const to = requireId('to', input.to);
  const kind = requireId('kind', input.kind);
  const allowUnknown =
    input.allowUnknownRecipient === undefined
      ? false
      : requireBoolean('allowUnknownRecipient', input.allowUnknownRecipient);
  return { id, named: input.id !== undefined, from, to, kind, payload, allowUnknown };
}
