/** Contender operations for the gate race (run in child processes by the race helper). */
import { GateOpenError, type Store } from '../../src/index.js';
import type { ContenderTools } from '../support/contender.js';
import { defineOperations } from '../support/operations.js';

/**
 * Claims and completes the run's ready tasks until none is left; a completion refused because a
 * gate opened on the task meanwhile is counted and left (the dispatch stays active).
 */
export async function claimAndComplete(store: Store, args: { runId: string }, tools: ContenderTools) {
  let completed = 0;
  let refused = 0;
  for (let idle = 0; idle < 20; ) {
    const d = await store.dispatches.dispatchNext({
      runId: args.runId,
      terminalHandle: `term-${tools.index}-${completed + refused}`,
    });
    if (!d) {
      idle++;
      await new Promise((r) => setTimeout(r, 5));
      continue;
    }
    idle = 0;
    // The work: a few milliseconds in flight, for a gate to land meanwhile.
    await new Promise((r) => setTimeout(r, 3));
    try {
      await store.dispatches.completeDispatch(d.id, { lease: d.lease! });
      completed++;
    } catch (error) {
      if (!(error instanceof GateOpenError)) throw error;
      refused++;
    }
  }
  return { completed, refused };
}

/** Opens a gate on each of `taskIds` in turn (never resolved): whatever state the task is in. */
export async function openGates(store: Store, args: { taskIds: string[] }) {
  for (const taskId of args.taskIds) await store.gates.openGate({ question: 'hold?', taskId });
  return args.taskIds.length;
}

export const ops = defineOperations(import.meta.url, { claimAndComplete, openGates });
