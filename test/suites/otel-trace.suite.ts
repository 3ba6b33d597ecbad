/**
 * Trace context through stored work (issue 26), across two processes on one database: a child
 * process sends messages and dispatches tasks under a span (`otel-trace.ops.ts`); this process
 * receives and delivers the messages (a redelivery included) and reads and completes the
 * dispatches through its own traced store. Each consumer span links to the producer call's span
 * (same trace id, same span id), and the worker's processing span, started in
 * `producerContext(record)`, is that span's child in the producer's trace.
 */
import { afterAll, beforeAll, beforeEach, expect, it } from 'vitest';
import { context, propagation, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { randomBytes } from 'node:crypto';
import type { Store } from '../../src/index.js';
import { producerContext, traceStore } from '../../src/otel/index.js';
import type { DialectFixture } from '../support/fixtures.js';
import { Contenders } from '../support/race.js';
import { ops } from './otel-trace.ops.js';

export function defineOtelTraceSuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  let plain: Store;
  let store: Store;
  let producer: Contenders<typeof ops>;
  let company: string;
  const exporter = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  const manager = new AsyncLocalStorageContextManager();
  const ns = `t${randomBytes(3).toString('hex')}`;

  beforeAll(async () => {
    context.setGlobalContextManager(manager.enable());
    propagation.setGlobalPropagator(new W3CTraceContextPropagator());
    fx = makeFixture();
    const url = await fx.freshUrl();
    plain = await fx.open(url);
    await plain.migrate();
    store = traceStore(plain, { tracer: provider.getTracer('consumer') });
    company = (await plain.org.createCompany({ name: 'acme' })).id;
    producer = await Contenders.start(1, { url, ops });
  }, 120_000);
  afterAll(async () => {
    await producer?.close();
    manager.disable();
    context.disable();
    propagation.disable();
    await fx.cleanup();
  });
  beforeEach(() => exporter.reset());
  const named = (name: string) => exporter.getFinishedSpans().filter((s) => s.name === name);
  const linksOf = (name: string, index = 0) =>
    named(name)[index]!.links.map((l) => ({ traceId: l.context.traceId, spanId: l.context.spanId }));

  it('a message and a dispatch made under a span in another process carry its trace to the consumer, across a redelivery', async () => {
    const targetKey = `worktree:${ns}`;
    const run = await plain.runs.startCoordinatorRun({ targetKey });
    const task = () =>
      plain.tasks.createTask({ companyId: company, title: 't', targetKey, requiresFilesystem: false, status: 'ready' });
    const [first] = [await task(), await task()];
    const inboxes = [`${ns}-leased`, `${ns}-once`];
    const terminals: [string, string] = [`${ns}-term-1`, `${ns}-term-2`];
    const produced = await producer.run(0, 'produceTraced', { inboxes, taskId: first.id, runId: run.id, terminals });
    if (!produced.ok) throw new Error(`the producer failed: ${JSON.stringify(produced.error)}`);
    const { traceId, sendSpans, dispatchSpans, messageIds, dispatchIds } = produced.value;
    const [leasedId, onceId] = messageIds as [string, string];

    // Received under a short lease, not acked, received again: both receive spans link to the send.
    const [got] = await store.messages.receiveMessages(inboxes[0]!, { visibilityMs: 50 });
    expect(got!.id).toBe(leasedId);
    expect(got!.traceContext?.traceparent).toContain(traceId);
    await new Promise((resolve) => setTimeout(resolve, 120));
    const [again] = await store.messages.receiveMessages(inboxes[0]!, { visibilityMs: 60_000 });
    expect([again!.id, again!.attempt]).toEqual([leasedId, 2]);
    expect(again!.traceContext).toEqual(got!.traceContext);
    const sent = { traceId, spanId: sendSpans[leasedId] };
    expect(linksOf('taskfence messages.receiveMessages', 0)).toEqual([sent]);
    expect(linksOf('taskfence messages.receiveMessages', 1)).toEqual([sent]);
    expect(named('taskfence messages.receiveMessages')[0]!.links[0]!.attributes).toEqual({
      'messaging.message.id': leasedId,
    });

    // At most once (deliverPendingMessages): the same.
    const [delivered] = await store.messages.deliverPendingMessages(inboxes[1]!);
    expect(delivered!.id).toBe(onceId);
    expect(linksOf('taskfence messages.deliverPendingMessages')).toEqual([{ traceId, spanId: sendSpans[onceId] }]);

    // The worker's reads and reports on its dispatch link to the dispatching call.
    const [created, next] = dispatchIds as [string, string];
    const mine = await store.dispatches.getActiveDispatchForTerminal(terminals[0]);
    expect(mine!.id).toBe(created);
    expect(linksOf('taskfence dispatches.getActiveDispatchForTerminal')).toEqual([
      { traceId, spanId: dispatchSpans[created] },
    ]);
    const other = await store.dispatches.getActiveDispatchForTerminal(terminals[1]);
    expect(other!.id).toBe(next);
    expect(linksOf('taskfence dispatches.getActiveDispatchForTerminal', 1)).toEqual([
      { traceId, spanId: dispatchSpans[next] },
    ]);

    // The processing span continues the producer's trace: a child of the createDispatch span.
    await context.with(producerContext(mine), async () => {
      const work = provider.getTracer('worker').startSpan('work');
      await store.dispatches.completeDispatch(mine!.id, { lease: mine!.lease! });
      work.end();
    });
    const [work] = named('work');
    expect(work!.spanContext().traceId).toBe(traceId);
    expect(work!.parentSpanContext?.spanId).toBe(dispatchSpans[created]);
    const complete = named('taskfence dispatches.completeDispatch')[0]!;
    expect(complete.spanContext().traceId).toBe(traceId);
    expect(linksOf('taskfence dispatches.completeDispatch')).toEqual([{ traceId, spanId: dispatchSpans[created] }]);

    // Outside a traced store nothing is stored; a malformed trace context is refused.
    const untraced = await plain.messages.sendMessage({
      from: 'a',
      to: inboxes[1]!,
      kind: 'k',
      allowUnknownRecipient: true,
    });
    expect(untraced.traceContext).toBeNull();
    await expect(
      plain.messages.sendMessage({
        from: 'a',
        to: 'b',
        kind: 'k',
        allowUnknownRecipient: true,
        traceContext: 'x' as never,
      }),
    ).rejects.toMatchObject({ code: 'INVALID_ARGUMENT', field: 'traceContext' });
    await expect(
      plain.dispatches.dispatchNext({ runId: run.id, terminalHandle: 'z', traceContext: { traceparent: 1 } as never }),
    ).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });
    expect(trace.getActiveSpan()).toBeUndefined();
  });
}
