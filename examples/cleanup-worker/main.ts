/**
 * The cleanup-worker example, end to end (see README.md beside this file):
 *
 *   npx tsx examples/cleanup-worker/main.ts                          # SQLite, a temporary file
 *   npx tsx examples/cleanup-worker/main.ts postgres://user@host/db  # PostgreSQL (or TASKFENCE_DATABASE_URL)
 *
 * In an application, import from 'taskfence' instead of the source tree.
 */
import { randomUUID } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  openStore,
  TaskfenceError,
  type CleanupSnapshotState,
  type Store,
  type TaskEnvironment,
} from '../../src/index.js';
import { cleanupPass, type CleanupPassResult, type TearDown } from './worker.js';

export interface CleanupDemoOptions {
  /** Default: `TASKFENCE_DATABASE_URL`, else a SQLite file in a temporary folder. */
  readonly url?: string;
  /** Where the narration goes (default `console.log`). */
  readonly log?: (line: string) => void;
}

type Resource = 'main' | 'scratch' | 'handoff' | 'group';

export interface CleanupDemoReport {
  /** Each inventoried resource's snapshot at the end. */
  readonly snapshots: Readonly<Record<Resource, { state: CleanupSnapshotState; attempts: number }>>;
  /** Whether each environment's directory still exists. */
  readonly directories: Readonly<Record<Exclude<Resource, 'group'>, boolean>>;
  /** The second admission of the same task: true (idempotent). */
  readonly readmittedIdempotently: boolean;
  /** Error codes of the calls the barrier refused after admission (new environment, detach). */
  readonly barrierRefusals: readonly string[];
  /** Error code of a transfer tried while a cleanup claim was active. */
  readonly transferDuringClaim: string;
  /** The handed-off environment afterwards: still active, with its new owner and generation. */
  readonly handoff: Pick<TaskEnvironment, 'ownerTaskId' | 'generation' | 'status'>;
  readonly followUpTaskId: string;
  readonly groupStatus: 'active' | 'removed' | null;
  readonly passes: readonly CleanupPassResult[];
  /** Error code the stalled worker got when it woke up and tried to complete. */
  readonly stalledWorkerComplete: string;
  /** Snapshots of the task still waiting for a worker (0 at the end). */
  readonly pendingAfter: number;
}

const CLAIM_TTL_MS = 1_500; // short for the demo; the default is 10 minutes
const PASS_PAUSE_MS = 100;
/** Snapshot states no worker acts on again. */
const SETTLED: readonly CleanupSnapshotState[] = ['completed', 'stale'];
const IN_USE = '.in-use'; // stands for a process that still has files open in the environment

/** The demo's teardown: an environment's directory is removed, unless something still uses it; a group has nothing on disk. */
const tearDown: TearDown = async (target) => {
  switch (target.kind) {
    case 'environment':
      if (existsSync(join(target.rootPath, IN_USE))) throw new Error(`${target.rootPath} is still in use`);
      await rm(target.rootPath, { recursive: true, force: true });
      return;
    case 'group':
      return; // a real backend might delete a shared branch or a container network here
  }
};

/**
 * Seeds a task that owns three environments (directories in a temporary folder) and stewards a
 * shared workspace group with one child, admits its cleanup, shows the barrier and the fences, and
 * runs cleanup passes until nothing is pending: one environment is handed off after the inventory
 * (stale: kept), one is still in use at first (failed, then retried), one was claimed by a worker
 * that stalled (its claim expires and another worker finishes the job).
 */
export async function runCleanupDemo(options: CleanupDemoOptions = {}): Promise<CleanupDemoReport> {
  const log = options.log ?? ((line: string) => console.log(line));
  const tempDir = mkdtempSync(join(tmpdir(), 'taskfence-cleanup-'));
  const url = options.url ?? process.env.TASKFENCE_DATABASE_URL ?? `sqlite:${join(tempDir, 'cleanup.db')}`;
  const store = await openStore(url);
  try {
    await store.migrate();
    return await demo(store, tempDir, log);
  } finally {
    await store.close();
    rmSync(tempDir, { recursive: true, force: true });
  }
}

