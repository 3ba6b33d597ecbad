import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { MAX_ID_LENGTH, MAX_TEXT_LENGTH, MAX_WRITE_PATHS, TaskfenceError, type Store } from '../../src/index.js';
import type { DialectFixture } from '../support/fixtures.js';
import { databaseState } from '../support/db-state.js';

/**
 * Property-based fuzzing of the public repository API (issue 12). Every argument of every public
 * repository function gets a mix of plausible values (existing ids, fresh ids, sane numbers) and
 * hostile ones (wrong types, NUL, lone surrogates, huge/negative/non-finite numbers, BigInt,
 * circular objects, very long strings, huge arrays). Invariant: the call resolves, or throws a
 * `TaskfenceError` with a documented code; a refusal leaves every row and the schema as they were;
 * no raw driver error, TypeError or hang escapes.
 *
 * Runs per function: `FUZZ_RUNS` (default 100 on SQLite, 40 on PostgreSQL). The seed is printed by fast-check on a failure;
 * `FUZZ_SEED` replays one.
 */
const RUNS = (kind: 'sqlite' | 'postgres') => Number(process.env.FUZZ_RUNS ?? (kind === 'sqlite' ? 100 : 40));
const CALL_TIMEOUT_MS = 15_000;
/** `FUZZ_EXCLUDE`: a regular expression of function names to leave out (for bisecting a failure). */
const EXCLUDE = process.env.FUZZ_EXCLUDE ? new RegExp(process.env.FUZZ_EXCLUDE) : null;

/** The codes the README's errors table documents for repository calls. */
const DOCUMENTED_CODES = new Set([
  'ALREADY_EXISTS',
  'CLEANUP_ALREADY_COMPLETED',
  'CLEANUP_BARRIER',
  'CLEANUP_CLAIM_LOST',
  'CLEANUP_IN_PROGRESS',
  'COORDINATOR_HANDLE_TAKEN',
  'COORDINATOR_RUN_CONFLICT',
  'COORDINATOR_RUN_NOT_RUNNING',
  'DISPATCH_ALREADY_ACTIVE',
  'DISPATCH_LEASE_LOST',
  'DISPATCH_NOT_ACTIVE',
  'DISPATCH_RUN_MISMATCH',
  'GATE_ALREADY_RESOLVED',
  'GATE_NOT_RESOLVED',
  'GATE_OPEN',
  'IDEMPOTENCY_KEY_CONFLICT',
  'INVALID_ARGUMENT',
  'INVALID_WRITE_PATH',
  'NOT_FOUND',
  'OWNERSHIP_CHANGED',
  'PARENT_CHANGED',
  'PATH_CLAIM_REFUSED',
  'PATH_LEASE_LOST',
  'TRANSACTION_ABORTED',
  'PATH_LEASE_TIMEOUT',
  'RESOLUTION_ALREADY_CONSUMED',
  'STALE_OWNERSHIP',
  'STALE_TASK_LEASE',
  'SEMAPHORE_LEASE_LOST',
  'SEMAPHORE_TIMEOUT',
  'STALE_WORKSPACE_LOCK',
  'TASK_DEPENDENCY_REFUSED',
  'TASK_NOT_DISPATCHABLE',
  'TASK_TRANSITION_REFUSED',
  'TERMINAL_BUSY',
  'UNKNOWN_RECIPIENT',
  'WORKSPACE_CONFIGURATION',
  'WORKSPACE_UNRESOLVED',
]);

/**
 * Refusals that by contract record something: a stale cleanup snapshot is marked `stale`
 * (STALE_OWNERSHIP), a task-runner dispatch whose workspace cannot be resolved has claimed
 * and released the task lease (WORKSPACE_UNRESOLVED), and a semaphore wait that timed out has
 * reclaimed the expired slots it found on its tries (SEMAPHORE_TIMEOUT). Every other refusal
 * changes nothing.
 */
const RECORDING_REFUSALS = new Set(['STALE_OWNERSHIP', 'WORKSPACE_UNRESOLVED', 'SEMAPHORE_TIMEOUT']);

const circular = (): unknown => {
  const o: Record<string, unknown> = { a: 1 };
  o.self = o;
  return o;
};

/** Values no argument of the API accepts (or accepts only by refusing with a typed error). */
const hostile: fc.Arbitrary<unknown> = fc.oneof(
  fc.constantFrom(
    undefined,
    null,
    true,
    false,
    0,
    -1,
    1.5,
    Number.NaN,
    Number.POSITIVE_INFINITY,
    Number.NEGATIVE_INFINITY,
    1e19,
    1e300,
    -1e300,
    2 ** 60,
  ),
  fc.constantFrom(Number.MAX_SAFE_INTEGER + 2, Number.MIN_SAFE_INTEGER, -0, '', ' ', '\t\n'),
  fc.bigInt(),
  fc.constantFrom('a\u0000b', '\u0000', 'x\ud800', '\udfff', 'ok\udc00ok', '\ud83d'),
  fc.constantFrom('x'.repeat(MAX_ID_LENGTH + 1), 'y'.repeat(MAX_TEXT_LENGTH + 1)),
  fc.string({ unit: 'binary', maxLength: 12 }),
  fc.integer(),
  fc.double(),
  fc.constantFrom({}, { a: 1 }, [], ['a'], [1, 2], () => 1, Symbol('s'), new Date(0), /x/),
  fc.constant(null).map(circular),
  fc.constant(null).map(() => Array.from({ length: MAX_WRITE_PATHS + 1 }, (_, i) => `p${i}`)),
);

