/** Contender operations for the retention suite (run in child processes by the race helper). */
import type { Store } from '../../src/index.js';
import { defineOperations } from '../support/operations.js';

/**
 * A service's ordinary work, `rounds` times, on its own target, inbox and workspace: start a run,
 * claim and release the workspace lock, send and deliver a message, open and resolve a gate, stop
 * the run. Returns every lock token it was granted (they must increase strictly).
 */
export async function churn(store: Store, args: { workspaceId: string; tag: string; rounds: number }) {
  const tokens: number[] = [];
  for (let i = 0; i < args.rounds; i++) {
    const run = await store.runs.startCoordinatorRun({ targetKey: `worktree:${args.tag}` });
    const claim = await store.locks.claimWorkspaceLock(args.workspaceId, {
      holder: args.tag,
      runId: run.id,
      ttlMs: 60_000,
    });
    if (claim.status !== 'acquired') throw new Error(`lock busy: ${JSON.stringify(claim)}`);
    tokens.push(claim.lease.token);
    await store.messages.sendMessage({ from: args.tag, to: run.coordinatorHandle, kind: 'note', payload: { i } });
    const got = await store.messages.deliverPendingMessages(run.coordinatorHandle);
    if (got.length !== 1) throw new Error(`expected 1 message, got ${got.length}`);
    const gate = await store.gates.openGate({ question: `q${i}`, runId: run.id });
    await store.gates.resolveGate(gate.id, 'ok');
    await store.runs.heartbeatCoordinatorRun(run.id);
    await store.locks.releaseWorkspaceLock(args.workspaceId, { token: claim.lease.token });
    await store.runs.stopCoordinatorRun(run.id, 'completed');
  }
  return tokens;
}

/** The operations this module's contenders run (see test/support/operations.ts). */
export const ops = defineOperations(import.meta.url, { churn });
