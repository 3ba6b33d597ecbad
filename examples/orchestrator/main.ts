/**
 * The orchestrator example, end to end (see README.md beside this file):
 *
 *   npx tsx examples/orchestrator/main.ts                          # SQLite, a temporary file
 *   npx tsx examples/orchestrator/main.ts postgres://user@host/db  # PostgreSQL (or TASKFENCE_DATABASE_URL)
 *
 * In an application, import from 'taskfence' instead of the source tree.
 */
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  openStore,
  resolveOrchestrationTargetKey,
  TaskfenceError,
  type CoordinatorRun,
  type DispatchStatus,
  type Store,
  type TaskStatus,
} from '../../src/index.js';
import {
  orchestrate,
  reportDone,
  simulatedWork,
  startRun,
  type Assignment,
  type OrchestrateStats,
} from './orchestrator.js';

export interface OrchestratorDemoOptions {
  /** Default: `TASKFENCE_DATABASE_URL`, else a SQLite file in a temporary folder (removed afterwards). */
  readonly url?: string;
  /** Where the narration goes (default `console.log`). */
  readonly log?: (line: string) => void;
}

export interface OrchestratorDemoReport {
  readonly targetKey: string;
  /** The crashed coordinator's run, as it ended: failed by `reconcileStaleRuns`. */
  readonly crashedRun: CoordinatorRun;
  /** Runs `startRun` reconciled to free the target. */
  readonly reconciledRunIds: readonly string[];
  /** Our run, as it ended (stopped `completed`). */
  readonly run: CoordinatorRun;
  readonly adoptedTaskCount: number;
  /** Every task of the run, by title. */
  readonly tasks: Readonly<Record<string, TaskStatus>>;
  readonly dispatches: Readonly<Record<DispatchStatus, number>>;
  readonly stats: OrchestrateStats;
  /** The task the demo's worker crashed on, and what its late ("zombie") report got: the error code. */
  readonly crashedTaskId: string;
  readonly zombieReport: string;
  /** Messages left in the run's inbox (0: every report was handled). */
  readonly pendingMessages: number;
}

/** Demo timings, short so the example finishes in seconds; production values are minutes. */
const TIMINGS = { staleAfterMs: 600, ttlMs: 2_000, beatMs: 50, stepMs: 15, deadlineMs: 30_000 };

/**
 * Seeds a company, a workspace, two agents and three tasks on one target; lets a "previous
 * coordinator" start a run there and crash; then runs our coordinator: it reconciles the stale run,
 * starts its own (adopting the tasks), dispatches them (one worker crashes once, so its task is
 * retried after its lease expires) and stops when all are done. Finally the crashed worker comes
 * back late and tries to report: its fencing token is refused.
 */
export async function runOrchestratorDemo(options: OrchestratorDemoOptions = {}): Promise<OrchestratorDemoReport> {
  const log = options.log ?? ((line: string) => console.log(line));
  const tempDir = options.url || process.env.TASKFENCE_DATABASE_URL ? null : mkdtempSync(join(tmpdir(), 'taskfence-'));
  const url = options.url ?? process.env.TASKFENCE_DATABASE_URL ?? `sqlite:${join(tempDir!, 'orchestrator.db')}`;
  const store = await openStore(url);
  try {
    await store.migrate();
    return await demo(store, log);
  } finally {
    await store.close();
    if (tempDir) rmSync(tempDir, { recursive: true, force: true });
  }
}