/** An argument: usually plausible, sometimes hostile. */
const arg = (valid: fc.Arbitrary<unknown>) =>
  fc.oneof({ weight: 3, arbitrary: valid }, { weight: 1, arbitrary: hostile });

/** An optional field: often left out (`undefined`), else plausible or hostile. */
const OPTIONAL = Symbol('optional');
const opt = (valid: fc.Arbitrary<unknown>) =>
  Object.assign(fc.oneof(fc.constant(undefined), field(valid)), { [OPTIONAL]: true });

/** A field of an input object: mostly plausible, so that calls get past validation and reach the database. */
const field = (valid: fc.Arbitrary<unknown>) =>
  fc.oneof(
    { weight: 12, arbitrary: valid },
    { weight: 1, arbitrary: hostile },
    { weight: 1, arbitrary: fc.constant(undefined) },
  );

/** An input object whose fields may be missing, plausible or hostile; sometimes not an object at all. */
const input = (fields: Record<string, fc.Arbitrary<unknown>>) =>
  fc.oneof(
    {
      weight: 8,
      arbitrary: fc.record(
        Object.fromEntries(Object.entries(fields).map(([k, v]) => [k, OPTIONAL in v ? v : field(v)])),
      ),
    },
    {
      weight: 1,
      arbitrary: fc.record(Object.fromEntries(Object.entries(fields).map(([k, v]) => [k, arg(v)])), {
        requiredKeys: [],
      }),
    },
    { weight: 1, arbitrary: hostile },
  );

interface Pools {
  company: string[];
  workspace: string[];
  agent: string[];
  project: string[];
  task: string[];
  run: string[];
  dispatch: string[];
  gate: string[];
  environment: string[];
  group: string[];
  snapshot: string[];
  handle: string[];
}

interface FuzzCase {
  readonly name: string;
  readonly args: fc.Arbitrary<unknown[]>;
  readonly call: (store: Store, args: unknown[]) => Promise<unknown>;
}

