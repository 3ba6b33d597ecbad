/**
 * One worker process of the failover test (failover.test.ts): it loops over workspace locks,
 * path leases, run starts and messages on a store opened on the cluster's host list, while the
 * parent kills the primary. It records every acknowledged result and every failed attempt, and
 * retries a call the way the README tells callers to: with the same ids after DATABASE_UNAVAILABLE
 * (and any other retry-safe fault), and after COMMIT_OUTCOME_UNKNOWN only where the call is
 * idempotent (a retry finds its own earlier work). A send or delivery whose outcome is unknown is
 * recorded as such and not retried: sending again could queue the message twice.
 *
 * IPC: { type: 'stop' } ends the loop; the worker reports { type: 'report', … } and exits on
 * { type: 'exit' }. Run as a child process so that a crash is the process dying, not a test error.
 */
import { openStore, TaskfenceError, type Store } from '../../src/index.js';

export interface LockRecord {
  readonly workspaceId: string;
  readonly holder: string;
  readonly token: number;
  readonly sentAt: number;
  readonly ackAt: number;
  /** When the release was sent: the end of this holder's belief that it holds the lock. */
  releaseSentAt?: number;
  releaseAckAt?: number;
}

export interface LeaseRecord {
  readonly workspaceId: string;
  readonly key: string;
  readonly holder: string;
  readonly sentAt: number;
  readonly ackAt: number;
  releaseSentAt?: number;
  releaseAckAt?: number;
}

export interface FailedAttempt {
  readonly at: number;
  readonly op: string;
  /** The TaskfenceError's code, or `untyped:<name>:<driver code>`. */
  readonly code: string;
  readonly typed: boolean;
  readonly message: string;
}

