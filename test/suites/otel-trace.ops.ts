/**
 * The producer side of the trace-propagation test, run in a child process: its own tracer
 * provider, context manager and W3C propagator (as the OpenTelemetry Node SDK registers them),
 * and a traced store that sends messages and dispatches tasks under one span.
 */
import { context, propagation } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import type { Store } from '../../src/index.js';
import { traceStore } from '../../src/otel/index.js';
import { defineOperations } from '../support/operations.js';

const exporter = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
let registered = false;

function register(): void {
  if (registered) return;
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  registered = true;
}

/**
 * Under one span `produce`: sends a message to each inbox, creates a dispatch of `taskId` on
 * `terminals[0]` and dispatches the run's next task to `terminals[1]`. Returns the trace id and
 * the span id of each producer call's span, by the id of what it made.
 */
export async function produceTraced(
  plain: Store,
  args: { inboxes: string[]; taskId: string; runId: string; terminals: [string, string] },
) {
  register();
  exporter.reset();
  const store = traceStore(plain, { tracer: provider.getTracer('producer') });
  const tracer = provider.getTracer('producer');
  const made = await tracer.startActiveSpan('produce', async (span) => {
    const messages = [];
    for (const to of args.inboxes)
      messages.push(
        await store.messages.sendMessage({
          from: 'producer',
          to,
          kind: 'job',
          payload: to,
          allowUnknownRecipient: true,
        }),
      );
    const created = await store.dispatches.createDispatch({ taskId: args.taskId, terminalHandle: args.terminals[0] });
    const next = await store.dispatches.dispatchNext({ runId: args.runId, terminalHandle: args.terminals[1] });
    span.end();
    return { traceId: span.spanContext().traceId, messages, dispatches: [created, next!] };
  });
  const spans = exporter.getFinishedSpans();
  const spanOf = (name: string, index: number) => spans.filter((s) => s.name === name)[index]!.spanContext().spanId;
  return {
    traceId: made.traceId,
    sendSpans: Object.fromEntries(made.messages.map((m, i) => [m.id, spanOf('taskfence messages.sendMessage', i)])),
    dispatchSpans: {
      [made.dispatches[0]!.id]: spanOf('taskfence dispatches.createDispatch', 0),
      [made.dispatches[1]!.id]: spanOf('taskfence dispatches.dispatchNext', 0),
    },
    messageIds: made.messages.map((m) => m.id),
    dispatchIds: made.dispatches.map((d) => d.id),
  };
}

export const ops = defineOperations(import.meta.url, { produceTraced });
