/**
 * Statements sent per hot call (issue 24): each call made once on a warm store, counted with the
 * store's `onQuery` option. On PostgreSQL a statement is a round trip: `BEGIN` is sent together
 * with its first statement in one simple-protocol query and is reported (and counted) as one.
 * Shared by the budget test (`round-trips.suite.ts`) and the benchmark (`npm run bench -- --only=roundtrips`).
 */
import type { Store, StoreOptions } from '../../src/index.js';

/** A counter to pass as the store's `onQuery`, read around one call at a time. */
export function statementCounter(): { onQuery: NonNullable<StoreOptions['onQuery']>; count(): number } {
  let n = 0;
  return { onQuery: () => void n++, count: () => n };
}

/** The hot calls, in the order they are measured; the budget table keys on these names. */
export const HOT_CALLS = [
  'startCoordinatorRun',
  'createTask (with a target)',
  'dispatchNext',
  'heartbeatDispatch',
  'completeDispatch',
  'completeDispatch (with next)',
  'dispatchNextBatch (2 terminals)',
  'claimWorkspaceLock',
  'renewWorkspaceLock',
  'releaseWorkspaceLock',
  'claimTaskLease',
  'renewTaskLease',
  'releaseTaskLease',
  'semaphores.acquire',
  'semaphores.renew',
  'semaphores.release',
  'tryAcquirePaths (2 paths)',
  'renewPaths',
  'releasePaths',
  'paths.claimTask',
  'sendMessage',
  'receiveMessages (1)',
  'ackMessages (1)',
  'deliverPendingMessages (1)',
  'transferEnvironmentOwnership',
] as const;
export type HotCall = (typeof HOT_CALLS)[number];

/**
 * Makes every hot call once on `store` (opened with `counter.onQuery`) and returns the statements
 * each sent. A first call of each kind warms the prepared statements; only a second one is counted.
 */
