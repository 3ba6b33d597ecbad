// taskfence/otel from the installed package (with @opentelemetry/api installed, no SDK): a traced
// store works on SQLite, a send made under the traced store and received again keeps its (empty,
// no propagator registered) trace context as null, and the metrics register and unregister.
import assert from 'node:assert/strict';
import { metrics } from '@opentelemetry/api';
import { openStore } from 'taskfence';
import { producerContext, registerStoreMetrics, traceStore } from 'taskfence/otel';

const store = traceStore(await openStore(process.argv[2]));
try {
  await store.migrate();
  const sent = await store.messages.sendMessage({ from: 'a', to: 'b', kind: 'k', allowUnknownRecipient: true });
  const [got] = await store.messages.receiveMessages('b');
  assert.equal(got.id, sent.id);
  assert.equal(got.traceContext, null);
  assert.ok(producerContext(got));
  const registration = registerStoreMetrics(store, { meter: metrics.getMeter('smoke') });
  registration.unregister();
  console.log('taskfence/otel: ok');
} finally {
  await store.close();
}
