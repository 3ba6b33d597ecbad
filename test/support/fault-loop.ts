/**
 * A service that loops over every repository area while the parent test injects faults (see
 * test/suites/faults.suite.ts). Run as a child process, so that a crash — an unhandled `error`
 * event on a pg client — is visible as the process dying rather than hidden by the test runner.
 *
 * Every logical operation is retried with the same ids on DATABASE_UNAVAILABLE and
 * COMMIT_OUTCOME_UNKNOWN until it succeeds, as the README tells callers to. After a
 * COMMIT_OUTCOME_UNKNOWN, the domain answer of a retry that finds its own earlier work (a stopped
 * run already stopped, a lock held by this holder) counts as done. Anything else is recorded.
 *
 * Protocol (IPC): the parent sends { type: 'stop' } to end the fault phase; the child then runs one
 * more round whose calls must each succeed at the first attempt, reports { type: 'report', … } and
 * waits for { type: 'exit' } (so the parent can inspect pg_stat_activity while it is still connected).
 */
import { openStore, TaskfenceError, type Store } from '../../src/index.js';

const RETRY = new Set(['DATABASE_UNAVAILABLE', 'COMMIT_OUTCOME_UNKNOWN']);

interface Report {
  iterations: number;
  /** Outcomes by error code (or 'untyped'), counted per failed attempt. */
  failures: Record<string, number>;
  /** Every error that was not a TaskfenceError: must stay empty. */
  untyped: string[];
  /** Errors of the final round, which must be empty: after the faults stop, the next call works. */
  finalRound: string[];
  ids: { tasks: string[]; runs: string[]; companies: string[]; environments: string[] };
}

const report: Report = {
  iterations: 0,
  failures: {},
  untyped: [],
  finalRound: [],
  ids: { tasks: [], runs: [], companies: [], environments: [] },
};
let stopping = false;

function record(error: unknown): string {
  if (error instanceof TaskfenceError) {
    report.failures[error.code] = (report.failures[error.code] ?? 0) + 1;
    return error.code;
  }
  report.failures.untyped = (report.failures.untyped ?? 0) + 1;
  report.untyped.push(error instanceof Error ? `${error.name}: ${error.message}` : String(error));
  return 'untyped';
}

/** Runs `fn` until it succeeds; `done` codes count as success once an earlier attempt's commit outcome was unknown. */
async function op<T>(fn: () => Promise<T>, done: readonly string[] = []): Promise<T | undefined> {
  let unknownOutcome = false;
  for (;;) {
    try {
      return await fn();
    } catch (error) {
      const code = record(error);
      if (code === 'COMMIT_OUTCOME_UNKNOWN') unknownOutcome = true;
      if (unknownOutcome && done.includes(code)) return undefined;
      if (!RETRY.has(code)) throw error;
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
  }
}

async function round(store: Store, i: number, ids: { companyId: string; workspaceId: string }): Promise<void> {
  const tag = `${process.pid}-${i}`;
  const task = await op(() =>
    store.tasks.createTask({
      id: `t-${tag}`,
      companyId: ids.companyId,
      title: `task ${i}`,
      requiresFilesystem: false,
      status: 'ready',
    }),
  );
  report.ids.tasks.push(`t-${tag}`);
  const other = await op(() =>
    store.tasks.createTask({
      id: `t2-${tag}`,
      companyId: ids.companyId,
      title: `other ${i}`,
      requiresFilesystem: false,
    }),
  );
  report.ids.tasks.push(`t2-${tag}`);
  const run = await op(() => store.runs.startCoordinatorRun({ id: `r-${tag}`, targetKey: `worktree:${tag}` }));
  report.ids.runs.push(`r-${tag}`);
  await op(() => store.runs.heartbeatCoordinatorRun(run!.id));

  const holder = `holder-${tag}`;
  const claim = await op(() =>
    store.locks.claimWorkspaceLock(ids.workspaceId, { holder, runId: run!.id, ttlMs: 60_000 }),
  );
  let token: number | undefined;
  if (claim?.status === 'acquired') token = claim.lease.token;
  else if (claim?.status === 'busy' && claim.heldBy.holder === holder) token = claim.heldBy.token; // our own earlier claim
  if (token !== undefined)
    await op(() => store.locks.releaseWorkspaceLock(ids.workspaceId, { token: token }), ['STALE_WORKSPACE_LOCK']);

  await op(() =>
    store.paths.tryAcquirePaths({ workspaceId: ids.workspaceId, holder, paths: [`src/${tag}`], ttlMs: 60_000 }),
  );
  await op(() => store.paths.releasePaths({ workspaceId: ids.workspaceId, holder }));

  await op(() =>
    store.messages.sendMessage({
      from: run!.coordinatorHandle,
      to: `inbox-${process.pid}`,
      kind: 'note',
      payload: { i },
    }),
  );
  await op(() => store.messages.deliverPendingMessages(`inbox-${process.pid}`));

  const gate = await op(() => store.gates.openGate({ question: `q ${i}`, runId: run!.id }));
  if (gate) await op(() => store.gates.resolveGate(gate.id, 'yes'), ['GATE_ALREADY_RESOLVED']);

  const env = await op(() =>
    store.ownership.createEnvironment({ id: `e-${tag}`, ownerTaskId: task!.id, rootPath: `/work/${tag}` }),
  );
  report.ids.environments.push(`e-${tag}`);
  if (env && other) {
    await op(
      () =>
        store.ownership.transferEnvironmentOwnership({
          environmentId: env.id,
          expectedOwnerTaskId: task!.id,
          expectedGeneration: env.generation,
          newOwnerTaskId: other.id,
        }),
      ['STALE_OWNERSHIP', 'OWNERSHIP_CHANGED'],
    );
  }
  await op(() => store.runs.stopCoordinatorRun(run!.id, 'completed'), ['COORDINATOR_RUN_NOT_RUNNING']);
  await op(() => store.tasks.listTasks({ runId: run!.id }));
}

async function main(): Promise<void> {
  const url = process.env.FAULT_URL!;
  const store = await openStore({ url, writeDeadlineMs: 20_000, statementTimeoutMs: 10_000 });
  const companyId = `c-${process.pid}`;
  await op(() => store.org.createCompany({ id: companyId, name: 'Faults Inc' }));
  report.ids.companies.push(companyId);
  const workspace = await op(() => store.org.createWorkspace({ id: `w-${process.pid}`, companyId, name: 'main' }));
  const ids = { companyId, workspaceId: workspace!.id };

  process.on('message', (m: { type: string }) => {
    if (m.type === 'stop') stopping = true;
    if (m.type === 'exit') void store.close().finally(() => process.exit(0));
  });
  process.send!({ type: 'ready' });
  while (!stopping) {
    try {
      await round(store, report.iterations, ids);
    } catch {
      // recorded by op(); the loop goes on, as a service would
    }
    report.iterations++;
  }
  // The faults stopped: the next call of every area must work at its first attempt.
  const before = JSON.stringify(report.failures);
  try {
    await round(store, report.iterations, ids);
  } catch (error) {
    report.finalRound.push(error instanceof Error ? `${error.name}: ${error.message}` : String(error));
  }
  if (JSON.stringify(report.failures) !== before)
    report.finalRound.push(`failures after the faults stopped: ${JSON.stringify(report.failures)} (was ${before})`);
  process.send!({ type: 'report', report });
}

main().catch((error) => {
  process.send!({ type: 'fatal', message: error instanceof Error ? `${error.name}: ${error.message}` : String(error) });
  process.exit(1);
});
