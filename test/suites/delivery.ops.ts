/** Contender operations for the delivery suite (run in child processes by the race helper). */
import type { Store } from '../../src/index.js';
import type { ContenderTools } from '../support/contender.js';
import { defineOperations } from '../support/operations.js';

/** The host's tables the consumers write (created by the suite). */
export type HostTables = {
  /** One row per processed message, inserted in the ack's transaction (primary key: message id). */
  delivery_processed: { message_id: string; attempt: number; consumer: string };
  /** One row per hand-out seen, written on its own right after the receive. */
  delivery_handouts: { message_id: string; attempt: number; received_at: number; visible_again_at: number };
};

/**
 * Sends `n` messages from `from` to `to` one after another, ids `<prefix>-<i>`, payload
 * `{ sender, i }`, waiting `pauseMs` (default 0) between sends.
 */
export async function sendMany(
  store: Store,
  args: { from: string; to: string; n: number; prefix: string; pauseMs?: number },
) {
  for (let i = 0; i < args.n; i++) {
    if (args.pauseMs) await new Promise((resolve) => setTimeout(resolve, args.pauseMs));
    await store.messages.sendMessage({
      id: `${args.prefix}-${i}`,
      from: args.from,
      to: args.to,
      kind: 'report',
      payload: { sender: args.from, i },
    });
  }
  return { sent: args.n };
}

/** Sends one message with the given id (the same input in every contender). */
export async function sendSame(store: Store, args: { id: string; to: string }) {
  const m = await store.messages.sendMessage({ id: args.id, from: 'worker', to: args.to, kind: 'done', payload: 1 });
  return { id: m.id, seq: m.seq };
}

/** Consumes one gate's resolution, with a key or without. */
export async function consume(store: Store, args: { gateId: string; consumer: string; idempotencyKey?: string }) {
  const taken = await store.gates.consumeResolution(args.gateId, {
    consumer: args.consumer,
    ...(args.idempotencyKey === undefined ? {} : { idempotencyKey: args.idempotencyKey }),
  });
  return taken;
}

/** Never settles: a process that "acts" on a decision forever, until the test SIGKILLs it. */
const forever = () => new Promise<never>(() => {});

/**
 * Consumes a gate's decision under a key, signals `consumed`, then hangs before acting on it:
 * the parent SIGKILLs it there.
 */
export async function consumeThenDie(
  store: Store,
  args: { gateId: string; consumer: string; idempotencyKey: string },
  tools: ContenderTools,
) {
  await store.gates.consumeResolution(args.gateId, { consumer: args.consumer, idempotencyKey: args.idempotencyKey });
  tools.signal('consumed');
  return forever();
}

/**
 * Consumes a gate's decision with `tx.gates.consumeResolution` inside `store.transaction`, signals
 * `consumed-in-transaction`, then hangs before the transaction commits: the parent SIGKILLs it there.
 */
export async function consumeInTransactionThenDie(
  store: Store,
  args: { gateId: string; consumer: string },
  tools: ContenderTools,
) {
  return store.transaction(async (tx) => {
    await tx.gates.consumeResolution(args.gateId, { consumer: args.consumer });
    tools.signal('consumed-in-transaction');
    return forever();
  });
}

/** Resolves a gate under a key. */
export async function resolveKeyed(store: Store, args: { gateId: string; resolution: string; idempotencyKey: string }) {
  const gate = await store.gates.resolveGate(args.gateId, args.resolution, { idempotencyKey: args.idempotencyKey });
  return { id: gate.id, resolution: gate.resolution, resolvedAt: gate.resolvedAt };
}

/** Claims a task lease under a key (the same input in every contender). */
export async function claimKeyed(store: Store, args: { taskId: string; idempotencyKey: string }) {
  return store.locks.claimTaskLease(args.taskId, {
    holder: 'worker',
    ttlMs: 60_000,
    idempotencyKey: args.idempotencyKey,
  });
}

/** dispatchNext under a key (the same input in every contender). */
export async function dispatchNextKeyed(
  store: Store,
  args: { runId: string; terminalHandle: string; idempotencyKey: string },
) {
  return store.dispatches.dispatchNext(args);
}

