/**
 * `taskfence/otel`: spans for repository calls and transactions, recorded with the OpenTelemetry
 * SDK's in-memory exporter, on both dialects: names, `db.*` and `messaging.*` attributes, the
 * declared outcome of each call (acquired, busy, renewed, released, lost, refused, committed, error), and the calls on a
 * transaction's `tx` as children of its span; the `stats()` counters and the inbox and lease
 * gauges collected by a metric reader.
 */
import { afterAll, beforeAll, beforeEach, expect, it } from 'vitest';
import { context, SpanKind } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { randomBytes } from 'node:crypto';
import type { Store } from '../../src/index.js';
import { MeterProvider, MetricReader, type GaugeMetricData, type SumMetricData } from '@opentelemetry/sdk-metrics';
import { registerStoreMetrics, traceStore } from '../../src/otel/index.js';
import type { DialectFixture } from '../support/fixtures.js';

export function defineOtelSuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  let plain: Store;
  let store: Store;
  let ns: string;
  const exporter = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  const manager = new AsyncLocalStorageContextManager();

  beforeAll(async () => {
    context.setGlobalContextManager(manager.enable());
    fx = makeFixture();
    plain = await fx.freshStore();
    store = traceStore(plain, { tracer: provider.getTracer('test') });
    ns = `o${randomBytes(3).toString('hex')}`;
    const company = await plain.org.createCompany({ id: `${ns}-co`, name: 'Acme' });
    await plain.org.createWorkspace({ id: `${ns}-ws`, companyId: company.id, name: 'repo' });
  });
  afterAll(async () => {
    manager.disable();
    context.disable();
    await fx.cleanup();
  });
  beforeEach(() => exporter.reset());
  const spans = () => exporter.getFinishedSpans();
  const named = (name: string) => spans().filter((s) => s.name === name);

  it('a span per call, named after the call, with db.* attributes and the outcome: acquired, busy, released, lost, refused', async () => {
    const system = plain.dialect.kind === 'postgres' ? 'postgresql' : 'sqlite';
    const ws = `${ns}-ws`;
    const mine = await store.locks.claimWorkspaceLock(ws, { holder: 'me', runId: 'r1', ttlMs: 60_000 });
    expect(mine.status).toBe('acquired');
    const theirs = await store.locks.claimWorkspaceLock(ws, { holder: 'them', runId: 'r2', ttlMs: 60_000 });
    expect(theirs.status).toBe('busy');
    if (mine.status !== 'acquired') throw new Error('unreachable');
    await store.locks.releaseWorkspaceLock(mine.lease);
    // Someone else holds it now, with the next token: the old lease is stale.
    expect((await plain.locks.claimWorkspaceLock(ws, { holder: 'them', runId: 'r2', ttlMs: 60_000 })).status).toBe(
      'acquired',
    );
    await expect(store.locks.renewWorkspaceLock(mine.lease, { ttlMs: 1_000 })).rejects.toMatchObject({
      code: 'STALE_WORKSPACE_LOCK',
    });
    // A repeat release is a no-op (the release rule); a token never granted is refused.
    await expect(
      store.locks.releaseWorkspaceLock({ ...mine.lease, token: mine.lease.token + 10 }),
    ).rejects.toMatchObject({ code: 'STALE_WORKSPACE_LOCK' });
    await expect(store.tasks.getTask('')).rejects.toMatchObject({ code: 'INVALID_ARGUMENT' });

    const claims = named('taskfence locks.claimWorkspaceLock');
    expect(claims.map((s) => s.attributes['taskfence.outcome'])).toEqual(['acquired', 'busy']);
    expect(claims[0]!.attributes).toMatchObject({
      'db.system.name': system,
      'db.operation.name': 'locks.claimWorkspaceLock',
    });
    expect(claims[0]!.kind).toBe(SpanKind.CLIENT);
    expect(named('taskfence locks.renewWorkspaceLock')[0]!.attributes).toMatchObject({
      'taskfence.outcome': 'lost',
      'error.type': 'STALE_WORKSPACE_LOCK',
    });
    const releases = named('taskfence locks.releaseWorkspaceLock');
    expect(releases.map((s) => s.attributes['taskfence.outcome'])).toEqual(['released', 'refused']);
    // A declared refusal is an answer, not a failed span; a bad argument is.
    expect(releases[1]!.status.code).toBe(0);
    const bad = named('taskfence tasks.getTask')[0]!;
    expect(bad.attributes['taskfence.outcome']).toBe('error');
    expect(bad.status.code).toBe(2);
    // Hostile arguments are InvalidArgumentErrors, never raw TypeErrors.
    for (const bad of [null, undefined, 42, {}, { transaction: 'no' }])
      for (const call of [() => traceStore(bad as never), () => registerStoreMetrics(bad as never)])
        expect(call).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT' }));
    // The plain store is untouched: its calls make no spans.
    await plain.locks.getWorkspaceLock(ws);
    expect(named('taskfence locks.getWorkspaceLock')).toEqual([]);
  });

  it("the outcome is the one each area declares, from the same code table as the events: dispatchRun's contention, a task not dispatchable, renewals", async () => {
    const ws = await plain.org.createWorkspace({ companyId: `${ns}-co`, name: 'outcomes' });
    const agent = await plain.org.createAgent({
      companyId: `${ns}-co`,
      name: 'dev',
      role: 'engineer',
      workspaceId: ws.id,
    });
    const task = () =>
      plain.tasks.createTask({
        companyId: `${ns}-co`,
        title: 'code',
        assigneeAgentId: agent.id,
        requiresFilesystem: true,
      });
    const [t1, t2] = [await task(), await task()];
    await store.scheduler.dispatchRun({ taskId: t1.id, agentId: agent.id, runId: `${ns}-r1`, mode: 'heartbeat' });
    await store.scheduler.dispatchRun({ taskId: t2.id, agentId: agent.id, runId: `${ns}-r2`, mode: 'heartbeat' });
    const done = await plain.tasks.createTask({
      companyId: `${ns}-co`,
      title: 'over',
      requiresFilesystem: false,
      status: 'ready',
    });
    await plain.tasks.transitionTask(done.id, { from: 'ready', to: 'cancelled' });
    await expect(
      store.scheduler.dispatchRun({ taskId: done.id, agentId: agent.id, runId: `${ns}-r3`, mode: 'heartbeat' }),
    ).rejects.toMatchObject({ code: 'TASK_NOT_DISPATCHABLE' });
    const runs = named('taskfence scheduler.dispatchRun');
    expect(runs.map((s) => s.attributes['taskfence.outcome'])).toEqual(['acquired', 'busy', 'busy']);
    // A refusal by the state is an answer, not a failed span.
    expect(runs[2]!.status.code).toBe(0);
    expect(runs[2]!.attributes['error.type']).toBe('TASK_NOT_DISPATCHABLE');

    const slot = await store.semaphores.acquire(`${ns}-sem`, { holder: 'a', limit: 1, ttlMs: 60_000 });
    if (slot.status !== 'acquired') throw new Error('not acquired');
    await store.semaphores.renew(slot.lease, { ttlMs: 60_000 });
    await store.semaphores.release(slot.lease);
    await expect(store.semaphores.renew(slot.lease)).rejects.toMatchObject({ code: 'SEMAPHORE_LEASE_LOST' });
    expect(named('taskfence semaphores.acquire')[0]!.attributes['taskfence.outcome']).toBe('acquired');
    expect(named('taskfence semaphores.renew').map((s) => s.attributes['taskfence.outcome'])).toEqual([
      'renewed',
      'lost',
    ]);
    expect(named('taskfence semaphores.release')[0]!.attributes['taskfence.outcome']).toBe('released');
    await store.semaphores.listHolders(`${ns}-sem`);
    expect(named('taskfence semaphores.listHolders')[0]!.attributes['taskfence.outcome']).toBe('committed');
  });

  it('message calls carry messaging.* attributes: send is a producer span, receive a consumer span with the batch size', async () => {
    const inbox = `${ns}-inbox`;
    for (const n of [1, 2])
      await store.messages.sendMessage({
        from: 'me',
        to: inbox,
        kind: 'job',
        payload: { n },
        allowUnknownRecipient: true,
      });
    const got = await store.messages.receiveMessages(inbox, { limit: 10 });
    expect(got).toHaveLength(2);
    await store.messages.ackMessages(
      inbox,
      got.map((m) => m.receipt),
    );
    const send = named('taskfence messages.sendMessage');
    expect(send).toHaveLength(2);
    expect(send[0]!.kind).toBe(SpanKind.PRODUCER);
    expect(send[0]!.attributes).toMatchObject({
      'messaging.system': 'taskfence',
      'messaging.destination.name': inbox,
      'messaging.operation.type': 'send',
    });
    const receive = named('taskfence messages.receiveMessages')[0]!;
    expect(receive.kind).toBe(SpanKind.CONSUMER);
    expect(receive.attributes).toMatchObject({
      'messaging.destination.name': inbox,
      'messaging.operation.type': 'receive',
      'messaging.batch.message_count': 2,
    });
    expect(named('taskfence messages.ackMessages')[0]!.attributes['messaging.operation.type']).toBe('settle');
  });

  it('a transaction is a span and the calls on its tx are its children; a rollback ends it as an error', async () => {
    await store.transaction(async (tx) => {
      await tx.locks.claimWorkspaceLock(`${ns}-ws`, { holder: 'tx', runId: 'r3', ttlMs: 60_000 });
      await tx.locks.getWorkspaceLock(`${ns}-ws`);
    });
    const [transaction] = named('taskfence transaction');
    expect(transaction!.attributes['taskfence.outcome']).toBe('committed');
    const children = spans().filter((s) => s.parentSpanContext?.spanId === transaction!.spanContext().spanId);
    expect(children.map((s) => s.name).sort()).toEqual([
      'taskfence locks.claimWorkspaceLock',
      'taskfence locks.getWorkspaceLock',
    ]);

    exporter.reset();
    await expect(
      store.transaction(async (tx) => {
        await tx.locks.getWorkspaceLock(`${ns}-ws`);
        throw new Error('host code failed');
      }),
    ).rejects.toThrow('host code failed');
    expect(named('taskfence transaction')[0]!.attributes['taskfence.outcome']).toBe('error');
    expect(named('taskfence transaction')[0]!.status.code).toBe(2);
  });

  it('metrics: the stats() counters, and inbox depth, dead messages, leases held (path leases too), the oldest lease age and the ready queue as gauges', async () => {
    class Reader extends MetricReader {
      protected onForceFlush = () => Promise.resolve();
      protected onShutdown = () => Promise.resolve();
    }
    const reader = new Reader();
    const meterProvider = new MeterProvider({ readers: [reader] });
    const registration = registerStoreMetrics(plain, { meter: meterProvider.getMeter('test') });
    const inbox = `${ns}-metrics`;
    for (const n of [1, 2, 3])
      await plain.messages.sendMessage({
        from: 'me',
        to: inbox,
        kind: 'job',
        payload: { n },
        allowUnknownRecipient: true,
      });
    const slot = await plain.semaphores.acquire(`${ns}-slots`, { holder: 'me', limit: 2, ttlMs: 60_000 });
    expect(slot.status).toBe('acquired');
    await plain.semaphores.acquire(`${ns}-slots`, { holder: 'other', limit: 1, ttlMs: 60_000 }); // busy: a conflict
    // Two path leases, and a ready queue of one ready task, one behind it and one behind a gate.
    const site = await plain.org.createWorkspace({ id: `${ns}-site`, companyId: `${ns}-co`, name: 'site' });
    const paths = await plain.paths.tryAcquirePaths({
      workspaceId: site.id,
      holder: 'me',
      paths: ['src/a', 'docs'],
      ttlMs: 60_000,
    });
    expect(paths.acquired).toBe(true);
    const task = (title: string, dependsOn: string[] = []) =>
      plain.tasks.createTask({ companyId: `${ns}-co`, title, status: 'ready', requiresFilesystem: false, dependsOn });
    const build = await task('build');
    await task('ship', [build.id]);
    const gated = await task('gated');
    await plain.gates.openGate({ taskId: gated.id, question: 'go?' });
    await new Promise((resolve) => setTimeout(resolve, 30));

    // The counters are read first; the gauges' read transaction comes after them.
    const stats = plain.stats();
    const { resourceMetrics, errors } = await reader.collect();
    expect(errors).toEqual([]);
    const all = resourceMetrics.scopeMetrics.flatMap((m) => m.metrics);
    const metric = (name: string) => all.find((m) => m.descriptor.name === name);
    const points = (name: string) => (metric(name) as SumMetricData | GaugeMetricData | undefined)?.dataPoints ?? [];
    expect(points('taskfence.transactions')[0]!.value).toBe(stats.transactions);
    expect(points('taskfence.conflicts')[0]!.value).toBe(stats.conflicts);
    expect(stats.conflicts).toBeGreaterThan(0);
    expect(
      points('taskfence.inbox.depth').find((p) => p.attributes['messaging.destination.name'] === inbox)?.value,
    ).toBe(3);
    const semaphores = points('taskfence.leases.held').find(
      (p) => p.attributes['taskfence.lease.kind'] === 'semaphore',
    );
    expect(semaphores?.value).toBe(1);
    const byKind = (name: string, key: string, value: string) =>
      points(name).find((p) => p.attributes[key] === value)?.value;
    expect(byKind('taskfence.leases.held', 'taskfence.lease.kind', 'path_lease')).toBe(2);
    expect(
      Object.fromEntries(
        ['ready', 'blocked_by_dependency', 'blocked_by_gate'].map((state) => [
          state,
          byKind('taskfence.ready_queue.depth', 'taskfence.queue.state', state),
        ]),
      ),
    ).toEqual({ ready: 1, blocked_by_dependency: 1, blocked_by_gate: 1 });
    const age = points('taskfence.lease.oldest_age').find((p) => p.attributes['taskfence.lease.kind'] === 'semaphore');
    expect(age?.value).toBeGreaterThanOrEqual(20);
    registration.unregister();
    await meterProvider.shutdown();
  });
}
