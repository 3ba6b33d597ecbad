/**
 * The trace context stored with a message or a dispatch (0097): the producer's W3C trace context
 * (`traceparent`, `tracestate`, and whatever else the registered propagator writes), as
 * `propagation.inject` hands it out. The core only stores and returns it; `taskfence/otel`'s
 * `traceStore` fills it from the active OpenTelemetry context and continues it on the consumer.
 */
import { InvalidArgumentError } from '../../errors.js';
import { MAX_ID_LENGTH } from '../validate.js';

/** A W3C trace-context carrier: `{ traceparent, tracestate? }` and any other propagator fields. */
export type TraceContext = Readonly<Record<string, string>>;

/** Most fields a stored trace context may have (traceparent, tracestate, baggage, …). */
const MAX_FIELDS = 16;
/** Longest value of one field (tracestate's limit is 512 characters; baggage's 8 192). */
const MAX_VALUE_LENGTH = 8_192;

/** Checks an optional `traceContext` input; its JSON text for the column, or null. */
export function optionalTraceContext(field: string, value: unknown): string | null {
  if (value === undefined || value === null) return null;
  if (typeof value !== 'object' || Array.isArray(value))
    throw new InvalidArgumentError(field, 'must be an object of strings (a W3C trace-context carrier)');
  const entries = Object.entries(value as Record<string, unknown>);
  if (entries.length === 0) return null;
  if (entries.length > MAX_FIELDS) throw new InvalidArgumentError(field, `must have at most ${MAX_FIELDS} fields`);
  for (const [key, v] of entries) {
    if (key.length === 0 || key.length > MAX_ID_LENGTH)
      throw new InvalidArgumentError(field, `field names must be 1 to ${MAX_ID_LENGTH} characters long`);
    if (typeof v !== 'string' || v.length > MAX_VALUE_LENGTH || v.includes('\u0000'))
      throw new InvalidArgumentError(`${field}.${key}`, `must be a string of at most ${MAX_VALUE_LENGTH} characters`);
  }
  return JSON.stringify(Object.fromEntries(entries));
}

/** The stored column as the public shape: a frozen carrier, or null. */
export function toTraceContext(text: string | null | undefined): TraceContext | null {
  if (text === null || text === undefined) return null;
  return Object.freeze(JSON.parse(text) as Record<string, string>);
}
