import type { MigrationDefinition } from './types.js';

/**
 * Trace context through stored work (issue 26): `dispatch_contexts.trace_context` and
 * `messages.trace_context` hold the producer's W3C trace context (`traceparent`, `tracestate`,
 * whatever the registered propagator writes) as a JSON object of strings, so the consumer's span
 * continues the producer's trace across processes and redeliveries. Null: sent or dispatched
 * outside a traced context. Nullable columns without defaults: online-safe on both dialects.
 */
export const migration0097: MigrationDefinition = {
  version: 97,
  name: 'trace_context',
  async up({ db }) {
    await db.schema.alterTable('dispatch_contexts').addColumn('trace_context', 'text').execute();
    await db.schema.alterTable('messages').addColumn('trace_context', 'text').execute();
  },
  async down({ db }) {
    await db.schema.alterTable('messages').dropColumn('trace_context').execute();
    await db.schema.alterTable('dispatch_contexts').dropColumn('trace_context').execute();
  },
};
