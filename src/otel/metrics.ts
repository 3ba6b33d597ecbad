/**
 * Metrics of a store for OpenTelemetry: the `store.stats()` counters as observable counters,
 * and gauges read from one `inspectStore` snapshot per collection: inbox depth and dead messages
 * per inbox, per lease kind the leases held and the age of the oldest, and the ready queue.
 */
import type { Attributes, BatchObservableResult, Meter, ObservableGauge } from '@opentelemetry/api';
import { metrics } from '@opentelemetry/api';
import { InvalidArgumentError } from '../errors.js';
import { inspectStore } from '../inspect/index.js';
import type { Store } from '../store.js';

/** Options of `registerStoreMetrics`. */
export interface StoreMetricsOptions {
  /** The meter instruments come from (default `metrics.getMeter('taskfence')`). */
  readonly meter?: Meter;
  /**
   * Read the gauges (one read transaction of `inspectStore` per collection; default true). Off,
   * only the `stats()` counters are reported, which cost nothing to read.
   */
  readonly gauges?: boolean;
}

/** Stops reporting (removes the callbacks). */
export interface StoreMetrics {
  unregister(): void;
}

/**
 * Reports `store`'s counters (`taskfence.transactions`, `taskfence.transaction.retries` by
 * `taskfence.retry.kind`, `taskfence.conflicts`, `taskfence.refusals`, `taskfence.leases.lost`,
 * `taskfence.runs.reconciled`, `taskfence.connections.lost`) and gauges
 * (`taskfence.inbox.depth` and `taskfence.inbox.dead` by `messaging.destination.name`;
 * `taskfence.leases.held` and `taskfence.lease.oldest_age` in ms by `taskfence.lease.kind`:
 * `workspace_lock`, `task_lease`, `semaphore`, and `path_lease` (held only: a path lease records
 * no grant time); `taskfence.ready_queue.depth` by `taskfence.queue.state`: `ready`,
 * `blocked_by_dependency`, `blocked_by_gate`, where a task behind both counts in both) to the
 * meter at each collection.
 *
 * @example
 * import { registerStoreMetrics } from 'taskfence/otel';
 * registerStoreMetrics(store); // with a MeterProvider and a Prometheus or OTLP reader registered
 */
export function registerStoreMetrics(store: Store, options: StoreMetricsOptions = {}): StoreMetrics {
  if (store === null || typeof store !== 'object' || typeof store.stats !== 'function')
    throw new InvalidArgumentError('store', 'must be a store from openStore');
  const meter = options.meter ?? metrics.getMeter('taskfence');
  const counter = (name: string, description: string) =>
    meter.createObservableCounter(name, { description, unit: '{event}' });
  const counters = {
    transactions: counter('taskfence.transactions', 'write and read transactions attempted'),
    retries: counter('taskfence.transaction.retries', 'transactions retried after a transient failure'),
    conflicts: counter('taskfence.conflicts', 'claims, starts and transfers lost to someone else'),
    refusals: counter('taskfence.refusals', 'stale tokens, generations and claims refused'),
    leasesLost: counter('taskfence.leases.lost', 'renewals that found the lease gone'),
    runsReconciled: counter('taskfence.runs.reconciled', 'stale runs failed by reconcileStaleRuns'),
    connectionsLost: counter('taskfence.connections.lost', 'idle pooled connections that lost their server'),
  };
  const gauges = options.gauges ?? true;
  const gauge = (name: string, description: string, unit: string): ObservableGauge =>
    meter.createObservableGauge(name, { description, unit });
  const depth = gauge('taskfence.inbox.depth', 'pending messages (not dead) per inbox', '{message}');
  const dead = gauge('taskfence.inbox.dead', 'dead-lettered messages per inbox', '{message}');
  const held = gauge('taskfence.leases.held', 'leases held, by kind', '{lease}');
  const oldest = gauge('taskfence.lease.oldest_age', 'age of the oldest held lease, by kind', 'ms');
  const queue = gauge('taskfence.ready_queue.depth', 'unfinished tasks: ready, or blocked and why', '{task}');

  const callback = async (result: BatchObservableResult) => {
    const s = store.stats();
    result.observe(counters.transactions, s.transactions);
    for (const [kind, n] of Object.entries(s.retries))
      result.observe(counters.retries, n, { 'taskfence.retry.kind': kind });
    result.observe(counters.conflicts, s.conflicts);
    result.observe(counters.refusals, s.refusals);
    result.observe(counters.leasesLost, s.leasesLost);
    result.observe(counters.runsReconciled, s.runsReconciled);
    result.observe(counters.connectionsLost, s.connectionsLost);
    if (!gauges) return;
    const snapshot = await inspectStore(store, { limit: 10_000 });
    for (const inbox of snapshot.inbox.inboxes.items) {
      const at: Attributes = { 'messaging.destination.name': inbox.handle };
      result.observe(depth, inbox.depth, at);
      result.observe(dead, inbox.dead, at);
    }
    const now = snapshot.locks.at;
    const kinds: [string, number, (number | null)[]][] = [
      ['workspace_lock', snapshot.locks.workspaces.total, snapshot.locks.workspaces.items.map((l) => l.acquiredAt)],
      ['task_lease', snapshot.locks.tasks.total, snapshot.locks.tasks.items.map((l) => l.acquiredAt)],
      [
        'semaphore',
        snapshot.semaphores.semaphores.items.reduce((n, m) => n + m.held, 0),
        snapshot.semaphores.semaphores.items.flatMap((m) => m.slots.map((slot) => slot.acquiredAt)),
      ],
    ];
    for (const [kind, count, acquired] of kinds) {
      const at: Attributes = { 'taskfence.lease.kind': kind };
      result.observe(held, count, at);
      const known = acquired.filter((a): a is number => a !== null);
      result.observe(oldest, known.length === 0 ? 0 : now - Math.min(...known), at);
    }
    // Path leases record no grant time, so they have a count but no oldest age.
    const pathLeases = snapshot.paths.workspaces.items.reduce((n, w) => n + w.live, 0);
    result.observe(held, pathLeases, { 'taskfence.lease.kind': 'path_lease' });
    const q = snapshot.readyQueue;
    for (const [state, n] of [
      ['ready', q.ready.total],
      ['blocked_by_dependency', q.blockedByDependency.total],
      ['blocked_by_gate', q.blockedByGate.total],
    ] as const)
      result.observe(queue, n, { 'taskfence.queue.state': state });
  };
  const observables = [...Object.values(counters), ...(gauges ? [depth, dead, held, oldest, queue] : [])];
  meter.addBatchObservableCallback(callback, observables);
  return { unregister: () => meter.removeBatchObservableCallback(callback, observables) };
}