async function demo(store: Store, log: (line: string) => void): Promise<OrchestratorDemoReport> {
  // Fresh ids per run, so the demo can run again on the same database.
  const ns = randomUUID().slice(0, 8);
  const company = await store.org.createCompany({ id: `acme-${ns}`, name: 'Acme' });
  const repo = await store.org.createWorkspace({ companyId: company.id, name: 'repo', rootPath: '/srv/acme/repo' });
  const coder = await store.org.createAgent({
    companyId: company.id,
    name: 'coder',
    role: 'engineer',
    workspaceId: repo.id,
  });
  const writer = await store.org.createAgent({ companyId: company.id, name: 'writer', role: 'writer' });

  // The target: a worktree selector resolved to `worktree:<id>`; an unknown selector would throw
  // UnresolvedTargetError rather than guess a key.
  const worktrees = new Map([['main', `acme-main-${ns}`]]);
  const targetKey = resolveOrchestrationTargetKey('main', (selector) => worktrees.get(selector))!;

  // A previous coordinator started a run on the target, then its process died without stopping it.
  const crashed = await store.runs.startCoordinatorRun({ targetKey, spec: 'the coordinator that crashed' });
  log(`(setup) a previous coordinator started run ${crashed.id} on ${targetKey} and crashed`);

  // Tasks created meanwhile are stamped with that run. Two write to the repo (exclusive lock on
  // the coder's workspace); one does not (no lock at all).
  const newTask = (title: string, assignee: string, requiresFilesystem: boolean) =>
    store.tasks.createTask({
      companyId: company.id,
      title,
      status: 'ready',
      assigneeAgentId: assignee,
      requiresFilesystem,
      targetKey,
    });
  const fixLogin = await newTask('Fix the login bug', coder.id, true);
  await newTask('Add a changelog entry', coder.id, true);
  await newTask('Draft the release notes', writer.id, false);

  // Our coordinator: reconcile the crashed run (once its heartbeat is stale) and start ours,
  // which adopts the crashed run's unfinished tasks.
  const { run, reconciled } = await startRun(store, targetKey, {
    staleAfterMs: TIMINGS.staleAfterMs,
    giveUpAfterMs: 10 * TIMINGS.staleAfterMs,
    log,
  });

  // The workers. The first attempt at "Fix the login bug" dies mid-task (its terminal exits);
  // the demo keeps its assignment to replay the dead worker's late report at the end.
  let crashedAssignment: Assignment | undefined;
  const stats = await orchestrate(store, run, {
    ttlMs: TIMINGS.ttlMs,
    beatMs: TIMINGS.beatMs,
    deadlineMs: TIMINGS.deadlineMs,
    log,
    worker: async (store, assignment) => {
      if (assignment.task.id === fixLogin.id && !crashedAssignment) {
        crashedAssignment = assignment;
        await new Promise((resolve) => setTimeout(resolve, TIMINGS.stepMs));
        throw new Error('worker process killed');
      }
      await simulatedWork(store, assignment, { steps: 3, stepMs: TIMINGS.stepMs });
    },
  });

  // The dead worker was only paused; it wakes up and reports its (long finished) task. Its lease
  // expired and was granted again with a higher token, so the release is refused and nothing of
  // its report commits: the task stays done, no second message is sent.
  let zombieReport = 'accepted';
  try {
    await reportDone(store, crashedAssignment!);
  } catch (error) {
    if (!(error instanceof TaskfenceError)) throw error;
    zombieReport = error.code;
    log(`the crashed worker's late report was refused: ${error.code}`);
  }

  const final = await store.runs.stopCoordinatorRun(run.id, 'completed');
  log(`run ${final.id} stopped: ${final.status}`);

  const tasks = await store.tasks.listTasks({ runId: run.id });
  return {
    targetKey,
    crashedRun: (await store.runs.getCoordinatorRun(crashed.id))!,
    reconciledRunIds: reconciled.map((r) => r.id),
    run: final,
    adoptedTaskCount: run.adoptedTaskCount,
    tasks: Object.fromEntries(tasks.map((t) => [t.title, t.status])),
    dispatches: await store.dispatches.countDispatchesByStatus(run.id),
    stats,
    crashedTaskId: fixLogin.id,
    zombieReport,
    pendingMessages: await store.messages.countPendingMessages(run.coordinatorHandle),
  };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const report = await runOrchestratorDemo(process.argv[2] ? { url: process.argv[2] } : {});
  console.log('\nsummary:');
  console.log(`  tasks: ${JSON.stringify(report.tasks)}`);
  console.log(`  dispatches: ${JSON.stringify(report.dispatches)}`);
  console.log(
    `  beats: ${report.stats.beats}; workspace busy: ${report.stats.workspaceBusy}; task lease held: ${report.stats.taskLeased}; ` +
      `messages: ${JSON.stringify(report.stats.delivered)}; zombie report: ${report.zombieReport}`,
  );
}
