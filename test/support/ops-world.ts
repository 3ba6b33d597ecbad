/**
 * A small world for the operator views (`inspect`, `ui`): one live run with a dispatched task (its
 * task lease, its workspace lock and its dispatch), a task behind an open gate, path leases of two
 * holders (in a second workspace), an environment, messages in the run's inbox, a semaphore with two slots, a worker
 * inbox with a dead and a redelivered message, and one run whose coordinator went silent
 * ten minutes ago (stale). Every id is prefixed with `ns`, so worlds do not collide.
 */
import type { Store } from '../../src/index.js';

export interface OpsWorld {
  readonly companyId: string;
  readonly workspaceId: string;
  /** The workspace the path leases are in (the task's workspace is locked whole). */
  readonly pathsWorkspaceId: string;
  readonly runId: string;
  readonly coordinatorHandle: string;
  readonly staleRunId: string;
  readonly dispatchedTaskId: string;
  readonly gatedTaskId: string;
  readonly gateId: string;
  readonly dispatchId: string;
  readonly terminalHandle: string;
  readonly taskLeaseToken: number;
  readonly workspaceLockToken: number;
  readonly environmentId: string;
  /** A semaphore with two live slots (held by `${ns}-build-1` and `-2`). */
  readonly semaphore: string;
  /** A worker inbox with one dead message and one redelivered (in flight) message. */
  readonly workerInbox: string;
  readonly deadMessageId: string;
  readonly redeliveredMessageId: string;
}

/** Builds the world on `store`; `openPast(offsetMs)` opens a store on the same database whose clock is `offsetMs` behind. */
export async function seedOpsWorld(
  store: Store,
  ns: string,
  openPast: (offsetMs: number) => Promise<Store>,
): Promise<OpsWorld> {
  const company = await store.org.createCompany({ id: `${ns}-co`, name: 'Acme' });
  const workspace = await store.org.createWorkspace({
    id: `${ns}-repo`,
    companyId: company.id,
    name: 'repo',
    rootPath: '/srv/acme/repo',
  });
  const coder = await store.org.createAgent({
    id: `${ns}-coder`,
    companyId: company.id,
    name: 'coder',
    role: 'engineer',
    workspaceId: workspace.id,
  });
  const run = await store.runs.startCoordinatorRun({ targetKey: `worktree:${ns}`, spec: 'ops world' });
  await store.runs.heartbeatCoordinatorRun(run.id);
  const newTask = (id: string, title: string) =>
    store.tasks.createTask({
      id: `${ns}-${id}`,
      companyId: company.id,
      title,
      status: 'ready',
      assigneeAgentId: coder.id,
      requiresFilesystem: true,
      targetKey: `worktree:${ns}`,
    });
  const fix = await newTask('fix', 'Fix the login bug');
  const gated = await newTask('gated', 'Ship the release');
  const terminalHandle = `${run.coordinatorHandle}/terminal-1`;
  const { result, dispatchId } = await store.transaction(async (tx) => {
    const result = await tx.scheduler.dispatchRun({
      taskId: fix.id,
      agentId: coder.id,
      runId: run.id,
      mode: 'heartbeat',
      ttlMs: 600_000,
    });
    if (result.outcome !== 'dispatched') throw new Error(`not dispatched: ${result.outcome}`);
    const dispatch = await tx.dispatches.createDispatch({
      taskId: fix.id,
      terminalHandle,
      agentId: coder.id,
      runId: run.id,
    });
    return { result, dispatchId: dispatch.id };
  });
  if (result.outcome !== 'dispatched' || result.lockMode !== 'exclusive')
    throw new Error('expected an exclusive dispatch');
  const gate = await store.gates.openGate({ taskId: gated.id, question: 'Release on Friday?' });
  // Path leases in a workspace of their own: the workspace lock and path leases exclude each other.
  const site = await store.org.createWorkspace({
    id: `${ns}-site`,
    companyId: company.id,
    name: 'site',
    rootPath: '/srv/acme/site',
  });
  const a = await store.paths.tryAcquirePaths({
    workspaceId: site.id,
    holder: `${ns}-agent-a`,
    paths: ['src/auth', 'docs/README.md'],
    ttlMs: 600_000,
    taskId: fix.id,
  });
  const b = await store.paths.tryAcquirePaths({
    workspaceId: site.id,
    holder: `${ns}-agent-b`,
    paths: ['src/ui/button.ts'],
    ttlMs: 300_000,
  });
  if (!a.acquired || !b.acquired) throw new Error('path leases were not granted');
  const environment = await store.ownership.createEnvironment({
    id: `${ns}-env`,
    ownerTaskId: fix.id,
    rootPath: '/srv/acme/envs/fix',
  });
  for (const kind of ['progress', 'question'])
    await store.messages.sendMessage({ from: terminalHandle, to: run.coordinatorHandle, kind, payload: { ns } });
  const semaphore = `${ns}-builds`;
  for (const holder of ['build-1', 'build-2']) {
    const slot = await store.semaphores.acquire(semaphore, { holder: `${ns}-${holder}`, limit: 3, ttlMs: 600_000 });
    if (slot.status !== 'acquired') throw new Error('semaphore slot not granted');
  }
  // A worker inbox: one message released until it died, one handed out twice and held now.
  const workerInbox = `${ns}-worker`;
  const send = (kind: string) =>
    store.messages.sendMessage({ from: run.coordinatorHandle, to: workerInbox, kind, allowUnknownRecipient: true });
  const doomed = await send('build');
  let deadMessageId: string | null = null;
  for (let i = 0; i < 1_000 && deadMessageId === null; i++) {
    const [m] = await store.messages.receiveMessages(workerInbox, { limit: 1 });
    if (!m || m.id !== doomed.id) throw new Error('expected the doomed message');
    const r = await store.messages.releaseMessages(workerInbox, [m.receipt], { error: 'compiler crashed' });
    if (r.deadLettered.length > 0) deadMessageId = m.id;
  }
  if (deadMessageId === null) throw new Error('the message never died');
  const retried = await send('deploy');
  const first = await store.messages.receiveMessages(workerInbox, { limit: 1 });
  await store.messages.releaseMessages(workerInbox, [first[0]!.receipt]);
  const second = await store.messages.receiveMessages(workerInbox, { limit: 1, visibilityMs: 600_000 });
  if (second[0]?.id !== retried.id || second[0].attempt !== 2) throw new Error('expected a redelivery');
  // A coordinator that started ten minutes ago on another target and never heartbeat since.
  const past = await openPast(600_000);
  const stale = await past.runs.startCoordinatorRun({ targetKey: `worktree:${ns}-old`, spec: 'silent' });
  return {
    companyId: company.id,
    workspaceId: workspace.id,
    pathsWorkspaceId: site.id,
    runId: run.id,
    coordinatorHandle: run.coordinatorHandle,
    staleRunId: stale.id,
    dispatchedTaskId: fix.id,
    gatedTaskId: gated.id,
    gateId: gate.id,
    dispatchId,
    terminalHandle,
    taskLeaseToken: result.taskLease.token,
    workspaceLockToken: result.workspaceLock.token,
    environmentId: environment.id,
    semaphore,
    workerInbox,
    deadMessageId,
    redeliveredMessageId: retried.id,
  };
}
