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
import { openStore, type CoordinatorRun, type Dispatch, type Store, type TaskStatus } from '../../src/index.js';
import { coordinate, createPlan, runTerminal, type PlannedTask, type ReceivedReport } from './orchestrator.js';

/** Build a release: three roots, a diamond, a join. Higher priority is dispatched first. */
export const PLAN: readonly PlannedTask[] = [
  { name: 'schema', priority: 2 },
  { name: 'design', priority: 1 },
  { name: 'docs' },
  { name: 'api', dependsOn: ['schema'], priority: 1 },
  { name: 'ui', dependsOn: ['schema', 'design'] },
  { name: 'tests', dependsOn: ['api', 'ui'] },
  { name: 'release', dependsOn: ['tests', 'docs'] },
];

/** The task whose first attempt fails, to show the retry. */
export const FLAKY = 'api';

export interface OrchestratorDemoOptions {
  /** Default: `TASKFENCE_DATABASE_URL`, else a SQLite file in a temporary folder (removed afterwards). */
  readonly url?: string;
  /** Where the narration goes (default `console.log`). */
  readonly log?: (line: string) => void;
  /** Simulated terminals (default 2). */
  readonly terminals?: number;
  /**
   * Simulate a coordinator crash between receive and ack: the first coordinator loop dies while
   * handling its first report (before the ack commits), and a new loop takes over the run. The
   * report is handed out again when its lease (1 s here) lapses. Default false.
   */
  readonly crashBeforeAck?: boolean;
}

export interface OrchestratorDemoReport {
  /** Our run, as it ended (stopped `completed`). */
  readonly run: CoordinatorRun;
  /** Every task of the plan, by name. */
  readonly tasks: Readonly<Record<string, TaskStatus>>;
  /** Every dispatch of the run, oldest first, with its task's name. */
  readonly dispatches: readonly (Dispatch & { readonly name: string })[];
  /** The reports the coordinator handled (each acked with its handling), in order, once per message. */
  readonly reports: readonly ReceivedReport[];
  /** With `crashBeforeAck`: the report whose handling the crash cut short (id and attempt then). */
  readonly crashed: { readonly id: string; readonly attempt: number } | null;
  /** Messages left in the inbox (0: every report was received and acked). */
  readonly pendingMessages: number;
}

/** Seeds a company, starts a run, creates the plan, runs the terminals and the coordinator, stops the run. */
export async function runOrchestratorDemo(options: OrchestratorDemoOptions = {}): Promise<OrchestratorDemoReport> {
  const log = options.log ?? ((line: string) => console.log(line));
  const tempDir = options.url || process.env.TASKFENCE_DATABASE_URL ? null : mkdtempSync(join(tmpdir(), 'taskfence-'));
  const url = options.url ?? process.env.TASKFENCE_DATABASE_URL ?? `sqlite:${join(tempDir!, 'orchestrator.db')}`;
  const store = await openStore(url);
  try {
    await store.migrate();
    return await demo(store, log, options.terminals ?? 2, options.crashBeforeAck ?? false);
  } finally {
    await store.close();
    if (tempDir) rmSync(tempDir, { recursive: true, force: true });
  }
}

/** Thrown by the handler to simulate a coordinator process dying mid-report. */
class SimulatedCrash extends Error {}

async function demo(
  store: Store,
  log: (line: string) => void,
  terminals: number,
  crashBeforeAck: boolean,
): Promise<OrchestratorDemoReport> {
  // Fresh ids per run, so the demo can run again on the same database.
  const ns = randomUUID().slice(0, 8);
  const company = await store.org.createCompany({ id: `acme-${ns}`, name: 'Acme' });
  const targetKey = `worktree:release-${ns}`;

  const run = await store.runs.startCoordinatorRun({ targetKey, spec: 'examples/orchestrator' });
  log(`run ${run.id} started on ${targetKey}; inbox ${run.coordinatorHandle}`);
  const ids = await createPlan(store, { companyId: company.id, targetKey }, PLAN);
  const names = new Map([...ids].map(([name, id]) => [id, name]));

  // The work: a few heartbeats apart; the first attempt at FLAKY throws.
  let flakyFailed = false;
  const work = async (name: string, heartbeat: () => Promise<void>) => {
    for (let step = 0; step < 2; step++) {
      await new Promise((resolve) => setTimeout(resolve, 10));
      await heartbeat();
    }
    if (name === FLAKY && !flakyFailed) {
      flakyFailed = true;
      throw new Error('flaky test run');
    }
    return { built: name };
  };

  let finished = false;
  const terminalRuns = Array.from({ length: terminals }, (_, i) =>
    runTerminal(store, {
      runId: run.id,
      coordinatorHandle: run.coordinatorHandle,
      terminalHandle: `${run.coordinatorHandle}/terminal-${i + 1}`,
      work,
      ttlMs: 5_000,
      idleMs: 10,
      stop: () => finished,
    }),
  );
  // Handled reports by message id: the handler may run again for one message (a retried
  // transaction, a redelivery after an ack that did not commit), and must not count it twice.
  const handled = new Map<string, ReceivedReport>();
  let crashed: { id: string; attempt: number } | null = null;
  const handle = (report: ReceivedReport) => {
    if (crashBeforeAck && crashed === null) {
      crashed = { id: report.id, attempt: report.attempt };
      throw new SimulatedCrash(`coordinator died handling ${report.id}`);
    }
    if (handled.has(report.id)) return;
    handled.set(report.id, report);
    const terminal = report.from.slice(report.from.lastIndexOf('/') + 1);
    log(
      report.kind === 'task.done'
        ? `${terminal}: ${report.payload.name} done`
        : `${terminal}: ${report.payload.name} failed (${report.payload.error}); task is ${report.payload.taskStatus} again`,
    );
  };
  try {
    for (;;) {
      try {
        await coordinate(store, run, {
          pollMs: 10,
          deadlineMs: 30_000,
          visibilityMs: crashBeforeAck ? 1_000 : 10_000,
          onReport: (_tx, report) => handle(report),
        });
        break;
      } catch (error) {
        if (!(error instanceof SimulatedCrash)) throw error;
        // A new coordinator process would start here: same run, the crashed one's receipts unacked.
        log(`coordinator crashed before its ack (${error.message}); restarting`);
      }
    }
  } finally {
    finished = true;
    await Promise.all(terminalRuns);
  }

  const final = await store.runs.stopCoordinatorRun(run.id, 'completed');
  log(`run ${final.id} stopped: ${final.status}`);
  const tasks = await store.tasks.listTasks({ runId: run.id });
  const dispatches = await store.dispatches.listDispatches({ runId: run.id });
  return {
    run: final,
    tasks: Object.fromEntries(tasks.map((t) => [names.get(t.id)!, t.status])),
    dispatches: dispatches.map((d) => ({ ...d, name: names.get(d.taskId)! })),
    reports: [...handled.values()],
    crashed,
    pendingMessages: await store.messages.countPendingMessages(run.coordinatorHandle),
  };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const report = await runOrchestratorDemo(process.argv[2] ? { url: process.argv[2] } : {});
  console.log('\nsummary:');
  console.log(`  tasks: ${JSON.stringify(report.tasks)}`);
  console.log(`  dispatch order: ${report.dispatches.map((d) => `${d.name} (${d.status})`).join(', ')}`);
  console.log(`  inbox left: ${report.pendingMessages}`);
}
