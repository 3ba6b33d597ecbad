import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Store } from '../../src/index.js';
import type { DialectFixture } from '../support/fixtures.js';
import { tbl } from '../support/schema.js';
import { ContenderExitedError, Contenders } from '../support/race.js';
import { ops as OPS, type HostTables } from './delivery.ops.js';

/** A clock the test moves by hand: leases lapse when the test says, never by sleeping. */
function manualClock(start = 1_800_000_000_000) {
  let now = start;
  return { now: () => now, advance: (ms: number) => (now += ms) };
}

const CONTENDERS = 6;

/**
 * Leased delivery (issue 23): hand-outs under a lease with receipts, redelivery after a lapse
 * with attempt + 1, dead letters after maxAttempts, acks in the host's transaction, idempotent
 * sends and keys, exactly-once resume of a gate, send order per sender, and crash redelivery with
 * real processes SIGKILLed at random points.
 */
export function defineDeliverySuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  beforeAll(() => {
    fx = makeFixture();
  });
  afterAll(() => fx.cleanup());

  async function inboxOf(store: Store, targetKey = `worktree:d-${Math.random()}`) {
    const run = await store.runs.startCoordinatorRun({ targetKey });
    return run;
  }

  async function send(store: Store, to: string, n: number, from = 'worker') {
    const sent = [];
    for (let i = 0; i < n; i++) sent.push(await store.messages.sendMessage({ from, to, kind: 'k', payload: { i } }));
    return sent;
  }

  describe('leases and receipts', () => {
    it('hands out oldest first under a lease; a leased message is not handed out again until its lease lapses', async () => {
      const clock = manualClock();
      const store = await fx.freshStore({ clock });
      const { coordinatorHandle: inbox } = await inboxOf(store);
      const sent = await send(store, inbox, 5);
      const first = await store.messages.receiveMessages(inbox, { limit: 3, visibilityMs: 1_000 });
      expect(first.map((m) => m.id)).toEqual(sent.slice(0, 3).map((m) => m.id));
      expect(first.map((m) => m.attempt)).toEqual([1, 1, 1]);
      expect(first.every((m) => m.visibleAgainAt === clock.now() + 1_000)).toBe(true);
      expect(new Set(first.map((m) => m.receipt)).size).toBe(3);
      // The other two, then nothing while the leases hold (mutant "receive-skips-visibility" fails here).
      const second = await store.messages.receiveMessages(inbox, { visibilityMs: 1_000 });
      expect(second.map((m) => m.id)).toEqual(sent.slice(3).map((m) => m.id));
      clock.advance(999);
      expect(await store.messages.receiveMessages(inbox, { visibilityMs: 1_000 })).toEqual([]);
      expect(await store.messages.countPendingMessages(inbox)).toBe(5);
      // Lapsed: handed out again, attempt 2, new receipts.
      clock.advance(1);
      const again = await store.messages.receiveMessages(inbox, { limit: 3, visibilityMs: 1_000 });
      expect(again.map((m) => [m.id, m.attempt])).toEqual(sent.slice(0, 3).map((m) => [m.id, 2]));
      // The first hand-out's receipt is refused and acks nothing (mutant "ack-skips-receipt" fails here).
      expect(await store.messages.ackMessages(inbox, [first[0]!.receipt])).toEqual({
        acked: [],
        refused: [{ receipt: first[0]!.receipt, reason: 'superseded' }],
      });
      const statusOf = async (id: string) =>
        (await store.db.selectFrom('messages').select('status').where('id', '=', id).executeTakeFirstOrThrow()).status;
      expect(await statusOf(first[0]!.id)).toBe('pending');
      // Refusals are per receipt, in one batch with a good one.
      const stale = await store.messages.ackMessages(inbox, [first[0]!.receipt, again[0]!.receipt, 'nonsense']);
      expect(stale.acked).toEqual([again[0]!.receipt]);
      expect(stale.refused).toEqual([
        { receipt: first[0]!.receipt, reason: 'superseded' },
        { receipt: 'nonsense', reason: 'never_granted' },
      ]);
      // An ack is idempotent by receipt; a lapsed lease's receipt is refused as expired.
      expect(await store.messages.ackMessages(inbox, [again[0]!.receipt])).toEqual({
        acked: [again[0]!.receipt],
        refused: [],
      });
      clock.advance(1_000);
      expect((await store.messages.ackMessages(inbox, [again[1]!.receipt])).refused).toEqual([
        { receipt: again[1]!.receipt, reason: 'expired' },
      ]);
      // Another inbox's receipt is never granted here.
      const other = await inboxOf(store);
      expect((await store.messages.ackMessages(other.coordinatorHandle, [again[2]!.receipt])).refused).toEqual([
        { receipt: again[2]!.receipt, reason: 'never_granted' },
      ]);
      expect(await store.messages.countPendingMessages(inbox)).toBe(4);
    });

    it('releases put messages back (after delayMs) with the error; the last attempt dead-letters; dead ones are listed and requeued', async () => {
      const clock = manualClock();
      const store = await fx.freshStore({ clock, maxAttempts: 2 });
      const { coordinatorHandle: inbox } = await inboxOf(store);
      const [a, b] = await send(store, inbox, 2);
      const [ra, rb] = await store.messages.receiveMessages(inbox, { visibilityMs: 1_000 });
      const released = await store.messages.releaseMessages(inbox, [ra!.receipt], {
        delayMs: 500,
        error: 'tool failed',
      });
      expect(released).toEqual({ released: [ra!.receipt], deadLettered: [], refused: [] });
      expect((await store.messages.ackMessages(inbox, [ra!.receipt])).refused).toEqual([
        { receipt: ra!.receipt, reason: 'released' },
      ]);
      expect(await store.messages.receiveMessages(inbox)).toEqual([]);
      clock.advance(500);
      const [again] = await store.messages.receiveMessages(inbox, { visibilityMs: 1_000 });
      expect([again!.id, again!.attempt, again!.lastError]).toEqual([a!.id, 2, 'tool failed']);
      // Its second (last) attempt: a release dead-letters it with the error.
      expect(await store.messages.releaseMessages(inbox, [again!.receipt], { error: 'failed again' })).toEqual({
        released: [],
        deadLettered: [again!.receipt],
        refused: [],
      });
      // b's lease lapses, it is handed out a second time, and lapses again: dead.
      clock.advance(1_000);
      const [b2] = await store.messages.receiveMessages(inbox, { visibilityMs: 1_000 });
      expect([b2!.id, b2!.attempt]).toEqual([b!.id, 2]);
      expect((await store.messages.ackMessages(inbox, [rb!.receipt])).refused[0]!.reason).toBe('superseded');
      clock.advance(1_000);
      expect(await store.messages.receiveMessages(inbox)).toEqual([]);
      const dead = await store.messages.listDeadMessages(inbox);
      expect(dead.map((m) => [m.id, m.status, m.attempts, m.lastError])).toEqual([
        [a!.id, 'dead', 2, 'failed again'],
        [b!.id, 'dead', 2, 'its lease lapsed on its last attempt'],
      ]);
      expect((await store.messages.ackMessages(inbox, [b2!.receipt])).refused[0]!.reason).toBe('dead');
      expect(await store.messages.countPendingMessages(inbox)).toBe(0);
      const requeued = await store.messages.requeueDeadMessages(inbox, [a!.id]);
      expect(requeued.map((m) => [m.id, m.status, m.attempts])).toEqual([[a!.id, 'pending', 0]]);
      const [fresh] = await store.messages.receiveMessages(inbox);
      expect([fresh!.id, fresh!.attempt]).toEqual([a!.id, 1]);
    });

    it('an ack inside store.transaction commits and rolls back with the host insert', async () => {
      const store = await fx.freshStore();
      const { coordinatorHandle: inbox } = await inboxOf(store);
      // The schema builder, not raw SQL, so the table lands in the store's schema (TEST_PG_SCHEMA).
      await store.db.schema
        .createTable('host_done')
        .addColumn('message_id', 'text', (c) => c.primaryKey())
        .execute();
      const [m] = await send(store, inbox, 1);
      const [r] = await store.messages.receiveMessages(inbox, { visibilityMs: 60_000 });
      const host = (db: typeof store.db) => db.withTables<{ host_done: { message_id: string } }>();
      await expect(
        store.transaction(async (tx) => {
          await host(tx.db).insertInto('host_done').values({ message_id: m!.id }).execute();
          await tx.messages.ackMessages(inbox, [r!.receipt]);
          throw new Error('host fails after the ack');
        }),
      ).rejects.toThrow('host fails');
      expect(await host(store.db).selectFrom('host_done').selectAll().execute()).toEqual([]);
      expect(await store.messages.countPendingMessages(inbox)).toBe(1);
      await store.transaction(async (tx) => {
        await host(tx.db).insertInto('host_done').values({ message_id: m!.id }).execute();
        expect((await tx.messages.ackMessages(inbox, [r!.receipt])).acked).toEqual([r!.receipt]);
      });
      expect(await host(store.db).selectFrom('host_done').selectAll().execute()).toEqual([{ message_id: m!.id }]);
      expect(await store.messages.countPendingMessages(inbox)).toBe(0);
    });

    it('deliverPendingMessages hands out and acks at once (at most once), skipping leased messages', async () => {
      const store = await fx.freshStore();
      const { coordinatorHandle: inbox } = await inboxOf(store);
      const sent = await send(store, inbox, 3);
      await store.messages.receiveMessages(inbox, { limit: 1, visibilityMs: 60_000 });
      const delivered = await store.messages.deliverPendingMessages(inbox);
      expect(delivered.map((m) => [m.id, m.status, m.attempts])).toEqual(
        sent.slice(1).map((m) => [m.id, 'delivered', 1]),
      );
    });

    it('deliverPendingMessages dead-letters a message whose last attempt lapsed instead of handing it out', async () => {
      const clock = manualClock();
      const store = await fx.freshStore({ clock, maxAttempts: 2 });
      const { coordinatorHandle: inbox } = await inboxOf(store);
      const [m] = await send(store, inbox, 1);
      await store.messages.receiveMessages(inbox, { visibilityMs: 100 });
      clock.advance(100);
      await store.messages.receiveMessages(inbox, { visibilityMs: 100 });
      clock.advance(100);
      // Its second (last) lease lapsed: dead, not delivered a third time.
      expect(await store.messages.deliverPendingMessages(inbox)).toEqual([]);
      expect((await store.messages.listDeadMessages(inbox)).map((d) => [d.id, d.status, d.attempts])).toEqual([
        [m!.id, 'dead', 2],
      ]);
    });

    it("the successor's first hand-out dead-letters a stopped run's message whose last lease lapsed", async () => {
      const clock = manualClock();
      const store = await fx.freshStore({ clock, maxAttempts: 2 });
      const targetKey = 'worktree:takeover-dead';
      const a = await store.runs.startCoordinatorRun({ targetKey });
      const [last, next] = await send(store, a.coordinatorHandle, 2);
      await store.messages.receiveMessages(a.coordinatorHandle, { limit: 1, visibilityMs: 100 });
      clock.advance(100);
      await store.messages.receiveMessages(a.coordinatorHandle, { limit: 1, visibilityMs: 100 });
      clock.advance(100);
      await store.runs.stopCoordinatorRun(a.id, 'failed');
      const b = await store.runs.startCoordinatorRun({ targetKey });
      // Its second (last) lease lapsed in the stopped run's inbox: the successor's first receive
      // makes it dead in its own inbox and hands out the next one.
      const got = await store.messages.receiveMessages(b.coordinatorHandle, { visibilityMs: 100 });
      expect(got.map((m) => m.id)).toEqual([next!.id]);
      expect(
        (await store.messages.listDeadMessages(b.coordinatorHandle)).map((d) => [d.id, d.status, d.attempts]),
      ).toEqual([[last!.id, 'dead', 2]]);
    });

    it('waitForMessages wakes when a lease lapses, and when a message arrives', async () => {
      const store = await fx.freshStore();
      const { coordinatorHandle: inbox } = await inboxOf(store);
      await send(store, inbox, 1);
      const [first] = await store.messages.receiveMessages(inbox, { visibilityMs: 300 });
      const again = await store.messages.waitForMessages(inbox, { timeoutMs: 30_000, visibilityMs: 60_000 });
      expect(again.map((m) => [m.id, m.attempt])).toEqual([[first!.id, 2]]);
      const waiting = store.messages.waitForMessages(inbox, { timeoutMs: 30_000, visibilityMs: 60_000 });
      const [sent] = await send(store, inbox, 1);
      expect((await waiting).map((m) => m.id)).toEqual([sent!.id]);
    });
  });

  describe("Orca's send order", () => {
    it('200 messages sent within one millisecond are delivered in send order, however the reads are cut', async () => {
      // The clock never moves: every message has the same created_at, so only seq orders them.
      const clock = manualClock();
      const store = await fx.freshStore({ clock });
      try {
        const { coordinatorHandle: inbox } = await inboxOf(store);
        const sent = await send(store, inbox, 200);
        expect(new Set(sent.map((m) => m.createdAt)).size).toBe(1);
        expect(sent.every((m, i) => i === 0 || m.seq > sent[i - 1]!.seq)).toBe(true);
        // Leased hand-outs in uneven batches (the pick and the returned order), then the rest by
        // deliverPendingMessages: one sequence, 0..199.
        const got: number[] = [];
        for (let round = 0; round < 5; round++) {
          const batch = await store.messages.receiveMessages(inbox, { limit: 7 + round * 6, visibilityMs: 60_000 });
          got.push(...batch.map((m) => (m.payload as { i: number }).i));
          await store.messages.ackMessages(
            inbox,
            batch.map((m) => m.receipt),
          );
        }
        for (;;) {
          const batch = await store.messages.deliverPendingMessages(inbox, { limit: 13 });
          if (batch.length === 0) break;
          got.push(...batch.map((m) => (m.payload as { i: number }).i));
        }
        // Mutants "order-by-created-at-id" (the hand-out's pick, or the sort of what it returns,
        // by (created_at, id) instead of seq) fail here.
        expect(got).toEqual(Array.from({ length: 200 }, (_, i) => i));
      } finally {
        await store.close();
      }
    });
  });

  describe('sends', () => {
    it('an id makes a send idempotent; an unknown recipient is refused unless opted in', async () => {
      const store = await fx.freshStore();
      const { coordinatorHandle: inbox } = await inboxOf(store);
      const input = { id: 'report-1', from: 'w', to: inbox, kind: 'done', payload: { ok: true } };
      const m = await store.messages.sendMessage(input);
      expect(await store.messages.sendMessage(input)).toEqual(m);
      await expect(store.messages.sendMessage({ ...input, payload: { ok: false } })).rejects.toMatchObject({
        code: 'ALREADY_EXISTS',
        differences: ['payload'],
      });
      await expect(store.messages.sendMessage({ from: 'w', to: 'coordinator-typo', kind: 'k' })).rejects.toMatchObject({
        code: 'UNKNOWN_RECIPIENT',
        to: 'coordinator-typo',
      });
      const later = await store.messages.sendMessage({
        from: 'w',
        to: 'terminal-later',
        kind: 'k',
        allowUnknownRecipient: true,
      });
      expect(later.to).toBe('terminal-later');
      expect(await store.db.selectFrom('messages').select('id').where('to_handle', '=', inbox).execute()).toHaveLength(
        1,
      );
    });

    it('reports to a dead coordinator reach the run that took over its target, leased ones after their lease', async () => {
      const clock = manualClock();
      const store = await fx.freshStore({ clock });
      const targetKey = 'worktree:takeover';
      const a = await store.runs.startCoordinatorRun({ targetKey });
      const [m1, m2] = await send(store, a.coordinatorHandle, 2);
      const [leased] = await store.messages.receiveMessages(a.coordinatorHandle, { limit: 1, visibilityMs: 5_000 });
      expect(leased!.id).toBe(m1!.id);
      await store.runs.stopCoordinatorRun(a.id, 'failed');
      const b = await store.runs.startCoordinatorRun({ targetKey });
      // A worker that has not heard of the restart still reports to the old handle.
      const [m3] = await send(store, a.coordinatorHandle, 1);
      const got = await store.messages.receiveMessages(b.coordinatorHandle, { visibilityMs: 5_000 });
      expect(got.map((m) => m.id)).toEqual([m2!.id, m3!.id]);
      expect(got.every((m) => m.to === b.coordinatorHandle)).toBe(true);
      expect(
        (
          await store.messages.ackMessages(
            b.coordinatorHandle,
            got.map((m) => m.receipt),
          )
        ).acked,
      ).toHaveLength(2);
      clock.advance(5_000);
      const redelivered = await store.messages.receiveMessages(b.coordinatorHandle, { visibilityMs: 5_000 });
      expect(redelivered.map((m) => [m.id, m.attempt])).toEqual([[m1!.id, 2]]);
      // The dead run's receipt no longer acks anything.
      expect((await store.messages.ackMessages(a.coordinatorHandle, [leased!.receipt])).refused[0]!.reason).toBe(
        'never_granted',
      );
      const acked = await store.messages.ackMessages(b.coordinatorHandle, [redelivered[0]!.receipt]);
      expect(acked.acked).toHaveLength(1);
      expect(await store.messages.countPendingMessages(a.coordinatorHandle)).toBe(0);
    });
  });

  describe('exactly-once resume', () => {
    it('resolveGate with the same resolution returns the gate; consumeResolution has exactly one taker; keys make retries converge', async () => {
      const store = await fx.freshStore();
      const gate = await store.gates.openGate({ question: 'ship?' });
      await expect(store.gates.consumeResolution(gate.id, { consumer: 'run-a' })).rejects.toMatchObject({
        code: 'GATE_NOT_RESOLVED',
      });
      const resolved = await store.gates.resolveGate(gate.id, 'yes');
      expect(await store.gates.resolveGate(gate.id, 'yes')).toEqual(resolved);
      await expect(store.gates.resolveGate(gate.id, 'no')).rejects.toMatchObject({
        code: 'GATE_ALREADY_RESOLVED',
        resolution: 'yes',
      });
      const taken = await store.gates.consumeResolution(gate.id, { consumer: 'run-a', idempotencyKey: 'resume-1' });
      expect(taken).toMatchObject({ gateId: gate.id, resolution: 'yes', consumer: 'run-a' });
      // The consumer's own retry with its key gets the first outcome; anyone else is refused, named.
      expect(await store.gates.consumeResolution(gate.id, { consumer: 'run-a', idempotencyKey: 'resume-1' })).toEqual(
        taken,
      );
      await expect(store.gates.consumeResolution(gate.id, { consumer: 'run-a' })).rejects.toMatchObject({
        code: 'RESOLUTION_ALREADY_CONSUMED',
        consumer: 'run-a',
      });
      await expect(
        store.gates.consumeResolution(gate.id, { consumer: 'run-b', idempotencyKey: 'x' }),
      ).rejects.toMatchObject({
        code: 'RESOLUTION_ALREADY_CONSUMED',
        consumer: 'run-a',
      });
      // A refusal under a key is the outcome too: the retry gets the same typed refusal.
      const again = await store.gates
        .consumeResolution(gate.id, { consumer: 'run-b', idempotencyKey: 'x' })
        .catch((e: unknown) => e);
      expect(again).toBeInstanceOf(Error);
      expect(again).toMatchObject({ code: 'RESOLUTION_ALREADY_CONSUMED', consumer: 'run-a', gateId: gate.id });
      expect((again as Error).constructor.name).toBe('ResolutionAlreadyConsumedError');
      // Other input under a used key is a typed conflict.
      await expect(
        store.gates.consumeResolution(gate.id, { consumer: 'run-c', idempotencyKey: 'resume-1' }),
      ).rejects.toMatchObject({
        code: 'IDEMPOTENCY_KEY_CONFLICT',
      });
    });

    it('a keyed consumeResolution before the decision stores nothing: the same key takes the decision once it comes', async () => {
      const store = await fx.freshStore();
      const gate = await store.gates.openGate({ question: 'wait?' });
      await expect(
        store.gates.consumeResolution(gate.id, { consumer: 'run-a', idempotencyKey: 'poll' }),
      ).rejects.toMatchObject({ code: 'GATE_NOT_RESOLVED' });
      expect(await store.db.selectFrom('idempotency_keys').select('key').where('key', '=', 'poll').execute()).toEqual(
        [],
      );
      await store.gates.resolveGate(gate.id, 'go');
      const taken = await store.gates.consumeResolution(gate.id, { consumer: 'run-a', idempotencyKey: 'poll' });
      expect(taken).toMatchObject({ gateId: gate.id, resolution: 'go', consumer: 'run-a' });
      expect(await store.gates.consumeResolution(gate.id, { consumer: 'run-a', idempotencyKey: 'poll' })).toEqual(
        taken,
      );
    });

    it('a keyed call whose key cannot be written leaves no effect: the key and the effect commit together', async () => {
      const store = await fx.freshStore();
      // A host trigger refuses to store the key 'doomed': a failure between the effect and its key.
      if (fx.kind === 'sqlite') {
        await sql`create trigger refuse_doomed_key before insert on idempotency_keys when new.key = 'doomed'
          begin select raise(abort, 'key write refused'); end`.execute(store.db);
      } else {
        await sql`create or replace function refuse_doomed_key() returns trigger language plpgsql as $$
          begin if new.key = 'doomed' then raise exception 'key write refused'; end if; return new; end $$`.execute(
          store.db,
        );
        await sql`create trigger refuse_doomed_key before insert on ${tbl(store.db, 'idempotency_keys')}
          for each row execute function refuse_doomed_key()`.execute(store.db);
      }
      const gate = await store.gates.openGate({ question: 'ship?' });
      await expect(store.gates.resolveGate(gate.id, 'yes', { idempotencyKey: 'doomed' })).rejects.toThrow(
        /key write refused/,
      );
      // The resolution rolled back with the key (mutant "key-outside-transaction": it stays).
      expect((await store.gates.getGate(gate.id))?.status).toBe('open');
      await store.gates.resolveGate(gate.id, 'no', { idempotencyKey: 'kept' });
      expect((await store.gates.getGate(gate.id))?.resolution).toBe('no');
    });

    it('ack and release take an idempotency key', async () => {
      const store = await fx.freshStore();
      const { coordinatorHandle: inbox } = await inboxOf(store);
      await send(store, inbox, 2);
      const [r1, r2] = await store.messages.receiveMessages(inbox, { visibilityMs: 60_000 });
      const first = await store.messages.ackMessages(inbox, [r1!.receipt], { idempotencyKey: 'ack-1' });
      expect(await store.messages.ackMessages(inbox, [r1!.receipt], { idempotencyKey: 'ack-1' })).toEqual(first);
      await expect(store.messages.ackMessages(inbox, [r2!.receipt], { idempotencyKey: 'ack-1' })).rejects.toMatchObject(
        { code: 'IDEMPOTENCY_KEY_CONFLICT' },
      );
      const rel = await store.messages.releaseMessages(inbox, [r2!.receipt], { idempotencyKey: 'rel-1' });
      expect(await store.messages.releaseMessages(inbox, [r2!.receipt], { idempotencyKey: 'rel-1' })).toEqual(rel);
      expect(rel.released).toEqual([r2!.receipt]);
    });
  });

  describe(`${CONTENDERS} processes at once`, () => {
    let contenders: Contenders<typeof OPS>;
    let url: string;
    let store: Store;
    beforeAll(async () => {
      url = await fx.freshUrl();
      store = await fx.open(url);
      await store.migrate();
      contenders = await Contenders.start(CONTENDERS, { url, ops: OPS, storeOptions: { poolSize: 2 } });
    });
    afterAll(() => contenders?.close());

    it('sending one id, consuming one gate with one key, or resolving under one key: all get the one outcome', async () => {
      const { coordinatorHandle: inbox } = await inboxOf(store);
      for (let round = 0; round < 5; round++) {
        const sends = await contenders.race('sendSame', () => ({ id: `same-${round}`, to: inbox }));
        expect(new Set(sends.map((o) => (o.ok ? JSON.stringify(o.value) : o.error.code))).size).toBe(1);
        expect(sends.every((o) => o.ok)).toBe(true);

        const gate = await store.gates.openGate({ question: `q${round}` });
        const resolutions = await contenders.race('resolveKeyed', () => ({
          gateId: gate.id,
          resolution: 'go',
          idempotencyKey: `resolve-${round}`,
        }));
        expect(new Set(resolutions.map((o) => (o.ok ? JSON.stringify(o.value) : o.error.code))).size).toBe(1);

        const keyed = await contenders.race('consume', () => ({
          gateId: gate.id,
          consumer: 'coordinator',
          idempotencyKey: `consume-${round}`,
        }));
        expect(keyed.every((o) => o.ok)).toBe(true);
        expect(new Set(keyed.map((o) => JSON.stringify(o.ok && o.value))).size).toBe(1);

        const other = await store.gates.openGate({ question: `r${round}` });
        await store.gates.resolveGate(other.id, 'go');
        const unkeyed = await contenders.race('consume', (i) => ({ gateId: other.id, consumer: `c${i}` }));
        const winners = unkeyed.filter((o) => o.ok);
        expect(winners).toHaveLength(1);
        const winner = `c${winners[0]!.index}`;
        for (const o of unkeyed.filter((x) => !x.ok)) {
          expect(o.ok ? null : o.error).toMatchObject({ code: 'RESOLUTION_ALREADY_CONSUMED', consumer: winner });
        }
      }
      expect(await store.db.selectFrom('messages').select('id').where('to_handle', '=', inbox).execute()).toHaveLength(
        5,
      );
    });

    it('claiming a task lease, dispatchNext and a transition under one key each: all get the one outcome, and one effect is stored', async () => {
      const company = await store.org.createCompany({ name: 'race' });
      const targetKey = `worktree:keyed-${Math.random()}`;
      const run = await store.runs.startCoordinatorRun({ targetKey });
      const one = (o: { ok: boolean; value?: unknown; error?: { code?: string } }) =>
        o.ok ? JSON.stringify(o.value) : (o.error?.code ?? 'no code');
      for (let round = 0; round < 3; round++) {
        const task = (title: string) =>
          store.tasks.createTask({
            companyId: company.id,
            title,
            requiresFilesystem: false,
            targetKey,
            status: 'ready',
          });
        const leased = await task(`lease-${round}`);
        const moved = await task(`move-${round}`);

        const claims = await contenders.race('claimKeyed', () => ({
          taskId: leased.id,
          idempotencyKey: `claim-${round}`,
        }));
        expect(claims.every((o) => o.ok)).toBe(true);
        expect(new Set(claims.map(one)).size).toBe(1);
        expect(claims[0]!.ok && claims[0]!.value).toMatchObject({ status: 'acquired', lease: { token: 1 } });
        expect((await store.locks.getTaskLease(leased.id))?.token).toBe(1);

        const transitions = await contenders.race('transitionKeyed', () => ({
          taskId: moved.id,
          idempotencyKey: `move-${round}`,
        }));
        expect(transitions.every((o) => o.ok)).toBe(true);
        expect(new Set(transitions.map(one)).size).toBe(1);
        expect((await store.tasks.requireTask(moved.id)).status).toBe('blocked');

        const dispatches = await contenders.race('dispatchNextKeyed', () => ({
          runId: run.id,
          terminalHandle: `term-${round}`,
          idempotencyKey: `next-${round}`,
        }));
        expect(dispatches.every((o) => o.ok)).toBe(true);
        expect(new Set(dispatches.map(one)).size).toBe(1);
        const active = await store.dispatches.listDispatches({ terminalHandle: `term-${round}` });
        expect(active.map((d) => [d.id, d.status])).toEqual([
          [(dispatches[0]!.ok && (dispatches[0]!.value as { id: string }).id) || '', 'active'],
        ]);
      }
    });
  });

  describe('exactly-once resume across a consumer crash, real processes', () => {
    async function resolvedGate() {
      const url = await fx.freshUrl();
      const store = await fx.open(url);
      await store.migrate();
      const gate = await store.gates.openGate({ question: 'ship?' });
      await store.gates.resolveGate(gate.id, 'yes');
      return { url, store, gate };
    }
    const consumedRow = (store: Store, gateId: string) =>
      store.db
        .selectFrom('decision_gates')
        .select(['consumed_by', 'consumed_at'])
        .where('id', '=', gateId)
        .executeTakeFirstOrThrow();

    it('a consumer SIGKILLed after a keyed consumeResolution: its restart (same name, same key) gets the decision again; another consumer is refused, named', async () => {
      const { url, store, gate } = await resolvedGate();
      const input = { gateId: gate.id, consumer: 'coordinator-1', idempotencyKey: `resume:${gate.id}` };
      const first = await Contenders.start(1, { url, ops: OPS });
      try {
        const dying = first.start(0, 'consumeThenDie', input);
        await first.waitForSignal(0, 'consumed');
        await first.kill(0);
        await expect(dying).rejects.toBeInstanceOf(ContenderExitedError);
      } finally {
        await first.close();
      }
      // The consumption committed before the crash: the decision is taken, by the dead process.
      const row = await consumedRow(store, gate.id);
      expect(row.consumed_by).toBe('coordinator-1');
      const restarted = await Contenders.start(1, { url, ops: OPS });
      try {
        // The restart replays the key: the same decision, the first consumption's time (not a new one).
        const again = await restarted.run(0, 'consume', input);
        expect(again).toEqual({
          index: 0,
          ok: true,
          value: { gateId: gate.id, resolution: 'yes', consumer: 'coordinator-1', consumedAt: Number(row.consumed_at) },
        });
        const other = await restarted.run(0, 'consume', {
          gateId: gate.id,
          consumer: 'coordinator-2',
          idempotencyKey: `resume:${gate.id}:2`,
        });
        expect(other.ok ? other.value : other.error).toMatchObject({
          code: 'RESOLUTION_ALREADY_CONSUMED',
          consumer: 'coordinator-1',
        });
      } finally {
        await restarted.close();
      }
    });

    it('a consumer SIGKILLed inside store.transaction after tx.gates.consumeResolution, before COMMIT: the decision is still consumable', async () => {
      const { url, store, gate } = await resolvedGate();
      const first = await Contenders.start(1, { url, ops: OPS });
      try {
        const dying = first.start(0, 'consumeInTransactionThenDie', { gateId: gate.id, consumer: 'coordinator-1' });
        await first.waitForSignal(0, 'consumed-in-transaction');
        await first.kill(0);
        await expect(dying).rejects.toBeInstanceOf(ContenderExitedError);
      } finally {
        await first.close();
      }
      // The consumption rolled back with the process: nobody holds the decision.
      expect(await consumedRow(store, gate.id)).toEqual({ consumed_by: null, consumed_at: null });
      const restarted = await Contenders.start(1, { url, ops: OPS });
      try {
        const again = await restarted.run(0, 'consume', { gateId: gate.id, consumer: 'coordinator-1' });
        expect(again.ok ? again.value : again.error).toMatchObject({
          gateId: gate.id,
          resolution: 'yes',
          consumer: 'coordinator-1',
        });
      } finally {
        await restarted.close();
      }
    });
  });

  describe('order and crashes with real processes', () => {
    async function hostStore() {
      const url = await fx.freshUrl();
      const store = await fx.open(url);
      await store.migrate();
      // The schema builder, not raw SQL, so the tables land in the store's schema (TEST_PG_SCHEMA).
      await store.db.schema
        .createTable('delivery_processed')
        .addColumn('message_id', 'text', (c) => c.primaryKey())
        .addColumn('attempt', 'integer', (c) => c.notNull())
        .addColumn('consumer', 'text', (c) => c.notNull())
        .execute();
      await store.db.schema
        .createTable('delivery_handouts')
        .addColumn('message_id', 'text', (c) => c.notNull())
        .addColumn('attempt', 'integer', (c) => c.notNull())
        .addColumn('received_at', 'bigint', (c) => c.notNull())
        .addColumn('visible_again_at', 'bigint', (c) => c.notNull())
        .execute();
      return { url, store, host: store.db.withTables<HostTables>() };
    }

    it(
      'N senders, M consumers: no sender’s messages are reordered, none lost, none processed twice',
      { timeout: 600_000 },
      async () => {
        const { url, store, host } = await hostStore();
        const { coordinatorHandle: inbox } = await inboxOf(store);
        const SENDERS = 3;
        const CONSUMERS = 3;
        const PER_SENDER = 100;
        const senders = await Contenders.start(SENDERS, { url, ops: OPS, storeOptions: { poolSize: 2 } });
        const consumers = await Contenders.start(CONSUMERS, { url, ops: OPS, storeOptions: { poolSize: 2 } });
        try {
          const consuming = Array.from({ length: CONSUMERS }, (_, i) =>
            consumers.start(i, 'consumeAll', {
              inbox,
              total: SENDERS * PER_SENDER,
              visibilityMs: 600_000,
              crashOdds: 0,
              limit: 10,
            }),
          );
          const sent = await senders.race('sendMany', (i) => ({
            from: `s${i}`,
            to: inbox,
            n: PER_SENDER,
            prefix: `s${i}`,
          }));
          expect(sent.every((o) => o.ok)).toBe(true);
          const results = await Promise.all(consuming);
          for (const r of results) {
            expect(r.ok, JSON.stringify(r)).toBe(true);
            if (!r.ok) continue;
            for (const seen of Object.values(r.value.order)) {
              expect(seen).toEqual([...seen].sort((a, b) => a - b));
            }
          }
          const processed = await host.selectFrom('delivery_processed').selectAll().execute();
          expect(processed).toHaveLength(SENDERS * PER_SENDER);
          expect(processed.every((p) => p.attempt === 1)).toBe(true);
          // Within each sender, the store's sequence follows the send order.
          const rows = await store.db
            .selectFrom('messages')
            .select(['id', 'seq', 'from_handle'])
            .orderBy('seq')
            .execute();
          for (let s = 0; s < SENDERS; s++) {
            const mine = rows.filter((r) => r.from_handle === `s${s}`).map((r) => Number(r.id.split('-')[1]));
            expect(mine).toEqual([...Array(PER_SENDER).keys()]);
          }
        } finally {
          await senders.close();
          await consumers.close();
        }
      },
    );

    it(
      'coordinator restarts while workers report to the first coordinator’s handle: each new run takes over, every report acked once',
      { timeout: 900_000 },
      async () => {
        const { url, store, host } = await hostStore();
        const targetKey = `worktree:restart-${Math.random()}`;
        const first = await store.runs.startCoordinatorRun({ targetKey });
        const company = await store.org.createCompany({ name: 'restart' });
        const work = await Promise.all(
          [0, 1, 2].map((i) =>
            store.tasks.createTask({
              companyId: company.id,
              title: `t${i}`,
              requiresFilesystem: false,
              targetKey,
              status: 'ready',
            }),
          ),
        );
        const SENDERS = 2;
        const PER_SENDER = 600;
        const TOTAL = SENDERS * PER_SENDER;
        const VISIBILITY_MS = 1_500;
        const senders = await Contenders.start(SENDERS, { url, ops: OPS, storeOptions: { poolSize: 2 } });
        // One coordinator process at a time, for the target's running run. It SIGKILLs itself at
        // random points (after a receive, between its host insert and its ack, after an ack); the
        // run is then stopped 'failed' and a new run starts on the target, adopting its work, with
        // a new coordinator process on the new run's handle.
        const runs = [first.id];
        const restartedAt: number[] = [];
        const coordinate = async () => {
          let run = first;
          for (;;) {
            const one = await Contenders.start(1, { url, ops: OPS, storeOptions: { poolSize: 2 } });
            try {
              const outcome = await one.start(0, 'consumeAll', {
                inbox: run.coordinatorHandle,
                total: TOTAL,
                visibilityMs: VISIBILITY_MS,
                crashOdds: 0.02,
                limit: 20,
                consumer: run.id,
                // A report lost to the takeover would keep the coordinator waiting for ever.
                idleGiveUpMs: 30_000,
              });
              if (outcome.ok) return;
              throw new Error(JSON.stringify(outcome.error));
            } catch (error) {
              if (!(error instanceof ContenderExitedError)) throw error;
            } finally {
              await one.close();
            }
            await store.runs.stopCoordinatorRun(run.id, 'failed');
            run = await store.runs.startCoordinatorRun({ targetKey });
            runs.push(run.id);
            restartedAt.push(Date.now());
          }
        };
        try {
          const coordinating = coordinate();
          // Every report goes to the first run's handle: the workers never hear of the restarts.
          const sent = await senders.race('sendMany', (i) => ({
            from: `s${i}`,
            to: first.coordinatorHandle,
            n: PER_SENDER,
            prefix: `s${i}`,
            // Paced, so the sends span several coordinator lifetimes (a process start takes seconds).
            pauseMs: 10,
          }));
          expect(sent.every((o) => o.ok)).toBe(true);
          await coordinating;
        } finally {
          await senders.close();
        }
        // The race was one: a coordinator died while reports were still being sent.
        expect(restartedAt.length, 'no coordinator died').toBeGreaterThan(0);
        const rows = await store.db
          .selectFrom('messages')
          .select(['id', 'status', 'attempts', 'dead_at', 'to_handle', 'created_at'])
          .execute();
        expect(rows).toHaveLength(TOTAL);
        expect(
          rows.filter((r) => Number(r.created_at) > restartedAt[0]!).length,
          'every report was sent before the first restart',
        ).toBeGreaterThan(0);
        // None lost, none acked twice: every report delivered, one host row each (written in its
        // ack's transaction), its final attempt the one processed ...
        expect(rows.filter((r) => r.status !== 'delivered' || r.dead_at !== null)).toEqual([]);
        const processed = await host.selectFrom('delivery_processed').selectAll().execute();
        expect(processed).toHaveLength(TOTAL);
        const byId = new Map(processed.map((p) => [p.message_id, p]));
        expect(rows.filter((r) => byId.get(r.id)?.attempt !== Number(r.attempts))).toEqual([]);
        // ... by the coordinator of a run that was running: the inbox it sits in is its acker's.
        const handles = new Map(
          (await store.runs.listCoordinatorRuns()).map((r) => [r.id, r.coordinatorHandle] as const),
        );
        expect(rows.filter((r) => handles.get(byId.get(r.id)!.consumer) !== r.to_handle)).toEqual([]);
        const ackers = new Set(processed.map((p) => p.consumer));
        expect(ackers.size).toBeGreaterThan(1);
        for (const acker of ackers) expect(runs).toContain(acker);
        // The last run holds the adopted work, and the only running run is it.
        const last = runs[runs.length - 1]!;
        for (const t of work) expect((await store.tasks.requireTask(t.id)).coordinatorRunId).toBe(last);
        expect((await store.runs.listCoordinatorRuns({ status: 'running' })).map((r) => r.id)).toEqual([last]);
      },
    );

    it(
      'consumers SIGKILLed at random points while 5,000 messages are sent: each is processed and acked exactly once',
      { timeout: 900_000 },
      async () => {
        const { url, store, host } = await hostStore();
        const { coordinatorHandle: inbox } = await inboxOf(store);
        const SENDERS = 2;
        const PER_SENDER = 2_500;
        const TOTAL = SENDERS * PER_SENDER;
        const VISIBILITY_MS = 1_500;
        const senders = await Contenders.start(SENDERS, { url, ops: OPS, storeOptions: { poolSize: 2 } });
        const args = { inbox, total: TOTAL, visibilityMs: VISIBILITY_MS, crashOdds: 0.01, limit: 20 };
        const crashes: string[] = [];
        let done = false;
        // Three consumer slots; a consumer that dies is replaced by a new process.
        const slot = async () => {
          while (!done) {
            const one = await Contenders.start(1, { url, ops: OPS, storeOptions: { poolSize: 2 } });
            try {
              const outcome = await one.start(0, 'consumeAll', args);
              if (outcome.ok) done = true;
              else throw new Error(JSON.stringify(outcome.error));
            } catch (error) {
              if (!(error instanceof ContenderExitedError)) {
                done = true;
                throw error;
              }
              crashes.push('killed');
            } finally {
              await one.close();
            }
          }
        };
        try {
          const slots = [slot(), slot(), slot()];
          const sent = await senders.race('sendMany', (i) => ({
            from: `s${i}`,
            to: inbox,
            n: PER_SENDER,
            prefix: `s${i}`,
          }));
          expect(sent.every((o) => o.ok)).toBe(true);
          await Promise.all(slots);
        } finally {
          done = true;
          await senders.close();
        }
        expect(crashes.length).toBeGreaterThan(0);
        // Every message processed exactly once (the host row commits with the ack, keyed by id) ...
        const processed = await host.selectFrom('delivery_processed').selectAll().execute();
        expect(processed).toHaveLength(TOTAL);
        // ... and acked exactly once: every message delivered, its final attempt the one processed.
        const rows = await store.db
          .selectFrom('messages')
          .select(['id', 'status', 'attempts', 'dead_at'])
          .where('to_handle', '=', inbox)
          .execute();
        expect(rows).toHaveLength(TOTAL);
        expect(rows.filter((r) => r.status !== 'delivered' || r.dead_at !== null)).toEqual([]);
        const byId = new Map(processed.map((p) => [p.message_id, p.attempt]));
        expect(rows.filter((r) => byId.get(r.id) !== Number(r.attempts))).toEqual([]);
        // attempt > 1 exactly for the messages handed out again, and only after the earlier lease lapsed.
        const handouts = await host.selectFrom('delivery_handouts').selectAll().orderBy('attempt').execute();
        const seen = new Map<string, { attempt: number; visibleAgainAt: number }[]>();
        for (const h of handouts)
          (seen.get(h.message_id) ?? seen.set(h.message_id, []).get(h.message_id)!).push({
            attempt: h.attempt,
            visibleAgainAt: Number(h.visible_again_at),
          });
        let redelivered = 0;
        for (const [id, list] of seen) {
          expect(new Set(list.map((h) => h.attempt)).size, id).toBe(list.length);
          for (let k = 1; k < list.length; k++) {
            const leaseStart = list[k]!.visibleAgainAt - VISIBILITY_MS;
            expect(leaseStart, id).toBeGreaterThanOrEqual(list[k - 1]!.visibleAgainAt);
          }
          if (list.length > 1) redelivered++;
        }
        expect(redelivered).toBeGreaterThan(0);
        // Every hand-out is logged before a consumer can die, so the two counts are the same messages.
        expect(
          rows
            .filter((r) => Number(r.attempts) > 1)
            .map((r) => r.id)
            .sort(),
        ).toEqual(
          [...seen]
            .filter(([, list]) => list.length > 1)
            .map(([id]) => id)
            .sort(),
        );
      },
    );
  });
}
