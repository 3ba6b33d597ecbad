/** Contender operations for the run-scoping suite (run in child processes by the race helper). */
import type { Store } from '../../src/index.js';
import type { ContenderTools } from '../support/contender.js';
import { defineOperations } from '../support/operations.js';

/** Starts a run; returns its id and how many tasks it adopted. */
export async function startRun(store: Store, args: { targetKey: string | null }) {
  const run = await store.runs.startCoordinatorRun({ targetKey: args.targetKey });
  return { id: run.id, handle: run.coordinatorHandle, adoptedTaskCount: run.adoptedTaskCount };
}

export async function heartbeat(store: Store, args: { runId: string }) {
  const run = await store.runs.heartbeatCoordinatorRun(args.runId);
  return { heartbeatAt: run.heartbeatAt };
}

/**
 * Starts a run, signals `started`, then heartbeats until the process is killed or the run is
 * lost; on loss it returns the error code (the holder learns it lost the run).
 */
export async function holdRun(store: Store, args: { targetKey: string | null }, tools: ContenderTools) {
  const run = await store.runs.startCoordinatorRun({ targetKey: args.targetKey });
  tools.signal('started');
  for (;;) {
    await new Promise((resolve) => setTimeout(resolve, 25));
    try {
      await store.runs.heartbeatCoordinatorRun(run.id);
    } catch (error) {
      return { runId: run.id, lost: (error as { code?: string }).code };
    }
  }
}

/** Drains an inbox in batches of `limit` until a batch comes back empty; returns the ids it got. */
export async function drainInbox(store: Store, args: { handle: string; limit: number }) {
  const ids: string[] = [];
  for (;;) {
    const batch = await store.messages.deliverPendingMessages(args.handle, { limit: args.limit });
    if (batch.length === 0) return ids;
    for (const m of batch) ids.push(m.id);
  }
}

export async function sendMessages(store: Store, args: { from: string; to: string; count: number }) {
  for (let i = 0; i < args.count; i++) {
    await store.messages.sendMessage({
      allowUnknownRecipient: true,
      from: args.from,
      to: args.to,
      kind: 'worker_done',
      payload: { i },
    });
  }
  return args.count;
}

export async function createDispatch(store: Store, args: { taskId: string; terminalHandle: string; runId?: string }) {
  const dispatch = await store.dispatches.createDispatch(args);
  return { id: dispatch.id };
}

export async function failOnExit(store: Store, args: { terminalHandle: string }) {
  const result = await store.dispatches.failActiveDispatchOnExit(args.terminalHandle);
  return (
    result && {
      dispatchId: result.dispatch.id,
      failureCount: result.failureCount,
      circuitBreakerTripped: result.circuitBreakerTripped,
      taskStatus: result.taskStatus,
      escalateTo: result.escalateTo,
    }
  );
}

export async function resolveGate(store: Store, args: { gateId: string; resolution: string }) {
  const gate = await store.gates.resolveGate(args.gateId, args.resolution);
  return { resolution: gate.resolution };
}

/**
 * Creates tasks through `store.tasks.createTask`, which takes the run-target lock before it reads
 * the target's running run (see `runTargetLockKey`), so a run starting meanwhile stamps or adopts them.
 */
export async function createTasksUnderTargetLock(
  store: Store,
  args: { companyId: string; targetKey: string | null; count: number; prefix: string },
) {
  const ids: string[] = [];
  for (let i = 0; i < args.count; i++) {
    const id = `${args.prefix}-${i}-${Math.random().toString(16).slice(2)}`;
    await store.tasks.createTask({
      id,
      companyId: args.companyId,
      title: id,
      status: 'ready',
      targetKey: args.targetKey,
      requiresFilesystem: false,
    });
    ids.push(id);
  }
  return ids;
}

/** Runs `startRun` or `createTasksUnderTargetLock` by `args.op`, so one race can mix the two. */
export async function startOrCreate(store: Store, args: { op: 'startRun' | 'createTasks' } & Record<string, unknown>) {
  if (args.op === 'startRun') return startRun(store, args as unknown as { targetKey: string | null });
  return createTasksUnderTargetLock(
    store,
    args as unknown as { companyId: string; targetKey: string | null; count: number; prefix: string },
  );
}

/** The operations this module's contenders run (see test/support/operations.ts). */
export const ops = defineOperations(import.meta.url, {
  startRun,
  heartbeat,
  holdRun,
  drainInbox,
  sendMessages,
  createDispatch,
  failOnExit,
  resolveGate,
  createTasksUnderTargetLock,
  startOrCreate,
});
