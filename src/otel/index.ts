/**
 * `taskfence/otel`: OpenTelemetry spans for a store's repository calls and transactions. A
 * separate entry point with `@opentelemetry/api` as an optional peer dependency, so
 * `import 'taskfence'` never loads either. `traceStore(store)` returns a copy of the store whose
 * every repository call (on the store and on the `tx` of `store.transaction`) runs in a span:
 * named `taskfence <area>.<call>`, with `db.system.name` (`sqlite` / `postgresql`),
 * `db.operation.name`, `messaging.*` for message calls, and `taskfence.outcome`, the outcome
 * each area declares for the call: `acquired`, `busy` (someone else holds it, or the state
 * refuses the request), `renewed`, `released`, `lost` (a renewal found the lease gone), `refused`
 * (a stale token or generation), `committed` (any other call), `unknown`
 * (`COMMIT_OUTCOME_UNKNOWN`) or `error`.
 * Nothing is traced on the store itself: code holding the plain store is unaffected.
 * Producer calls store their span's W3C trace context with the message or dispatch, and the
 * consumer's calls link to it (see `./propagation.ts`).
 */
import { SpanKind, SpanStatusCode, context, trace, type Attributes, type Span, type Tracer } from '@opentelemetry/api';
import { InvalidArgumentError, TaskfenceError } from '../errors.js';
import type { Store } from '../store.js';
import { isConsumer, isProducer, producerLinks, withActiveTraceContext } from './propagation.js';
import { declarationOf, OUTCOMES } from '../repositories/index.js';
import { committed, outcomeOfCode, type CallOutcome } from '../repositories/shared/outcomes.js';

/** Options of `traceStore`. */
export interface TraceStoreOptions {
  /** The tracer spans come from (default `trace.getTracer('taskfence')`). */
  readonly tracer?: Tracer;
}

/** The declared outcome of a call, the span's `taskfence.outcome`. */
export type { CallOutcome };

/** The areas a store exposes: the ones that declare their calls' outcomes. */
const AREAS = Object.keys(OUTCOMES);

/**
 * The outcome of call `area.name` that returned `result`, as its area declares it (the same
 * declarations the store's events come from: `OUTCOMES`, repositories/shared/outcomes.ts).
 */
export function outcomeOfResult(area: string, name: string, result: unknown): CallOutcome {
  return declarationOf(area, name).returned(result as never).outcome;
}

/** The outcome of call `area.name` that threw `error`, by the one table of error codes the events use too. */
export function outcomeOfError(area: string, name: string, error: unknown): CallOutcome {
  return outcomeOfCode(declarationOf(area, name), error instanceof TaskfenceError ? error.code : null);
}

/** The outcome of a `store.transaction` that threw: its callback's error, by the same table. */
function outcomeOfTransactionError(error: unknown): CallOutcome {
  return outcomeOfCode(committed, error instanceof TaskfenceError ? error.code : null);
}

/** messaging.* attributes of a message call (the inbox is its first argument, or `input.to` for a send). */
function messagingAttributes(name: string, args: readonly unknown[]): { kind: SpanKind; attributes: Attributes } {
  const first = args[0];
  const destination =
    name === 'sendMessage'
      ? (first as { to?: unknown } | undefined)?.to
      : typeof first === 'string'
        ? first
        : undefined;
  const type =
    name === 'sendMessage'
      ? 'send'
      : /^(receive|deliver|waitFor)/.test(name)
        ? 'receive'
        : /^(ack|release|requeue)/.test(name)
          ? 'settle'
          : undefined;
  return {
    kind: type === 'send' ? SpanKind.PRODUCER : type === 'receive' ? SpanKind.CONSUMER : SpanKind.CLIENT,
    attributes: {
      'messaging.system': 'taskfence',
      ...(typeof destination === 'string' ? { 'messaging.destination.name': destination } : {}),
      ...(type === undefined ? {} : { 'messaging.operation.type': type, 'messaging.operation.name': name }),
    },
  };
}

function end(span: Span, outcome: CallOutcome, error?: unknown): void {
  span.setAttribute('taskfence.outcome', outcome);
  if (error !== undefined) {
    if (error instanceof TaskfenceError) span.setAttribute('error.type', error.code);
    else span.setAttribute('error.type', error instanceof Error ? error.name : 'unknown');
    // busy and refused are answers the protocol declares, not failures of the call.
    if (outcome === 'error' || outcome === 'unknown') {
      span.setStatus({
        code: SpanStatusCode.ERROR,
        message: error instanceof Error ? error.message : 'non-Error thrown',
      });
      if (error instanceof Error) span.recordException(error);
    }
  }
  span.end();
}