function cases(p: Pools): FuzzCase[] {
  const pick = (pool: string[]) =>
    fc.oneof(
      { weight: 3, arbitrary: fc.constantFrom(...pool) },
      { weight: 1, arbitrary: fc.string({ minLength: 1, maxLength: 16 }) },
    );
  const id = {
    company: pick(p.company),
    workspace: pick(p.workspace),
    agent: pick(p.agent),
    project: pick(p.project),
    task: pick(p.task),
    run: pick(p.run),
    dispatch: pick(p.dispatch),
    gate: pick(p.gate),
    environment: pick(p.environment),
    group: pick(p.group),
    snapshot: pick(p.snapshot),
    handle: pick(p.handle),
    fresh: fc.uuid(),
  };
  const text = fc.string({ minLength: 1, maxLength: 40 });
  const ttl = fc.integer({ min: 1, max: 3_600_000 });
  const token = fc.integer({ min: 1, max: 50 });
  const paths = fc.array(fc.constantFrom('src', 'src/a.ts', 'docs', '.', 'lib/x/y', '*.md', '../x', 'a\\b', ''), {
    maxLength: 5,
  });
  const taskStatus = fc.constantFrom(
    'backlog',
    'todo',
    'ready',
    'dispatched',
    'in_progress',
    'blocked',
    'done',
    'failed',
    'cancelled',
  );
  const runStatus = fc.constantFrom('running', 'completed', 'failed', 'cancelled');
  const dispatchStatus = fc.constantFrom('active', 'completed', 'failed', 'cancelled');
  const targetKey = fc.oneof(fc.constant(null), fc.constantFrom('worktree:a', 'worktree:b'));
  const claim = input({
    snapshotId: id.snapshot,
    claimant: id.handle,
    expiresAt: fc.integer(),
    attempt: fc.integer(),
    target: input({
      kind: fc.constantFrom('environment', 'group'),
      id: fc.oneof(id.environment, id.group),
      ownerTaskId: id.task,
      generation: token,
      rootPath: text,
    }),
  });
  const tuple = (...a: fc.Arbitrary<unknown>[]): fc.Arbitrary<unknown[]> => fc.tuple(...a);
  /** A grant as a claim returns it (sometimes of another kind), for renew / release. */
  const lease = (kind: string, resource: fc.Arbitrary<string>) =>
    input({
      kind: fc.oneof({ weight: 4, arbitrary: fc.constant(kind) }, { weight: 1, arbitrary: fc.constant('task_lease') }),
      resource,
      holder: id.handle,
      token,
      expiresAt: fc.integer(),
      limit: fc.integer({ min: 1, max: 4 }),
    });
  /** A path-lease grant as a claim returns it, with its keys and task. */
  const pathLease = input({
    kind: fc.oneof(
      { weight: 4, arbitrary: fc.constant('path_lease') },
      { weight: 1, arbitrary: fc.constant('semaphore') },
    ),
    resource: id.workspace,
    workspaceId: id.workspace,
    holder: id.handle,
    token,
    expiresAt: fc.integer(),
    keys: fc.oneof(fc.constant([]), fc.constant(['src']), paths),
    taskId: fc.oneof(fc.constant(null), id.task),
  });
  const c = (
    name: string,
    args: fc.Arbitrary<unknown[]>,
    call: (s: Store, a: unknown[]) => Promise<unknown>,
  ): FuzzCase => ({ name, args, call });

  const A = (a: unknown[]) => a as any[];
  return [
    c('org.createCompany', tuple(input({ id: id.fresh, name: text })), (s, a) => s.org.createCompany(A(a)[0])),
    c(
      'org.createWorkspace',
      tuple(input({ id: id.fresh, companyId: id.company, name: text, rootPath: text })),
      (s, a) => s.org.createWorkspace(A(a)[0]),
    ),
    c(
      'org.createAgent',
      tuple(
        input({
          id: id.fresh,
          companyId: id.company,
          name: text,
          role: text,
          department: text,
          workspaceId: id.workspace,
        }),
      ),
      (s, a) => s.org.createAgent(A(a)[0]),
    ),
    c(
      'org.createProject',
      tuple(input({ id: id.fresh, companyId: id.company, name: text, primaryWorkspaceId: id.workspace })),
      (s, a) => s.org.createProject(A(a)[0]),
    ),
    c('org.getWorkspace', tuple(arg(id.workspace)), (s, a) => s.org.getWorkspace(A(a)[0])),
    c('org.getAgent', tuple(arg(id.agent)), (s, a) => s.org.getAgent(A(a)[0])),
    c('org.getProject', tuple(arg(id.project)), (s, a) => s.org.getProject(A(a)[0])),
    c('org.requireAgent', tuple(arg(id.agent)), (s, a) => s.org.requireAgent(A(a)[0])),

    c(
      'tasks.createTask',
      tuple(
        input({
          id: id.fresh,
          companyId: id.company,
          title: text,
          description: text,
          status: taskStatus,
          projectId: id.project,
          assigneeAgentId: id.agent,
          workspaceId: id.workspace,
          requiresFilesystem: fc.boolean(),
          targetKey,
          parentId: id.task,
          workspaceMode: fc.constantFrom('isolated', 'shared', null),
          writes: fc.oneof(fc.constant(null), paths),
          priority: fc.oneof(fc.integer({ min: -5, max: 5 }), fc.double()),
          spec: fc.oneof(text, fc.constant({ a: 1 })),
          dependsOn: fc.array(id.task, { maxLength: 3 }),
        }),
      ),
      (s, a) => s.tasks.createTask(A(a)[0]),
    ),
    c('tasks.transitionTask', tuple(arg(id.task), input({ from: taskStatus, to: taskStatus, reason: text })), (s, a) =>
      s.tasks.transitionTask(A(a)[0], A(a)[1]),
    ),
    c('tasks.addDependency', tuple(arg(id.task), arg(id.task)), (s, a) => s.tasks.addDependency(A(a)[0], A(a)[1])),
    c('tasks.listDependencies', tuple(arg(id.task)), (s, a) => s.tasks.listDependencies(A(a)[0])),
    c('tasks.getTask', tuple(arg(id.task)), (s, a) => s.tasks.getTask(A(a)[0])),
    c('tasks.requireTask', tuple(arg(id.task)), (s, a) => s.tasks.requireTask(A(a)[0])),
    c(
      'tasks.listTasks',
      tuple(input({ runId: id.run, status: fc.oneof(taskStatus, fc.array(taskStatus)), targetKey, parentId: id.task })),
      (s, a) => s.tasks.listTasks(A(a)[0]),
    ),

    c('runs.startCoordinatorRun', tuple(input({ targetKey, spec: text, coordinatorHandle: id.handle })), (s, a) =>
      s.runs.startCoordinatorRun(A(a)[0]),
    ),
    c('runs.tryStartCoordinatorRun', tuple(input({ targetKey, spec: text, coordinatorHandle: id.handle })), (s, a) =>
      s.runs.tryStartCoordinatorRun(A(a)[0]),
    ),
    c('runs.adoptUnownedTasks', tuple(arg(id.run), arg(targetKey)), (s, a) =>
      s.runs.adoptUnownedTasks(A(a)[0], A(a)[1]),
    ),
    c('runs.getActiveCoordinatorRunForTarget', tuple(arg(targetKey)), (s, a) =>
      s.runs.getActiveCoordinatorRunForTarget(A(a)[0]),
    ),
    c('runs.getCoordinatorRun', tuple(arg(id.run)), (s, a) => s.runs.getCoordinatorRun(A(a)[0])),
    c(
      'runs.listCoordinatorRuns',
      tuple(input({ status: fc.oneof(runStatus, fc.array(runStatus)), targetKey })),
      (s, a) => s.runs.listCoordinatorRuns(A(a)[0]),
    ),
    c('runs.stopCoordinatorRun', tuple(arg(id.run), arg(runStatus)), (s, a) =>
      s.runs.stopCoordinatorRun(A(a)[0], A(a)[1]),
    ),
    c('runs.heartbeatCoordinatorRun', tuple(arg(id.run)), (s, a) => s.runs.heartbeatCoordinatorRun(A(a)[0])),
    c('runs.reconcileStaleRuns', tuple(input({ staleAfterMs: ttl })), (s, a) => s.runs.reconcileStaleRuns(A(a)[0])),

    c(
      'dispatches.createDispatch',
      tuple(input({ taskId: id.task, terminalHandle: id.handle, agentId: id.agent, runId: opt(id.run) })),
      (s, a) => s.dispatches.createDispatch(A(a)[0]),
    ),
    c('dispatches.getDispatch', tuple(arg(id.dispatch)), (s, a) => s.dispatches.getDispatch(A(a)[0])),
    c('dispatches.getActiveDispatchForTerminal', tuple(arg(id.handle)), (s, a) =>
      s.dispatches.getActiveDispatchForTerminal(A(a)[0]),
    ),
    c(
      'dispatches.failActiveDispatchOnExit',
      tuple(arg(id.handle), input({ error: text, dispatchId: id.dispatch })),
      (s, a) => s.dispatches.failActiveDispatchOnExit(A(a)[0], A(a)[1]),
    ),
    c(
      'dispatches.endDispatch',
      tuple(arg(id.dispatch), arg(dispatchStatus), input({ lease: lease('dispatch', id.dispatch) })),
      (s, a) => s.dispatches.endDispatch(A(a)[0], A(a)[1], A(a)[2]),
    ),
    c(
      'dispatches.dispatchNext',
      tuple(
        input({
          runId: id.run,
          terminalHandle: id.handle,
          agentId: id.agent,
          filter: input({ assigneeAgentId: id.agent, minPriority: fc.oneof(fc.integer(), fc.double()) }),
          ttlMs: ttl,
        }),
      ),
      (s, a) => s.dispatches.dispatchNext(A(a)[0]),
    ),
    c(
      'dispatches.dispatchNextBatch',
      tuple(
        input({
          runId: id.run,
          terminalHandles: fc.array(id.handle, { maxLength: 3 }),
          agentId: id.agent,
          limit: fc.integer({ min: -1, max: 4 }),
          ttlMs: ttl,
        }),
      ),
      (s, a) => s.dispatches.dispatchNextBatch(A(a)[0]),
    ),
    c(
      'dispatches.completeDispatch',
      tuple(arg(id.dispatch), input({ result: text, lease: lease('dispatch', id.dispatch) })),
      (s, a) => s.dispatches.completeDispatch(A(a)[0], A(a)[1]),
    ),
    c('dispatches.heartbeatDispatch', tuple(lease('dispatch', id.dispatch), input({ ttlMs: ttl })), (s, a) =>
      s.dispatches.heartbeatDispatch(A(a)[0], A(a)[1]),
    ),
    c(
      'dispatches.reclaimExpiredDispatches',
      tuple(input({ runId: id.run, limit: fc.integer({ min: -1, max: 5 }) })),
      (s, a) => s.dispatches.reclaimExpiredDispatches(A(a)[0]),
    ),
    c(
      'dispatches.listDispatches',
      tuple(
        input({
          runId: id.run,
          taskId: id.task,
          terminalHandle: id.handle,
          status: fc.oneof(dispatchStatus, fc.array(dispatchStatus)),
        }),
      ),
      (s, a) => s.dispatches.listDispatches(A(a)[0]),
    ),
    c('dispatches.countDispatchesByStatus', tuple(arg(id.run)), (s, a) =>
      s.dispatches.countDispatchesByStatus(A(a)[0]),
    ),

    c(
      'gates.openGate',
      tuple(
        input({
          question: text,
          taskId: opt(id.task),
          runId: opt(id.run),
          ttlMs: opt(fc.integer({ min: 0, max: 60_000 })),
        }),
      ),
      (s, a) => s.gates.openGate(A(a)[0]),
    ),
    c('gates.expireGates', tuple(opt(input({ runId: id.run }))), (s, a) => s.gates.expireGates(A(a)[0])),
    c('gates.getGate', tuple(arg(id.gate)), (s, a) => s.gates.getGate(A(a)[0])),
    c('gates.resolveGate', tuple(arg(id.gate), arg(text)), (s, a) => s.gates.resolveGate(A(a)[0], A(a)[1])),
    c('gates.listOpenGates', tuple(arg(id.run)), (s, a) => s.gates.listOpenGates(A(a)[0])),
    c('gates.consumeResolution', tuple(arg(id.gate), input({ consumer: text, idempotencyKey: opt(text) })), (s, a) =>
      s.gates.consumeResolution(A(a)[0], A(a)[1]),
    ),

    c(
      'messages.sendMessage',
      tuple(input({ from: id.handle, to: id.handle, kind: text, payload: fc.oneof(fc.jsonValue(), hostile) })),
      (s, a) => s.messages.sendMessage(A(a)[0]),
    ),
    c(
      'messages.deliverPendingMessages',
      tuple(arg(id.handle), input({ limit: fc.integer({ min: 1, max: 50 }) })),
      (s, a) => s.messages.deliverPendingMessages(A(a)[0], A(a)[1]),
    ),
    c('messages.countPendingMessages', tuple(arg(id.handle)), (s, a) => s.messages.countPendingMessages(A(a)[0])),
    c(
      'messages.receiveMessages',
      tuple(
        arg(id.handle),
        opt(input({ limit: fc.integer({ min: 0, max: 50 }), visibilityMs: fc.integer({ min: 0, max: 120_000 }) })),
      ),
      (s, a) => s.messages.receiveMessages(A(a)[0], A(a)[1]),
    ),
    c(
      'messages.ackMessages',
      tuple(
        arg(id.handle),
        arg(fc.array(fc.oneof(fc.uuid(), text), { maxLength: 4 })),
        opt(input({ idempotencyKey: text })),
      ),
      (s, a) => s.messages.ackMessages(A(a)[0], A(a)[1], A(a)[2]),
    ),
    c(
      'messages.releaseMessages',
      tuple(
        arg(id.handle),
        arg(fc.array(fc.oneof(fc.uuid(), text), { maxLength: 4 })),
        opt(input({ delayMs: fc.integer({ min: 0, max: 60_000 }), error: text, idempotencyKey: text })),
      ),
      (s, a) => s.messages.releaseMessages(A(a)[0], A(a)[1], A(a)[2]),
    ),
    c(
      'messages.listDeadMessages',
      tuple(arg(id.handle), opt(input({ limit: fc.integer({ min: 0, max: 50 }) }))),
      (s, a) => s.messages.listDeadMessages(A(a)[0], A(a)[1]),
    ),
    c(
      'messages.requeueDeadMessages',
      tuple(arg(id.handle), arg(fc.array(fc.oneof(fc.uuid(), text), { maxLength: 4 }))),
      (s, a) => s.messages.requeueDeadMessages(A(a)[0], A(a)[1]),
    ),

    c(
      'locks.claimWorkspaceLock',
      tuple(arg(id.workspace), input({ holder: id.handle, runId: id.run, ttlMs: ttl })),
      (s, a) => s.locks.claimWorkspaceLock(A(a)[0], A(a)[1]),
    ),
    c('locks.renewWorkspaceLock', tuple(arg(id.workspace), input({ token, ttlMs: ttl })), (s, a) =>
      s.locks.renewWorkspaceLock(A(a)[0], A(a)[1]),
    ),
    c('locks.releaseWorkspaceLock', tuple(arg(id.workspace), input({ token })), (s, a) =>
      s.locks.releaseWorkspaceLock(A(a)[0], A(a)[1]),
    ),
    c('locks.getWorkspaceLock', tuple(arg(id.workspace)), (s, a) => s.locks.getWorkspaceLock(A(a)[0])),
    c('locks.claimTaskLease', tuple(arg(id.task), input({ holder: id.handle, ttlMs: ttl })), (s, a) =>
      s.locks.claimTaskLease(A(a)[0], A(a)[1]),
    ),
    c('locks.renewTaskLease', tuple(arg(id.task), input({ token, ttlMs: ttl })), (s, a) =>
      s.locks.renewTaskLease(A(a)[0], A(a)[1]),
    ),
    c('locks.releaseTaskLease', tuple(arg(id.task), input({ token })), (s, a) =>
      s.locks.releaseTaskLease(A(a)[0], A(a)[1]),
    ),
    c('locks.getTaskLease', tuple(arg(id.task)), (s, a) => s.locks.getTaskLease(A(a)[0])),
    c('locks.renewWorkspaceLock (lease)', tuple(lease('workspace_lock', id.workspace), input({ ttlMs: ttl })), (s, a) =>
      s.locks.renewWorkspaceLock(A(a)[0], A(a)[1]),
    ),
    c('locks.releaseWorkspaceLock (lease)', tuple(lease('workspace_lock', id.workspace)), (s, a) =>
      s.locks.releaseWorkspaceLock(A(a)[0]),
    ),
    c('locks.renewTaskLease (lease)', tuple(lease('task_lease', id.task), input({ ttlMs: ttl })), (s, a) =>
      s.locks.renewTaskLease(A(a)[0], A(a)[1]),
    ),
    c('locks.releaseTaskLease (lease)', tuple(lease('task_lease', id.task)), (s, a) =>
      s.locks.releaseTaskLease(A(a)[0]),
    ),
    c(
      'semaphores.acquire',
      tuple(arg(id.handle), input({ holder: id.handle, limit: fc.integer({ min: 1, max: 4 }), ttlMs: ttl })),
      (s, a) => s.semaphores.acquire(A(a)[0], A(a)[1]),
    ),
    c(
      'semaphores.acquireWait',
      tuple(
        arg(id.handle),
        input({ holder: id.handle, limit: fc.integer({ min: 1, max: 4 }), ttlMs: ttl }),
        input({ timeoutMs: fc.integer({ min: 0, max: 20 }), maxPollMs: fc.integer({ min: 1, max: 10 }) }),
      ),
      // A valid timeout is kept short, as for acquirePaths: the slot may really be taken for long.
      (s, a) => s.semaphores.acquireWait(A(a)[0], A(a)[1], boundedWait(A(a)[2], 20)),
    ),
    c('semaphores.renew', tuple(lease('semaphore', id.handle), input({ ttlMs: ttl })), (s, a) =>
      s.semaphores.renew(A(a)[0], A(a)[1]),
    ),
    c('semaphores.release', tuple(lease('semaphore', id.handle)), (s, a) => s.semaphores.release(A(a)[0])),
    c('semaphores.listHolders', tuple(arg(id.handle)), (s, a) => s.semaphores.listHolders(A(a)[0])),

    c(
      'scheduler.resolveWorkspaceWithLockMode',
      tuple(
        input({ id: id.task, workspaceId: id.workspace, requiresFilesystem: fc.boolean(), projectId: id.project }),
        input({ id: id.agent, workspaceId: id.workspace }),
      ),
      (s, a) => s.scheduler.resolveWorkspaceWithLockMode(A(a)[0], A(a)[1]),
    ),
    c(
      'scheduler.dispatchRun',
      tuple(
        input({
          taskId: id.task,
          agentId: id.agent,
          runId: id.run,
          mode: fc.constantFrom('heartbeat', 'task-runner'),
          ttlMs: ttl,
        }),
      ),
      (s, a) => s.scheduler.dispatchRun(A(a)[0]),
    ),

    c(
      'paths.tryAcquirePaths',
      tuple(input({ workspaceId: id.workspace, holder: id.handle, paths, ttlMs: ttl, taskId: id.task })),
      (s, a) => s.paths.tryAcquirePaths(A(a)[0]),
    ),
    c(
      'paths.acquirePaths',
      // A valid timeout is kept short: a plausible call may really wait for a conflicting holder.
      tuple(
        input({ workspaceId: id.workspace, holder: id.handle, paths, ttlMs: ttl, taskId: id.task }),
        input({ timeoutMs: fc.integer({ min: 0, max: 30 }), maxPollMs: fc.integer({ min: 1, max: 10 }) }),
      ),
      (s, a) => s.paths.acquirePaths(A(a)[0], boundedWait(A(a)[1], 30)),
    ),
    c('paths.releasePaths', tuple(input({ workspaceId: id.workspace, holder: id.handle, paths })), (s, a) =>
      s.paths.releasePaths(A(a)[0]),
    ),
    c('paths.renewPaths', tuple(input({ workspaceId: id.workspace, holder: id.handle, paths, ttlMs: ttl })), (s, a) =>
      s.paths.renewPaths(A(a)[0]),
    ),
    c('paths.releasePaths (lease)', tuple(pathLease), (s, a) => s.paths.releasePaths(A(a)[0])),
    c('paths.renewPaths (lease)', tuple(pathLease, input({ ttlMs: ttl })), (s, a) =>
      s.paths.renewPaths(A(a)[0], A(a)[1]),
    ),
    c(
      'paths.submitTaskResult (lease)',
      tuple(arg(id.task), pathLease, input({ status: fc.constantFrom('done', 'failed') })),
      (s, a) => s.paths.submitTaskResult(A(a)[0], A(a)[1], A(a)[2]),
    ),
    c('paths.listPathLeases', tuple(input({ workspaceId: id.workspace, holder: id.handle })), (s, a) =>
      s.paths.listPathLeases(A(a)[0]),
    ),
    c('paths.pruneExpiredPaths', tuple(arg(id.workspace)), (s, a) => s.paths.pruneExpiredPaths(A(a)[0])),
    c('paths.claimTask', tuple(arg(id.task), arg(id.handle), input({ ttlMs: ttl })), (s, a) =>
      s.paths.claimTask(A(a)[0], A(a)[1], A(a)[2]),
    ),
    c(
      'paths.submitTaskResult',
      tuple(arg(id.task), arg(id.handle), input({ status: fc.constantFrom('done', 'failed') })),
      (s, a) => s.paths.submitTaskResult(A(a)[0], A(a)[1], A(a)[2]),
    ),

    c(
      'ownership.createEnvironment',
      tuple(input({ id: id.fresh, ownerTaskId: id.task, rootPath: text, groupId: id.group })),
      (s, a) => s.ownership.createEnvironment(A(a)[0]),
    ),
    c('ownership.createWorkspaceGroup', tuple(input({ id: id.fresh, stewardTaskId: id.task })), (s, a) =>
      s.ownership.createWorkspaceGroup(A(a)[0]),
    ),
    c('ownership.getEnvironment', tuple(arg(id.environment)), (s, a) => s.ownership.getEnvironment(A(a)[0])),
    c('ownership.getWorkspaceGroup', tuple(arg(id.group)), (s, a) => s.ownership.getWorkspaceGroup(A(a)[0])),
    c(
      'ownership.transferEnvironmentOwnership',
      tuple(
        input({
          environmentId: id.environment,
          expectedOwnerTaskId: id.task,
          expectedGeneration: token,
          newOwnerTaskId: id.task,
        }),
      ),
      (s, a) => s.ownership.transferEnvironmentOwnership(A(a)[0]),
    ),
    c(
      'ownership.transferGroupStewardship',
      tuple(
        input({
          groupId: id.group,
          expectedStewardTaskId: id.task,
          expectedGeneration: token,
          newStewardTaskId: id.task,
        }),
      ),
      (s, a) => s.ownership.transferGroupStewardship(A(a)[0]),
    ),
    c('ownership.admitTaskCleanup', tuple(arg(id.task), arg(fc.constantFrom('archive', 'delete', undefined))), (s, a) =>
      s.ownership.admitTaskCleanup(A(a)[0], A(a)[1]),
    ),
    c('ownership.listCleanupSnapshots', tuple(arg(id.task)), (s, a) => s.ownership.listCleanupSnapshots(A(a)[0])),
    c('ownership.getCleanupSnapshot', tuple(arg(id.snapshot)), (s, a) => s.ownership.getCleanupSnapshot(A(a)[0])),
    c(
      'ownership.listPendingCleanups',
      tuple(input({ limit: fc.integer({ min: 1, max: 100 }), taskId: id.task })),
      (s, a) => s.ownership.listPendingCleanups(A(a)[0]),
    ),
    c('ownership.claimCleanup', tuple(arg(id.snapshot), arg(id.handle), input({ ttlMs: ttl })), (s, a) =>
      s.ownership.claimCleanup(A(a)[0], A(a)[1], A(a)[2]),
    ),
    c('ownership.tryClaimCleanup', tuple(arg(id.snapshot), arg(id.handle), input({ ttlMs: ttl })), (s, a) =>
      s.ownership.tryClaimCleanup(A(a)[0], A(a)[1], A(a)[2]),
    ),
    c('ownership.renewCleanupClaim', tuple(claim, input({ ttlMs: ttl })), (s, a) =>
      s.ownership.renewCleanupClaim(A(a)[0], A(a)[1]),
    ),
    c('ownership.completeCleanup', tuple(claim), (s, a) => s.ownership.completeCleanup(A(a)[0])),
    c('ownership.failCleanup', tuple(claim, arg(text)), (s, a) => s.ownership.failCleanup(A(a)[0], A(a)[1])),
    c('ownership.releaseCleanupClaim', tuple(claim), (s, a) => s.ownership.releaseCleanupClaim(A(a)[0])),
    c('ownership.detachSubtask', tuple(input({ taskId: id.task, expectedParentId: id.task })), (s, a) =>
      s.ownership.detachSubtask(A(a)[0]),
    ),
  ];
}