/** Moves a task ready → blocked under a key (the same input in every contender). */
export async function transitionKeyed(store: Store, args: { taskId: string; idempotencyKey: string }) {
  return store.tasks.transitionTask(args.taskId, {
    from: 'ready',
    to: 'blocked',
    reason: 'raced',
    idempotencyKey: args.idempotencyKey,
  });
}

/**
 * Receives and acks until `total` messages are processed, logging what it sees: each consumer
 * receives a batch (the hand-outs logged on their own), then processes it in one
 * `store.transaction` that inserts the host rows and acks the receipts (a refused ack rolls the
 * inserts back). With `crashOdds`, it SIGKILLs itself at random points: after a receive, in the
 * middle of processing (after the host insert, before the ack), and after an ack committed.
 * Returns each sender's message numbers in the order this consumer processed them.
 */
export async function consumeAll(
  store: Store,
  args: {
    inbox: string;
    total: number;
    visibilityMs: number;
    crashOdds: number;
    limit: number;
    /** The name written with each processed row (default: the contender's index). */
    consumer?: string;
    /** Give up (returning `gaveUp: true`) after this long with nothing received (default: never). */
    idleGiveUpMs?: number;
  },
  tools: ContenderTools,
) {
  const host = store.db.withTables<HostTables>();
  const order: Record<string, number[]> = {};
  const crash = (point: string) => {
    if (Math.random() < args.crashOdds) {
      tools.signal(`crash:${point}`);
      process.kill(process.pid, 'SIGKILL');
    }
  };
  let refused = 0;
  let lastReceived = Date.now();
  for (;;) {
    const batch = await store.messages.waitForMessages(args.inbox, {
      timeoutMs: 200,
      limit: args.limit,
      visibilityMs: args.visibilityMs,
    });
    if (batch.length === 0) {
      const done = await host
        .selectFrom('delivery_processed')
        .select((eb) => eb.fn.countAll<number>().as('n'))
        .executeTakeFirstOrThrow();
      if (Number(done.n) >= args.total) return { order, refused, gaveUp: false };
      if (args.idleGiveUpMs !== undefined && Date.now() - lastReceived > args.idleGiveUpMs)
        return { order, refused, gaveUp: true };
      continue;
    }
    lastReceived = Date.now();
    const now = Date.now();
    // Through store.transaction: a plain autocommit insert could surface SQLITE_BUSY.
    await store.transaction((tx) =>
      tx.db
        .withTables<HostTables>()
        .insertInto('delivery_handouts')
        .values(
          batch.map((m) => ({
            message_id: m.id,
            attempt: m.attempt,
            received_at: now,
            visible_again_at: m.visibleAgainAt,
          })),
        )
        .execute(),
    );
    crash('after-receive');
    // The whole batch in one transaction: host rows and acks commit together. A refused ack
    // (a lease that lapsed meanwhile) rolls the batch back; its messages are then taken one by one.
    const process = async (messages: typeof batch) =>
      store
        .transaction(async (tx) => {
          // Ack first: a refused receipt (its lease lapsed, another consumer may hold it now)
          // stops the batch before any host write; an accepted one holds its row until commit.
          const result = await tx.messages.ackMessages(
            args.inbox,
            messages.map((m) => m.receipt),
          );
          if (result.refused.length > 0) throw new RefusedAck();
          crash('mid-processing');
          await tx.db
            .withTables<HostTables>()
            .insertInto('delivery_processed')
            .values(
              messages.map((m) => ({
                message_id: m.id,
                attempt: m.attempt,
                consumer: args.consumer ?? String(tools.index),
              })),
            )
            .execute();
          return true;
        })
        .catch((error: unknown) => {
          if (error instanceof RefusedAck) return false;
          throw error;
        });
    const record = (m: (typeof batch)[number]) => {
      const p = m.payload as { sender: string; i: number };
      (order[p.sender] ??= []).push(p.i);
    };
    if (await process(batch)) {
      crash('after-ack');
      batch.forEach(record);
      continue;
    }
    for (const m of batch) {
      if (await process([m])) record(m);
      else refused++;
    }
  }
}

class RefusedAck extends Error {}

/** The operations this module's contenders run (see test/support/operations.ts). */
export const ops = defineOperations(import.meta.url, {
  sendMany,
  sendSame,
  consume,
  consumeThenDie,
  consumeInTransactionThenDie,
  resolveKeyed,
  consumeAll,
  claimKeyed,
  dispatchNextKeyed,
  transitionKeyed,
});