/** Runs `call` in a span named `taskfence <operation>`. */
async function inSpan<T>(
  tracer: Tracer,
  system: string,
  area: string,
  name: string,
  args: readonly unknown[],
  call: () => Promise<T>,
): Promise<T> {
  const messaging = area === 'messages' ? messagingAttributes(name, args) : null;
  const span = tracer.startSpan(`taskfence ${area}.${name}`, {
    kind: messaging?.kind ?? SpanKind.CLIENT,
    attributes: { 'db.system.name': system, 'db.operation.name': `${area}.${name}`, ...messaging?.attributes },
  });
  try {
    const result = await context.with(trace.setSpan(context.active(), span), call);
    if (messaging && Array.isArray(result)) span.setAttribute('messaging.batch.message_count', result.length);
    if (isConsumer(area, name)) span.addLinks(producerLinks(area, result));
    end(span, outcomeOfResult(area, name, result));
    return result;
  } catch (error) {
    end(span, outcomeOfError(area, name, error), error);
    throw error;
  }
}

function traceArea<A extends object>(area: string, repository: A, tracer: Tracer, system: string): A {
  const traced: Record<string, unknown> = {};
  for (const [name, fn] of Object.entries(repository)) {
    traced[name] =
      typeof fn === 'function'
        ? (...args: unknown[]) =>
            inSpan(tracer, system, area, name, args, () =>
              // Inside the call's span: a producer stores that span's context with the work.
              Promise.resolve(
                (fn as (...a: unknown[]) => unknown).apply(
                  repository,
                  isProducer(area, name) ? withActiveTraceContext(args) : args,
                ),
              ),
            )
        : fn;
  }
  return Object.freeze(traced) as A;
}

function traceRepositories<R extends object>(target: R, tracer: Tracer, system: string): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const area of AREAS) {
    const repository = (target as Record<string, unknown>)[area];
    if (repository !== null && typeof repository === 'object') out[area] = traceArea(area, repository, tracer, system);
  }
  return out;
}

/**
 * A copy of `store` whose repository calls and transactions are traced. Calls on the copy are
 * the store's own calls (same connections, same guarantees); `store.transaction` on the view
 * runs in a `taskfence transaction` span, and the calls on its `tx` are that span's children
 * (with a context manager registered, as the OpenTelemetry Node SDK does).
 *
 * @example
 * import { traceStore } from 'taskfence/otel';
 * const store = traceStore(await openStore(process.env.DATABASE_URL));
 * await store.locks.claimWorkspaceLock('ws1', { holder: 'me' }); // a span: taskfence locks.claimWorkspaceLock
 */
export function traceStore(store: Store, options: TraceStoreOptions = {}): Store {
  if (store === null || typeof store !== 'object' || typeof store.transaction !== 'function')
    throw new InvalidArgumentError('store', 'must be a store from openStore');
  const tracer = options.tracer ?? trace.getTracer('taskfence');
  const system = store.dialect.kind === 'postgres' ? 'postgresql' : 'sqlite';
  const areas = traceRepositories(store, tracer, system);
  const transaction: Store['transaction'] = (fn, transactionOptions) => {
    const span = tracer.startSpan('taskfence transaction', {
      kind: SpanKind.CLIENT,
      attributes: { 'db.system.name': system, 'db.operation.name': 'transaction' },
    });
    const run = () =>
      store.transaction(
        (tx) => fn(Object.freeze({ ...tx, ...traceRepositories(tx, tracer, system) }) as typeof tx),
        transactionOptions,
      );
    return context.with(trace.setSpan(context.active(), span), run).then(
      (result) => {
        end(span, 'committed');
        return result;
      },
      (error: unknown) => {
        end(span, outcomeOfTransactionError(error), error);
        throw error;
      },
    );
  };
  // The store is a frozen object of closures: a copy with the traced areas is the store itself.
  return Object.freeze(Object.assign({}, store, areas, { transaction }));
}

export { registerStoreMetrics, type StoreMetrics, type StoreMetricsOptions } from './metrics.js';
export { producerContext } from './propagation.js';
