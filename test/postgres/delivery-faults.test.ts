import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Store } from '../../src/index.js';
import { postgresFixture } from '../support/dialects.js';
import { FaultProxy } from '../support/tcp-proxy.js';

/*
 * Unknown outcomes for the delivery calls (issue 23): a TCP proxy lets COMMIT reach the server
 * and cuts the connection before its answer, so the caller gets COMMIT_OUTCOME_UNKNOWN although
 * the effect committed. The retry with the same id or key must return the first outcome, and the
 * database must hold one effect. (Mutant "key-outside-transaction": the key written in its own
 * transaction after the effect's; the consumeResolution retry then gets
 * RESOLUTION_ALREADY_CONSUMED and this test fails.)
 */

const fx = postgresFixture();
afterAll(() => fx.cleanup());

const codeOf = (p: Promise<unknown>) =>
  p.then(
    () => 'ok',
    (e: { code?: string }) => e.code ?? 'no code',
  );

describe('connections cut right after COMMIT', () => {
  let proxy: FaultProxy;
  let url: string;
  let direct: Store;
  beforeAll(async () => {
    const directUrl = await fx.freshUrl();
    const u = new URL(directUrl);
    proxy = await FaultProxy.start({ host: u.hostname, port: Number(u.port || 5432) });
    url = proxy.urlThrough(directUrl);
    direct = await fx.open(directUrl);
    await direct.migrate();
  });
  afterAll(() => proxy.close());

  it('sendMessage with an id, resolveGate and consumeResolution with keys, and an ack with a key: the retry returns the first outcome, once', async () => {
    const store = await fx.open(url, { writeDeadlineMs: 10_000 });
    const run = await store.runs.startCoordinatorRun({ targetKey: 'worktree:faults' });
    const inbox = run.coordinatorHandle;

    const input = { id: 'm-commit', from: 'w', to: inbox, kind: 'done', payload: { n: 1 } };
    proxy.cutAfterNextCommit();
    expect(await codeOf(store.messages.sendMessage(input))).toBe('COMMIT_OUTCOME_UNKNOWN');
    const sent = await store.messages.sendMessage(input);
    expect(sent).toMatchObject({ id: 'm-commit', status: 'pending' });
    expect(await direct.db.selectFrom('messages').select('id').where('to_handle', '=', inbox).execute()).toHaveLength(
      1,
    );

    const gate = await store.gates.openGate({ question: 'go?', runId: run.id });
    proxy.cutAfterNextCommit();
    expect(await codeOf(store.gates.resolveGate(gate.id, 'yes', { idempotencyKey: 'resolve-1' }))).toBe(
      'COMMIT_OUTCOME_UNKNOWN',
    );
    const resolved = await store.gates.resolveGate(gate.id, 'yes', { idempotencyKey: 'resolve-1' });
    expect(resolved).toMatchObject({ status: 'resolved', resolution: 'yes' });

    proxy.cutAfterNextCommit();
    expect(
      await codeOf(store.gates.consumeResolution(gate.id, { consumer: run.id, idempotencyKey: 'consume-1' })),
    ).toBe('COMMIT_OUTCOME_UNKNOWN');
    const taken = await store.gates.consumeResolution(gate.id, { consumer: run.id, idempotencyKey: 'consume-1' });
    expect(taken).toMatchObject({ gateId: gate.id, consumer: run.id, resolution: 'yes' });
    // Without the key, the same consumer is refused: the key is what makes its own retry succeed.
    expect(await codeOf(store.gates.consumeResolution(gate.id, { consumer: run.id }))).toBe(
      'RESOLUTION_ALREADY_CONSUMED',
    );

    const [received] = await store.messages.receiveMessages(inbox, { visibilityMs: 60_000 });
    proxy.cutAfterNextCommit();
    expect(await codeOf(store.messages.ackMessages(inbox, [received!.receipt], { idempotencyKey: 'ack-1' }))).toBe(
      'COMMIT_OUTCOME_UNKNOWN',
    );
    expect(await store.messages.ackMessages(inbox, [received!.receipt], { idempotencyKey: 'ack-1' })).toEqual({
      acked: [received!.receipt],
      refused: [],
    });
    // An ack is idempotent by its receipt even without a key.
    expect((await store.messages.ackMessages(inbox, [received!.receipt])).acked).toEqual([received!.receipt]);
    expect(proxy.commitCuts).toBe(4);
    const row = await direct.db
      .selectFrom('messages')
      .selectAll()
      .where('id', '=', 'm-commit')
      .executeTakeFirstOrThrow();
    expect([row.status, Number(row.attempts)]).toEqual(['delivered', 1]);
  });
});
