/**
 * Trace context through stored work: the producer's context goes into the message or dispatch
 * row (`traceContext`, 0097), and the consumer's spans continue that trace, across processes and
 * redeliveries. Per the messaging semantic conventions a receive span links to the creation
 * context of each message it hands out (a batch has many producers, and the receive span belongs
 * to the consumer's own trace); the consumer's processing span takes it as parent
 * (`producerContext`).
 */
import {
  ROOT_CONTEXT,
  context,
  isSpanContextValid,
  propagation,
  trace,
  type Attributes,
  type Context,
  type Link,
} from '@opentelemetry/api';
import type { TraceContext } from '../repositories/shared/trace-context.js';
import { extend } from '../objects.js';

/** The calls that store the caller's trace context: their first argument's `traceContext`. */
const PRODUCERS: Readonly<Record<string, readonly string[]>> = {
  messages: ['sendMessage'],
  dispatches: ['createDispatch', 'dispatchNext', 'dispatchNextBatch'],
};

/** The calls that hand stored work to a consumer: their spans link to its producers. */
const CONSUMERS: Readonly<Record<string, readonly string[]>> = {
  messages: ['receiveMessages', 'deliverPendingMessages', 'waitForMessages'],
  dispatches: [
    'getDispatch',
    'getActiveDispatchForTerminal',
    'completeDispatch',
    'endDispatch',
    'failActiveDispatchOnExit',
    'reclaimExpiredDispatches',
  ],
};

/** The span processors' default link limit: more links than this are dropped anyway. */
const MAX_LINKS = 128;

export const isProducer = (area: string, name: string) => PRODUCERS[area]?.includes(name) ?? false;
export const isConsumer = (area: string, name: string) => CONSUMERS[area]?.includes(name) ?? false;

/** The active context as a W3C carrier (`propagation.inject`), or null when it has nothing to carry. */
export function activeTraceContext(): TraceContext | null {
  const carrier: Record<string, string> = {};
  propagation.inject(context.active(), carrier);
  return Object.keys(carrier).length === 0 ? null : carrier;
}

/** A producer call's arguments with the active trace context in its input (unless the caller set one). */
export function withActiveTraceContext(args: unknown[]): unknown[] {
  const [input, ...rest] = args;
  if (input === null || typeof input !== 'object' || Array.isArray(input)) return args; // the call refuses it
  if ((input as { traceContext?: unknown }).traceContext !== undefined) return args;
  const traceContext = activeTraceContext();
  return traceContext === null ? args : [extend(input, { traceContext }), ...rest];
}

/** A record that may carry a stored trace context (a message, a dispatch). */
interface Traced {
  readonly id?: unknown;
  readonly traceContext?: TraceContext | null;
}

/**
 * The context to run a consumer's work for `record` in: `base` (default the active context) with
 * the producer's span as the remote parent, so the processing span continues the producer's
 * trace. `base` itself when the record carries no trace context.
 *
 * @example
 * import { context, trace } from '@opentelemetry/api';
 * import { producerContext } from 'taskfence/otel';
 * const dispatch = await store.dispatches.getActiveDispatchForTerminal(myHandle);
 * await context.with(producerContext(dispatch), () =>
 *   trace.getTracer('worker').startActiveSpan('work', async (span) => { await work(dispatch); span.end(); }),
 * );
 */
export function producerContext(record: Traced | null | undefined, base: Context = context.active()): Context {
  const carrier = record?.traceContext;
  if (carrier === null || carrier === undefined || typeof carrier !== 'object') return base;
  return propagation.extract(base, carrier);
}

/** The records a consumer call returned: a message or dispatch, a list of them, or results holding a `dispatch`. */
function recordsIn(result: unknown, out: Traced[] = []): Traced[] {
  if (result === null || typeof result !== 'object') return out;
  if (Array.isArray(result)) {
    for (const item of result) recordsIn(item, out);
    return out;
  }
  if ('traceContext' in result) out.push(result as Traced);
  else if ('dispatch' in result) recordsIn(result.dispatch, out);
  return out;
}

/** Links to the producers of the records in `result`, one per producer span (at most `MAX_LINKS`). */
export function producerLinks(area: string, result: unknown): Link[] {
  const links: Link[] = [];
  const seen = new Set<string>();
  for (const record of recordsIn(result)) {
    if (links.length >= MAX_LINKS) break;
    if (!record.traceContext) continue;
    const spanContext = trace.getSpanContext(producerContext(record, ROOT_CONTEXT));
    if (spanContext === undefined || !isSpanContextValid(spanContext)) continue;
    const key = `${spanContext.traceId}/${spanContext.spanId}`;
    if (seen.has(key)) continue;
    seen.add(key);
    const attributes: Attributes =
      typeof record.id === 'string'
        ? { [area === 'messages' ? 'messaging.message.id' : 'taskfence.dispatch.id']: record.id }
        : {};
    links.push({ context: spanContext, attributes });
  }
  return links;
}