async function demo(store: Store, tempDir: string, log: (line: string) => void): Promise<CleanupDemoReport> {
  const ns = randomUUID().slice(0, 8); // fresh ids: the demo can run again on the same database
  const company = await store.org.createCompany({ id: `acme-${ns}`, name: 'Acme' });
  const task = (title: string, extra: { parentId?: string; workspaceMode?: 'shared' } = {}) =>
    store.tasks.createTask({ companyId: company.id, title, requiresFilesystem: true, ...extra });
  const feature = await task('Build feature X');
  const followUp = await task('Follow-up fix');
  const group = await store.ownership.createWorkspaceGroup({ stewardTaskId: feature.id });
  const child = await task('Feature X: tests', { parentId: feature.id, workspaceMode: 'shared' });

  const envDir = (name: string) => {
    const dir = join(tempDir, `${name}-${ns}`);
    mkdirSync(dir);
    writeFileSync(join(dir, 'build.log'), `${name}\n`);
    return dir;
  };
  const env = (name: string) =>
    store.ownership.createEnvironment({ id: `${name}-${ns}`, ownerTaskId: feature.id, rootPath: envDir(name) });
  const main = await env('main');
  const scratch = await env('scratch');
  const handoff = await env('handoff');
  writeFileSync(join(scratch.rootPath, IN_USE), '');
  const names = new Map<string, Resource>([
    [main.id, 'main'],
    [scratch.id, 'scratch'],
    [handoff.id, 'handoff'],
    [group.id, 'group'],
  ]);
  log(`(setup) task "${feature.title}" owns environments main, scratch, handoff and stewards group ${group.id}`);

  // 1. Admit: the barrier goes up and the inventory (resource, owner, generation) is persisted.
  const admission = await store.ownership.admitTaskCleanup(feature.id, 'delete');
  for (const s of admission.snapshots)
    log(`admitted: snapshot of ${names.get(s.resourceId)} (${s.resourceKind}) at generation ${s.generation}`);
  const again = await store.ownership.admitTaskCleanup(feature.id, 'delete');
  log(
    `admitting again returns the same ${again.snapshots.length} snapshots (alreadyAdmitted: ${again.alreadyAdmitted})`,
  );

  // 2. Behind the barrier, nothing new can become the task's, and its subtask cannot be detached.
  const barrierRefusals: string[] = [];
  for (const [what, call] of [
    ['a new environment', () => store.ownership.createEnvironment({ ownerTaskId: feature.id, rootPath: '/nowhere' })],
    ['detaching the subtask', () => store.ownership.detachSubtask({ taskId: child.id, expectedParentId: feature.id })],
  ] as const) {
    const code = await refusal(call);
    log(`barrier: ${what} for the admitted task is refused: ${code}`);
    barrierRefusals.push(code);
  }

  // 3. A transfer after the inventory is allowed while no claim is active: "handoff" moves to the
  //    follow-up task at generation 2, so its snapshot no longer describes it.
  const moved = await store.ownership.transferEnvironmentOwnership({
    environmentId: handoff.id,
    expectedOwnerTaskId: feature.id,
    expectedGeneration: handoff.generation,
    newOwnerTaskId: followUp.id,
  });
  log(`handoff moved to "${followUp.title}" at generation ${moved.generation}`);

  // 4. Worker A claims "main", then stalls (a long GC pause, a frozen VM). While its claim is
  //    active the environment cannot change owner.
  const mainSnapshot = admission.snapshots.find((s) => s.resourceId === main.id)!;
  const stalledClaim = await store.ownership.claimCleanup(mainSnapshot.id, 'worker-A', { ttlMs: CLAIM_TTL_MS });
  log(`worker-A: claimed main (attempt ${stalledClaim.attempt}) and stalled`);
  const transferDuringClaim = await refusal(() =>
    store.ownership.transferEnvironmentOwnership({
      environmentId: main.id,
      expectedOwnerTaskId: feature.id,
      expectedGeneration: main.generation,
      newOwnerTaskId: followUp.id,
    }),
  );
  log(`a transfer of main during worker-A's claim is refused: ${transferDuringClaim}`);

  // 5. Worker B's passes, as its daemon loop would run them: the first while "scratch" is still in
  //    use and worker-A's claim is live; then the process using scratch exits, and B passes again
  //    (pausing between passes) until the task's inventory is settled: "main" comes back once
  //    worker-A's claim expires.
  const pass = () =>
    cleanupPass(store, { workerId: 'worker-B', tearDown, claimTtlMs: CLAIM_TTL_MS, taskId: feature.id, log });
  const passes = [await pass()];
  rmSync(join(scratch.rootPath, IN_USE));
  const deadline = Date.now() + 30_000;
  while ((await store.ownership.listCleanupSnapshots(feature.id)).some((s) => !SETTLED.includes(s.state))) {
    if (Date.now() > deadline) throw new Error('the cleanup did not settle within 30 s');
    await new Promise((resolve) => setTimeout(resolve, PASS_PAUSE_MS));
    passes.push(await pass());
  }

  // 6. Worker A wakes up and tries to complete with its old claim: refused, nothing changes.
  const stalledWorkerComplete = await refusal(() => store.ownership.completeCleanup(stalledClaim));
  log(`worker-A: woke up; completing its expired claim is refused: ${stalledWorkerComplete}`);

  const snapshots = await store.ownership.listCleanupSnapshots(feature.id);
  const handoffNow = (await store.ownership.getEnvironment(handoff.id))!;
  return {
    snapshots: Object.fromEntries(
      snapshots.map((s) => [names.get(s.resourceId)!, { state: s.state, attempts: s.attempts }]),
    ) as CleanupDemoReport['snapshots'],
    directories: {
      main: existsSync(main.rootPath),
      scratch: existsSync(scratch.rootPath),
      handoff: existsSync(handoff.rootPath),
    },
    readmittedIdempotently: again.alreadyAdmitted,
    barrierRefusals,
    transferDuringClaim,
    handoff: { ownerTaskId: handoffNow.ownerTaskId, generation: handoffNow.generation, status: handoffNow.status },
    followUpTaskId: followUp.id,
    groupStatus: (await store.ownership.getWorkspaceGroup(group.id))?.status ?? null,
    passes,
    stalledWorkerComplete,
    pendingAfter: (await store.ownership.listPendingCleanups({ taskId: feature.id })).length,
  };
}

/** Runs a call that must be refused and returns the refusal's code; a success or an untyped error is a bug. */
async function refusal(call: () => Promise<unknown>): Promise<string> {
  try {
    await call();
  } catch (error) {
    if (error instanceof TaskfenceError) return error.code;
    throw error;
  }
  throw new Error('expected a refusal, but the call succeeded');
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const report = await runCleanupDemo(process.argv[2] ? { url: process.argv[2] } : {});
  console.log('\nsummary:');
  for (const [name, s] of Object.entries(report.snapshots))
    console.log(`  ${name}: ${s.state} after ${s.attempts} attempt(s)`);
  console.log(`  directories left: ${JSON.stringify(report.directories)}; pending: ${report.pendingAfter}`);
}