export interface WorkerReport {
  readonly index: string;
  rounds: number;
  readonly locks: LockRecord[];
  readonly leases: LeaseRecord[];
  /** Acknowledged run starts: id and when. */
  readonly runs: { id: string; sentAt: number; ackAt: number }[];
  /** Acknowledged sends: message id, inbox, when. */
  readonly sent: { id: string; to: string; sentAt: number; ackAt: number }[];
  /** Acknowledged deliveries: message ids this worker received, with when. */
  readonly delivered: { id: string; sentAt: number; ackAt: number }[];
  readonly failures: FailedAttempt[];
  /** Calls given up on with their outcome unknown (a send or a delivery). */
  unknownOutcomes: number;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** `<phase><n>`: ids carry it, so the phases of one test never share an id. */
const index = process.env.FAILOVER_WORKER_INDEX!;
const slot = Number(index.replace(/\D/g, ''));
const report: WorkerReport = {
  index,
  rounds: 0,
  locks: [],
  leases: [],
  runs: [],
  sent: [],
  delivered: [],
  failures: [],
  unknownOutcomes: 0,
};
let stopping = false;

function codeOf(error: unknown): { code: string; typed: boolean; retrySafe: boolean } {
  if (error instanceof TaskfenceError) {
    const retrySafe =
      (error as { retrySafe?: boolean }).retrySafe === true ||
      error.code === 'DATABASE_UNAVAILABLE' ||
      error.code === 'READ_ONLY';
    return { code: error.code, typed: true, retrySafe };
  }
  const driverCode = (error as { code?: unknown } | null)?.code;
  const name = error instanceof Error ? error.name : typeof error;
  // A raw driver error (a read-only server's 25006 included) is untyped: the analysis fails on it.
  return {
    code: `untyped:${name}:${typeof driverCode === 'string' ? driverCode : ''}`,
    typed: false,
    retrySafe: false,
  };
}

class OutcomeUnknown extends Error {}

/**
 * Runs `fn` until it succeeds. After COMMIT_OUTCOME_UNKNOWN, `idempotent` says whether a retry is
 * safe (else OutcomeUnknown is thrown); `done` codes then count as success (the earlier attempt won).
 */
async function op<T>(
  name: string,
  fn: () => Promise<T>,
  options: { idempotent: boolean; done?: readonly string[] },
): Promise<T | undefined> {
  let unknownOutcome = false;
  for (;;) {
    try {
      return await fn();
    } catch (error) {
      const { code, typed, retrySafe } = codeOf(error);
      report.failures.push({
        at: Date.now(),
        op: name,
        code,
        typed,
        message: (error instanceof Error ? error.message : String(error)).slice(0, 300),
      });
      if (code === 'COMMIT_OUTCOME_UNKNOWN') {
        if (!options.idempotent) throw new OutcomeUnknown(name);
        unknownOutcome = true;
      } else if (unknownOutcome && options.done?.includes(code)) {
        return undefined;
      } else if (!retrySafe) {
        throw error;
      }
      await sleep(20);
    }
  }
}

async function round(store: Store, k: number, ids: Setup, runId: string, handle: string): Promise<void> {
  const tag = `${index}-${k}`;

  // A workspace lock, contended by every worker: claim, hold a moment, release.
  const workspaceId = ids.lockWorkspaces[k % ids.lockWorkspaces.length]!;
  const holder = `h-${tag}`;
  const sentAt = Date.now();
  const claim = await op(
    'claimWorkspaceLock',
    () => store.locks.claimWorkspaceLock(workspaceId, { holder, runId, ttlMs: 120_000 }),
    {
      idempotent: true,
    },
  );
  let token: number | undefined;
  if (claim?.status === 'acquired') token = claim.lease.token;
  else if (claim?.status === 'busy' && claim.heldBy.holder === holder) token = claim.heldBy.token; // our own earlier attempt
  if (token !== undefined) {
    const record: LockRecord = { workspaceId, holder, token, sentAt, ackAt: Date.now() };
    report.locks.push(record);
    // Most holds are short; every fourth spans seconds, so some holds span a switch.
    await sleep(k % 4 === 0 ? 5_000 : 5 + Math.random() * 15);
    record.releaseSentAt = Date.now();
    await op('releaseWorkspaceLock', () => store.locks.releaseWorkspaceLock(workspaceId, { token }), {
      idempotent: true,
      done: ['STALE_WORKSPACE_LOCK'],
    });
    record.releaseAckAt = Date.now();
  }

  // A path lease on one of a few shared paths: acquire, hold, release.
  const key = `src/shared-${k % 3}`;
  const leaseHolder = `p-${tag}`;
  const leaseSent = Date.now();
  const lease = await op(
    'tryAcquirePaths',
    () =>
      store.paths.tryAcquirePaths({
        workspaceId: ids.pathWorkspace,
        holder: leaseHolder,
        paths: [key],
        ttlMs: 120_000,
      }),
    { idempotent: true },
  );
  if (lease?.acquired) {
    const record: LeaseRecord = {
      workspaceId: ids.pathWorkspace,
      key,
      holder: leaseHolder,
      sentAt: leaseSent,
      ackAt: Date.now(),
    };
    report.leases.push(record);
    await sleep(5 + Math.random() * 10);
    record.releaseSentAt = Date.now();
    await op('releasePaths', () => store.paths.releasePaths({ workspaceId: ids.pathWorkspace, holder: leaseHolder }), {
      idempotent: true,
    });
    record.releaseAckAt = Date.now();
  }

  // A run start (idempotent by id and handle), then its stop.
  const runIdK = `r-${tag}`;
  const runSent = Date.now();
  const started = await op(
    'startCoordinatorRun',
    () =>
      store.runs.startCoordinatorRun({ id: runIdK, targetKey: `worktree:${tag}`, coordinatorHandle: `coord-${tag}` }),
    { idempotent: true },
  );
  if (started) {
    report.runs.push({ id: runIdK, sentAt: runSent, ackAt: Date.now() });
    await op('stopCoordinatorRun', () => store.runs.stopCoordinatorRun(runIdK, 'completed'), {
      idempotent: true,
      done: ['COORDINATOR_RUN_NOT_RUNNING'],
    });
  }

  // A message to a shared inbox, and a delivery from it: every worker drains every inbox.
  const to = ids.inboxes[k % ids.inboxes.length]!;
  try {
    const sentAt = Date.now();
    const message = await op(
      'sendMessage',
      () => store.messages.sendMessage({ from: handle, to, kind: 'note', payload: { tag } }),
      {
        idempotent: false,
      },
    );
    if (message) report.sent.push({ id: message.id, to, sentAt, ackAt: Date.now() });
  } catch (error) {
    if (!(error instanceof OutcomeUnknown)) throw error;
    report.unknownOutcomes++;
  }
  try {
    const from = ids.inboxes[(k + slot) % ids.inboxes.length]!;
    const sentAt = Date.now();
    const messages = await op(
      'deliverPendingMessages',
      () => store.messages.deliverPendingMessages(from, { limit: 3 }),
      {
        idempotent: false,
      },
    );
    const ackAt = Date.now();
    for (const m of messages ?? []) report.delivered.push({ id: m.id, sentAt, ackAt });
  } catch (error) {
    if (!(error instanceof OutcomeUnknown)) throw error;
    report.unknownOutcomes++;
  }
}

export interface Setup {
  readonly lockWorkspaces: readonly string[];
  readonly pathWorkspace: string;
  readonly inboxes: readonly string[];
}

async function main(): Promise<void> {
  const url = process.env.FAILOVER_URL!;
  const ids = JSON.parse(process.env.FAILOVER_SETUP!) as Setup;
  // A short write deadline: during the switch calls fail typed (and are retried here) instead of
  // waiting out the default 30 s.
  const store = await openStore({ url, writeDeadlineMs: 1_500, statementTimeoutMs: 5_000, connectTimeoutMs: 2_000 });
  const handle = `worker-${index}`;
  const runId = `run-${index}`;
  await op(
    'startCoordinatorRun',
    () => store.runs.startCoordinatorRun({ id: runId, targetKey: `worker:${index}`, coordinatorHandle: handle }),
    {
      idempotent: true,
    },
  );
  process.on('message', (m: { type: string }) => {
    if (m.type === 'stop') stopping = true;
    if (m.type === 'exit') void store.close().finally(() => process.exit(0));
  });
  process.send!({ type: 'ready' });
  while (!stopping) {
    try {
      await round(store, report.rounds, ids, runId, handle);
    } catch {
      // recorded by op(); the loop goes on, as a service would
    }
    report.rounds++;
  }
  process.send!({ type: 'report', report });
}

main().catch((error) => {
  process.send!({ type: 'fatal', message: error instanceof Error ? `${error.name}: ${error.message}` : String(error) });
  process.exit(1);
});