/** Seeds a little of everything, so plausible ids hit real rows. */
async function seed(store: Store): Promise<Pools> {
  const company = await store.org.createCompany({ id: 'c1', name: 'acme' });
  const ws = await store.org.createWorkspace({ id: 'w1', companyId: company.id, name: 'ws', rootPath: '/w1' });
  await store.org.createWorkspace({ id: 'w2', companyId: company.id, name: 'ws2' });
  const agent = await store.org.createAgent({ id: 'a1', companyId: company.id, name: 'agent', workspaceId: ws.id });
  const project = await store.org.createProject({
    id: 'p1',
    companyId: company.id,
    name: 'proj',
    primaryWorkspaceId: ws.id,
  });
  const run = await store.runs.startCoordinatorRun({ targetKey: 'worktree:a', coordinatorHandle: 'coord-1' });
  const parent = await store.tasks.createTask({
    id: 't1',
    companyId: company.id,
    title: 'parent',
    requiresFilesystem: true,
    status: 'ready',
    workspaceId: ws.id,
    targetKey: 'worktree:a',
  });
  const child = await store.tasks.createTask({
    id: 't2',
    companyId: company.id,
    title: 'child',
    requiresFilesystem: false,
    status: 'ready',
    parentId: parent.id,
    writes: ['src'],
    workspaceId: ws.id,
  });
  await store.tasks.createTask({
    id: 't3',
    companyId: company.id,
    title: 'other',
    requiresFilesystem: true,
    status: 'ready',
    projectId: project.id,
    assigneeAgentId: agent.id,
  });
  const group = await store.ownership.createWorkspaceGroup({ id: 'g1', stewardTaskId: parent.id });
  const env = await store.ownership.createEnvironment({ id: 'e1', ownerTaskId: child.id, rootPath: '/e1' });
  await store.ownership.createEnvironment({ id: 'e2', ownerTaskId: parent.id, rootPath: '/e2', groupId: group.id });
  const dispatch = await store.dispatches.createDispatch({ taskId: 't3', terminalHandle: 'term-1', agentId: agent.id });
  const gate = await store.gates.openGate({ question: 'go?', taskId: parent.id });
  await store.messages.sendMessage({
    allowUnknownRecipient: true,
    from: 'term-1',
    to: 'coord-1',
    kind: 'done',
    payload: { ok: true },
  });
  await store.locks.claimWorkspaceLock('w2', { holder: 'holder-1', runId: run.id, ttlMs: 600_000 });
  await store.paths.tryAcquirePaths({ workspaceId: ws.id, holder: 'holder-1', paths: ['docs'], ttlMs: 600_000 });
  const doomed = await store.tasks.createTask({
    id: 't4',
    companyId: company.id,
    title: 'doomed',
    requiresFilesystem: true,
  });
  await store.ownership.createEnvironment({ id: 'e3', ownerTaskId: doomed.id, rootPath: '/e3' });
  const admission = await store.ownership.admitTaskCleanup(doomed.id);
  for (const n of [5, 6, 7, 8]) {
    await store.tasks.createTask({
      id: `t${n}`,
      companyId: company.id,
      title: `ready ${n}`,
      requiresFilesystem: n % 2 === 0,
      status: 'ready',
      workspaceId: n < 7 ? ws.id : null,
    });
  }
  return {
    company: [company.id],
    workspace: [ws.id, 'w2'],
    agent: [agent.id],
    project: [project.id],
    task: ['t1', 't2', 't3', 't4', 't5', 't6', 't7', 't8'],
    run: [run.id],
    dispatch: [dispatch.id],
    gate: [gate.id],
    environment: [env.id, 'e2', 'e3'],
    group: [group.id],
    snapshot: admission.snapshots.map((s) => s.id),
    handle: ['coord-1', 'term-1', 'holder-1', 'holder-2'],
  };
}