export async function measureRoundTrips(
  store: Store,
  counter: { count(): number },
  tag = Math.random().toString(16).slice(2, 10),
): Promise<Record<HotCall, number>> {
  const counts = {} as Record<HotCall, number>;
  const measure = async <T>(call: HotCall, fn: () => Promise<T>): Promise<T> => {
    const before = counter.count();
    const result = await fn();
    counts[call] = counter.count() - before;
    return result;
  };

  const company = (await store.org.createCompany({ name: `rt-${tag}` })).id;
  const workspace = (await store.org.createWorkspace({ companyId: company, name: 'ws' })).id;
  const pathsWorkspace = (await store.org.createWorkspace({ companyId: company, name: 'paths' })).id;

  // The run and the work lifecycle: a run on a target, a task on it, dispatched and completed.
  await store.runs.startCoordinatorRun({ targetKey: `worktree:warm-${tag}` });
  const targetKey = `worktree:rt-${tag}`;
  const run = await measure('startCoordinatorRun', () => store.runs.startCoordinatorRun({ targetKey }));
  const task = (title: string) =>
    store.tasks.createTask({ companyId: company, title, targetKey, requiresFilesystem: false, status: 'ready' });
  await task('warm');
  await measure('createTask (with a target)', () => task('measured'));
  await store.dispatches.dispatchNext({ runId: run.id, terminalHandle: `term-warm-${tag}` });
  const dispatch = await measure('dispatchNext', () =>
    store.dispatches.dispatchNext({ runId: run.id, terminalHandle: `term-${tag}` }),
  );
  if (!dispatch?.lease) throw new Error('dispatchNext found nothing ready');
  const dispatchLease = dispatch.lease;
  const lease = await measure('heartbeatDispatch', () => store.dispatches.heartbeatDispatch(dispatchLease));
  await measure('completeDispatch', () => store.dispatches.completeDispatch(dispatch.id, { lease }));
  // The worker loop's step: a completion that claims the terminal's next task (three are ready).
  await task('chained-1');
  await task('chained-2');
  await task('chained-3');
  const chained = await store.dispatches.dispatchNext({ runId: run.id, terminalHandle: `term-chain-${tag}` });
  const warmed = await store.dispatches.completeDispatch(chained!.id, { lease: chained!.lease!, next: true });
  const step = await measure('completeDispatch (with next)', () =>
    store.dispatches.completeDispatch(warmed.next!.id, { lease: warmed.next!.lease!, next: true }),
  );
  if (!step.next) throw new Error('completeDispatch with next found nothing ready');
  // A batch claim for two free terminals (four more are ready: two for a warm-up, two measured).
  for (let i = 0; i < 4; i++) await task(`batch-${i}`);
  await store.dispatches.dispatchNextBatch({ runId: run.id, terminalHandles: [`b-warm-1-${tag}`, `b-warm-2-${tag}`] });
  const batch = await measure('dispatchNextBatch (2 terminals)', () =>
    store.dispatches.dispatchNextBatch({ runId: run.id, terminalHandles: [`b-1-${tag}`, `b-2-${tag}`] }),
  );
  if (batch.length !== 2) throw new Error('dispatchNextBatch found fewer than two ready tasks');

  // Workspace lock and task lease.
  const lock = await measure('claimWorkspaceLock', () =>
    store.locks.claimWorkspaceLock(workspace, { holder: 'h', runId: run.id, ttlMs: 60_000 }),
  );
  if (lock.status !== 'acquired') throw new Error('workspace lock busy');
  const renewedLock = await measure('renewWorkspaceLock', () =>
    store.locks.renewWorkspaceLock(lock.lease, { ttlMs: 60_000 }),
  );
  await measure('releaseWorkspaceLock', () => store.locks.releaseWorkspaceLock(renewedLock));
  const leased = await task('leased');
  const taskLease = await measure('claimTaskLease', () =>
    store.locks.claimTaskLease(leased.id, { holder: 'h', ttlMs: 60_000 }),
  );
  if (taskLease.status !== 'acquired') throw new Error('task lease busy');
  const renewedTaskLease = await measure('renewTaskLease', () =>
    store.locks.renewTaskLease(taskLease.lease, { ttlMs: 60_000 }),
  );
  await measure('releaseTaskLease', () => store.locks.releaseTaskLease(renewedTaskLease));

  // A semaphore slot.
  const slot = await measure('semaphores.acquire', () =>
    store.semaphores.acquire(`sem-${tag}`, { holder: 'h', limit: 2, ttlMs: 60_000 }),
  );
  if (slot.status !== 'acquired') throw new Error('semaphore busy');
  const renewedSlot = await measure('semaphores.renew', () => store.semaphores.renew(slot.lease, { ttlMs: 60_000 }));
  await measure('semaphores.release', () => store.semaphores.release(renewedSlot));

  // Path leases: a grant of two paths, and a task claim.
  const paths = await measure('tryAcquirePaths (2 paths)', () =>
    store.paths.tryAcquirePaths({ workspaceId: pathsWorkspace, holder: 'h', paths: ['src/a', 'docs'], ttlMs: 60_000 }),
  );
  if (paths.status !== 'acquired') throw new Error('paths busy');
  const renewedPaths = await measure('renewPaths', () => store.paths.renewPaths(paths.lease, { ttlMs: 60_000 }));
  await measure('releasePaths', () => store.paths.releasePaths(renewedPaths));
  const pathTask = await store.tasks.createTask({
    companyId: company,
    title: 'paths',
    workspaceId: pathsWorkspace,
    requiresFilesystem: true,
    writes: ['lib/x.ts'],
    status: 'ready',
  });
  await measure('paths.claimTask', () => store.paths.claimTask(pathTask.id, 'h'));

  // Messages to the run's coordinator: send, receive, ack.
  const inbox = run.coordinatorHandle;
  await store.messages.sendMessage({ from: 'w', to: inbox, kind: 'warm' });
  await measure('sendMessage', () => store.messages.sendMessage({ from: 'w', to: inbox, kind: 'report' }));
  await store.messages.receiveMessages(inbox, { limit: 1, visibilityMs: 60_000 });
  const received = await measure('receiveMessages (1)', () =>
    store.messages.receiveMessages(inbox, { limit: 1, visibilityMs: 60_000 }),
  );
  if (received.length !== 1) throw new Error('no message received');
  await measure('ackMessages (1)', () => store.messages.ackMessages(inbox, [received[0]!.receipt]));
  await store.messages.sendMessage({ from: 'w', to: inbox, kind: 'report' });
  await store.messages.deliverPendingMessages(inbox, { limit: 1 });
  await store.messages.sendMessage({ from: 'w', to: inbox, kind: 'report' });
  const delivered = await measure('deliverPendingMessages (1)', () =>
    store.messages.deliverPendingMessages(inbox, { limit: 1 }),
  );
  if (delivered.length !== 1) throw new Error('no message delivered');

  // Ownership transfer between two tasks.
  const [a, b] = [await task('owner-a'), await task('owner-b')];
  const env = await store.ownership.createEnvironment({ ownerTaskId: a.id, rootPath: `/tmp/rt-${tag}` });
  await store.ownership.transferEnvironmentOwnership({
    environmentId: env.id,
    expectedOwnerTaskId: a.id,
    expectedGeneration: env.generation,
    newOwnerTaskId: b.id,
  });
  await measure('transferEnvironmentOwnership', () =>
    store.ownership.transferEnvironmentOwnership({
      environmentId: env.id,
      expectedOwnerTaskId: b.id,
      expectedGeneration: env.generation + 1,
      newOwnerTaskId: a.id,
    }),
  );
  return counts;
}
