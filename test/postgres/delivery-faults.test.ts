import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Store } from '../../src/index.js';
import { postgresFixture } from '../support/dialects.js';
import { FaultProxy } from '../support/tcp-proxy.js';

/*
 * Unknown outcomes for the delivery calls (issue 23): a TCP proxy lets COMMIT reach the server
 * and cuts the connection before its answer, so the caller gets COMMIT_OUTCOME_UNKNOWN although
 * the effect committed. The retry with the same id or key must return the first outcome, and the
 * database must hold one effect, and each key must have been committed with its effect (its
 * stored outcome is what the retry returns). (Mutant "key-outside-transaction": the key written
 * in its own transaction after the effect's; the cut then loses the key, the consumeResolution
 * retry gets RESOLUTION_ALREADY_CONSUMED, the claim retry `busy`, the dispatchNext retry
 * TERMINAL_BUSY, and the resolveGate and ack cases find no stored key: every case fails.)
 */

const fx = postgresFixture();
afterAll(() => fx.cleanup());

/** The outcome stored under a key, as committed (read past the proxy); null when no key was committed. */
async function storedOutcome(direct: Store, operation: string, key: string): Promise<unknown> {
  const row = await direct.db
    .selectFrom('idempotency_keys')
    .select('outcome')
    .where('operation', '=', operation)
    .where('key', '=', key)
    .executeTakeFirst();
  return row ? (JSON.parse(row.outcome) as unknown) : null;
}

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
    // The key committed with the resolution: the retry returns that stored outcome.
    const storedResolution = await storedOutcome(direct, 'gates.resolveGate', 'resolve-1');
    const resolved = await store.gates.resolveGate(gate.id, 'yes', { idempotencyKey: 'resolve-1' });
    expect(resolved).toMatchObject({ status: 'resolved', resolution: 'yes' });
    expect(storedResolution).toEqual({ ok: true, value: JSON.parse(JSON.stringify(resolved)) as unknown });

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
    const storedAck = await storedOutcome(direct, 'messages.ackMessages', 'ack-1');
    expect(await store.messages.ackMessages(inbox, [received!.receipt], { idempotencyKey: 'ack-1' })).toEqual({
      acked: [received!.receipt],
      refused: [],
    });
    expect(storedAck).toEqual({ ok: true, value: { acked: [received!.receipt], refused: [] } });
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

  it('a task-lease claim and dispatchNext with keys: the retry returns the same token and the same dispatch, and one effect is stored', async () => {
    const store = await fx.open(url, { writeDeadlineMs: 10_000 });
    const company = await store.org.createCompany({ name: 'Faults' });
    const run = await store.runs.startCoordinatorRun({ targetKey: 'worktree:faults-keys' });
    const task = (title: string) =>
      store.tasks.createTask({
        companyId: company.id,
        title,
        requiresFilesystem: false,
        targetKey: 'worktree:faults-keys',
        status: 'ready',
      });
    const leased = await task('leased');
    await task('dispatched');

    proxy.cutAfterNextCommit();
    const claimInput = { holder: 'worker-1', ttlMs: 60_000, idempotencyKey: 'claim-1' };
    expect(await codeOf(store.locks.claimTaskLease(leased.id, claimInput))).toBe('COMMIT_OUTCOME_UNKNOWN');
    const claim = await store.locks.claimTaskLease(leased.id, claimInput);
    // Without the key the retry would be `busy` (the first claim holds the lease).
    expect(claim).toMatchObject({ status: 'acquired', lease: { token: 1, holder: 'worker-1' } });
    const leaseRow = await direct.db
      .selectFrom('task_leases')
      .selectAll()
      .where('task_id', '=', leased.id)
      .executeTakeFirstOrThrow();
    expect([Number(leaseRow.token), leaseRow.holder]).toEqual([1, 'worker-1']);

    proxy.cutAfterNextCommit();
    const nextInput = { runId: run.id, terminalHandle: 'term-f', idempotencyKey: 'next-1' };
    expect(await codeOf(store.dispatches.dispatchNext(nextInput))).toBe('COMMIT_OUTCOME_UNKNOWN');
    const dispatch = await store.dispatches.dispatchNext(nextInput);
    // Without the key the retry would be TERMINAL_BUSY (the first dispatch holds the terminal).
    expect(dispatch).toMatchObject({ terminalHandle: 'term-f', status: 'active' });
    const rows = await direct.db
      .selectFrom('dispatch_contexts')
      .select(['id', 'status'])
      .where('coordinator_run_id', '=', run.id)
      .execute();
    expect(rows).toEqual([{ id: dispatch!.id, status: 'active' }]);
    expect(await codeOf(store.dispatches.dispatchNext({ runId: run.id, terminalHandle: 'term-f' }))).toBe(
      'TERMINAL_BUSY',
    );
  });
});