/** A blocking call's options with a valid `timeoutMs` above `maxMs` cut to it (hostile values pass through). */
function boundedWait(options: any, maxMs: number): any {
  return typeof options?.timeoutMs === 'number' && Number.isInteger(options.timeoutMs) && options.timeoutMs > maxMs
    ? { ...options, timeoutMs: maxMs }
    : options;
}

function withTimeout<T>(promise: Promise<T>, name: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`${name} did not settle within ${CALL_TIMEOUT_MS} ms (a hang)`)),
      CALL_TIMEOUT_MS,
    );
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** The arguments, readable (fast-check's printer handles BigInt, cycles and null prototypes), cut short. */
function show(args: unknown[]): string {
  const text = fc.stringify(args);
  return text.length > 400 ? `${text.slice(0, 400)}…` : text;
}

export function defineFuzzSuite(makeFixture: () => DialectFixture): void {
  describe(`fuzzing the public API with hostile values (${makeFixture.name})`, () => {
    let fx: DialectFixture;
    let store: Store;
    let all: FuzzCase[];
    let calls = 0;
    /** Outcomes per function (`ok` or the error code), printed with FUZZ_DEBUG. */
    const outcomes = new Map<string, Map<string, number>>();
    const count = (name: string, outcome: string) => {
      const byOutcome = outcomes.get(name) ?? new Map<string, number>();
      byOutcome.set(outcome, (byOutcome.get(outcome) ?? 0) + 1);
      outcomes.set(name, byOutcome);
    };
    beforeAll(async () => {
      fx = makeFixture();
      store = await fx.freshStore();
      all = cases(await seed(store)).filter((c) => !EXCLUDE?.test(c.name));
    });
    afterAll(async () => {
      if (process.env.FUZZ_DEBUG)
        for (const [name, byOutcome] of outcomes) console.log(name, JSON.stringify(Object.fromEntries(byOutcome)));
      console.log(`[fuzz ${makeFixture.name}] ${calls} calls over ${all.length} functions, ${RUNS(fx.kind)} runs each`);
      await fx.cleanup();
    });

    it('every call resolves or throws a documented TaskfenceError; a refusal changes no row and no schema', async () => {
      const schema = await store.describeSchema();
      const schemaBefore = JSON.stringify(schema);
      for (const fuzzCase of all) {
        await fc.assert(
          fc.asyncProperty(fuzzCase.args, async (args) => {
            calls++;
            // A refusal under an idempotency key is recorded by contract (a retry returns it), so
            // such a call may write its key's row and nothing else.
            const except = args.some(
              (a) =>
                typeof a === 'object' &&
                a !== null &&
                typeof (a as { idempotencyKey?: unknown }).idempotencyKey === 'string',
            )
              ? ['idempotency_keys']
              : [];
            const before = await databaseState(store, { schema, except });
            let error: unknown;
            try {
              await withTimeout(fuzzCase.call(store, args), fuzzCase.name);
              count(fuzzCase.name, 'ok');
              return;
            } catch (e) {
              error = e;
            }
            const where = `${fuzzCase.name}(${show(args)})`;
            count(fuzzCase.name, error instanceof TaskfenceError ? error.code : 'raw');
            if (!(error instanceof TaskfenceError))
              throw new Error(`${where} threw a raw ${(error as Error)?.name}: ${(error as Error)?.message}`, {
                cause: error,
              });
            if (!DOCUMENTED_CODES.has(error.code))
              throw new Error(`${where} threw an undocumented code ${error.code}: ${error.message}`);
            if (!RECORDING_REFUSALS.has(error.code)) {
              const after = await databaseState(store, { schema, except });
              if (after !== before) throw new Error(`${where} was refused with ${error.code} but changed the database`);
            }
          }),
          { numRuns: RUNS(fx.kind), ...(process.env.FUZZ_SEED ? { seed: Number(process.env.FUZZ_SEED) } : {}) },
        );
      }
      expect(JSON.stringify(await store.describeSchema())).toBe(schemaBefore);
    }, 600_000);
  });
}
