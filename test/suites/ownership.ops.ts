/** Contender operations for the ownership suite (run in child processes by the race helper). */
import { readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import {
  openStore,
  type CleanupClaim,
  type Store,
  type TransferEnvironmentInput,
  type TransferStewardshipInput,
} from '../../src/index.js';
import type { ContenderTools } from '../support/contender.js';
import { defineOperations } from '../support/operations.js';

export function transferEnvironment(store: Store, args: TransferEnvironmentInput) {
  return store.ownership.transferEnvironmentOwnership(args);
}

export function transferGroup(store: Store, args: TransferStewardshipInput) {
  return store.ownership.transferGroupStewardship(args);
}

export function claimCleanup(store: Store, args: { snapshotId: string; claimant: string }) {
  return store.ownership.claimCleanup(args.snapshotId, args.claimant);
}

export function completeCleanup(store: Store, claim: CleanupClaim) {
  return store.ownership.completeCleanup(claim);
}

export function detach(store: Store, args: { taskId: string; expectedParentId: string }) {
  return store.ownership.detachSubtask(args);
}

export async function admit(store: Store, args: { taskId: string }) {
  return store.ownership.admitTaskCleanup(args.taskId, 'archive');
}

/** Creates `count` shared children of `parentId`, one after another. */
export async function createSharedChildren(store: Store, args: { companyId: string; parentId: string; count: number }) {
  const ids: string[] = [];
  for (let i = 0; i < args.count; i++) {
    const task = await store.tasks.createTask({
      companyId: args.companyId,
      title: `child ${i}`,
      requiresFilesystem: true,
      parentId: args.parentId,
      workspaceMode: 'shared',
    });
    ids.push(task.id);
  }
  return ids;
}

/**
 * Watches a parent's shared children while they are created: each round reads the children
 * (one statement), then their membership rows (a later statement). A child seen without its
 * membership is a violation. Stops when `count` children were seen.
 */
export async function watchMemberships(store: Store, args: { parentId: string; count: number }) {
  let iterations = 0;
  let violations = 0;
  let seen = 0;
  const giveUpAt = Date.now() + 120_000; // only so a failed creator cannot hang the suite
  while (seen < args.count && Date.now() < giveUpAt) {
    iterations++;
    const children = await store.db
      .selectFrom('tasks')
      .select('id')
      .where('parent_id', '=', args.parentId)
      .where('workspace_mode', '=', 'shared')
      .execute();
    seen = children.length;
    if (seen === 0) continue;
    const members = await store.db
      .selectFrom('workspace_group_members')
      .select('task_id')
      .where(
        'task_id',
        'in',
        children.map((c) => c.id),
      )
      .execute();
    violations += seen - members.length;
  }
  return { iterations, violations, seen };
}

/**
 * A cleanup worker that dies mid-teardown: claims each snapshot, deletes the first file of each
 * environment's directory, tells the parent, and hangs there until it is SIGKILLed.
 */
export async function teardownAndHang(
  store: Store,
  args: { claims: { snapshotId: string; claimant: string }[] },
  tools: ContenderTools,
) {
  for (const { snapshotId, claimant } of args.claims) {
    const claim = await store.ownership.claimCleanup(snapshotId, claimant);
    if (claim.target.kind !== 'environment') throw new Error('expected an environment');
    const [first] = readdirSync(claim.target.rootPath).sort();
    rmSync(join(claim.target.rootPath, first!));
  }
  tools.signal('mid-teardown');
  await new Promise(() => {});
}

/** Extra stores of this process, one connection each (SQLite: a connection; PostgreSQL: a pool of one). */
const connections: Store[] = [];

/** Opens (once) `count` extra connections and checks each answers, so a later race does not pay for connecting. */
export async function openConnections(_store: Store, args: { count: number }, tools: ContenderTools) {
  while (connections.length < args.count) {
    // busyTimeoutMs 1: on SQLite a busy connection must not block this process's other connections
    // synchronously; the store's async retry with backoff waits instead.
    connections.push(await openStore({ url: tools.url, poolSize: 1, busyTimeoutMs: 1 }));
  }
  for (const c of connections) await c.db.selectFrom('tasks').select('id').limit(1).execute();
  return connections.length;
}

/** Runs `calls[c]` on extra connection `c`, all at once; reports each outcome like the race helper does. */
export async function transferOnEachConnection(_store: Store, args: { calls: TransferEnvironmentInput[] }) {
  const settled = await Promise.allSettled(
    args.calls.map((call, c) => connections[c]!.ownership.transferEnvironmentOwnership(call)),
  );
  return settled.map((r) =>
    r.status === 'fulfilled'
      ? { ok: true as const, value: r.value }
      : {
          ok: false as const,
          error: {
            ...(r.reason as object),
            name: (r.reason as Error).name,
            message: (r.reason as Error).message,
            code: (r.reason as { code?: string }).code,
          },
        },
  );
}

/**
 * A restarted cleanup worker: opens its own store whose clock runs `skewMs` ahead (so claims of
 * dead workers have expired), lists the pending snapshots of `taskId` and retries each: claim,
 * delete the directory, complete. Reports each snapshot's outcome.
 */
export async function retryPendingCleanups(
  _store: Store,
  args: { taskId: string; skewMs: number; claimant: string },
  tools: ContenderTools,
) {
  const store = await openStore({ url: tools.url, clock: { now: () => Date.now() + args.skewMs } });
  try {
    const pending = await store.ownership.listPendingCleanups({ taskId: args.taskId });
    const outcomes: { snapshotId: string; resourceId: string; ok: boolean; code?: string; attempt?: number }[] = [];
    for (const snapshot of pending) {
      try {
        const claim = await store.ownership.claimCleanup(snapshot.id, args.claimant);
        if (claim.target.kind === 'environment') rmSync(claim.target.rootPath, { recursive: true, force: true });
        await store.ownership.completeCleanup(claim);
        outcomes.push({ snapshotId: snapshot.id, resourceId: snapshot.resourceId, ok: true, attempt: claim.attempt });
      } catch (error) {
        outcomes.push({
          snapshotId: snapshot.id,
          resourceId: snapshot.resourceId,
          ok: false,
          code: (error as { code?: string }).code ?? String(error),
        });
      }
    }
    return outcomes;
  } finally {
    await store.close();
  }
}

const PAIR_OPERATIONS = {
  transferEnvironment,
  transferGroup,
  claimCleanup,
  detach,
  admit,
  createSharedChildren,
  watchMemberships,
};

/** One call `dispatch` can run: an operation's name and its arguments, checked together. */
export type PairCall = {
  [K in keyof typeof PAIR_OPERATIONS]: [op: K, args: Parameters<(typeof PAIR_OPERATIONS)[K]>[1]];
}[keyof typeof PAIR_OPERATIONS];

/** Runs the operation named `op`: lets one `race` release different operations in different contenders. */
export function dispatch(store: Store, args: { op: PairCall[0]; args: unknown }, tools: ContenderTools) {
  const op = PAIR_OPERATIONS[args.op] as (store: Store, args: unknown, tools: ContenderTools) => Promise<unknown>;
  if (!op) throw new Error(`no operation ${args.op}`);
  return op(store, args.args, tools);
}

/** The operations this module's contenders run (see test/support/operations.ts). */
export const ops = defineOperations(import.meta.url, {
  transferEnvironment,
  transferGroup,
  claimCleanup,
  completeCleanup,
  detach,
  admit,
  createSharedChildren,
  watchMemberships,
  teardownAndHang,
  openConnections,
  transferOnEachConnection,
  retryPendingCleanups,
  dispatch,
});
