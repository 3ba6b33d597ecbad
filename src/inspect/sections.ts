/**
 * The reads behind each section of `inspect`, all on one read transaction (`trx`) so that the
 * sections agree with each other: a lease counted in `locks` is the lease of the dispatch in
 * `dispatches`. Plain Kysely builder queries (off the hot path), portable across both dialects.
 */
import { sql, type ExpressionBuilder, type Transaction } from 'kysely';
import { schemaOf } from '../query/schema.js';
import { decodePathLeaseKey } from '../domain/write-paths.js';
import type { Database, TaskStatus, TasksTable } from '../schema/database.js';
import { buildPathTree } from './tree.js';
import type {
  CleanupClaimState,
  DispatchesSection,
  InboxSection,
  LocksSection,
  OwnedResourceView,
  OwnershipSection,
  PathHolderView,
  PathsSection,
  QueuedTaskView,
  ReadyQueueSection,
  RunView,
  SemaphoreView,
  SemaphoresSection,
  RunsSection,
  TaskLeaseView,
  WorkspaceLockView,
} from './types.js';

type Trx = Transaction<Database>;

/** What every section read needs: the clock reading, the stale threshold, the row cap. */
export interface SectionScope {
  readonly now: number;
  readonly staleAfterMs: number;
  readonly limit: number;
}

const num = (value: unknown): number => Number(value);
const numOrNull = (value: unknown): number | null => (value === null || value === undefined ? null : Number(value));

async function countRows(query: { executeTakeFirst(): Promise<{ n: unknown } | undefined> }): Promise<number> {
  return num((await query.executeTakeFirst())?.n ?? 0);
}

interface RunRow {
  id: string;
  target_key: string | null;
  coordinator_handle: string;
  status: RunView['status'];
  started_at: number;
  ended_at: number | null;
  heartbeat_at: number | null;
}

/** Task counts by status for these runs. */
export async function taskCountsByRun(trx: Trx, runIds: readonly string[]) {
  const counts = new Map<string, Partial<Record<TaskStatus, number>>>();
  if (runIds.length === 0) return counts;
  const rows = await trx
    .selectFrom('tasks')
    .select(['coordinator_run_id', 'status', (eb) => eb.fn.countAll().as('n')])
    .where('coordinator_run_id', 'in', runIds)
    .groupBy(['coordinator_run_id', 'status'])
    .execute();
  for (const row of rows) {
    const of = counts.get(row.coordinator_run_id!) ?? {};
    of[row.status] = num(row.n);
    counts.set(row.coordinator_run_id!, of);
  }
  return counts;
}

export function runView(
  row: RunRow,
  scope: SectionScope,
  tasks: Partial<Record<TaskStatus, number>> | undefined,
): RunView {
  const last = num(row.heartbeat_at ?? row.started_at);
  const heartbeatAgeMs = scope.now - last;
  return {
    id: row.id,
    targetKey: row.target_key,
    coordinatorHandle: row.coordinator_handle,
    status: row.status,
    startedAt: num(row.started_at),
    endedAt: numOrNull(row.ended_at),
    heartbeatAt: numOrNull(row.heartbeat_at),
    heartbeatAgeMs,
    // The same comparison reconcileStaleRuns makes: coalesce(heartbeat_at, started_at) < now - staleAfterMs.
    stale: row.status === 'running' && last < scope.now - scope.staleAfterMs,
    tasks: tasks ?? {},
  };
}

/** Running runs by target, then the runs that ended most recently. */
export async function readRuns(trx: Trx, scope: SectionScope): Promise<RunsSection> {
  const columns = [
    'id',
    'target_key',
    'coordinator_handle',
    'status',
    'started_at',
    'ended_at',
    'heartbeat_at',
  ] as const;
  const running = await trx
    .selectFrom('coordinator_runs')
    .select(columns)
    .where('status', '=', 'running')
    .orderBy('target_key')
    .orderBy('started_at')
    .limit(scope.limit)
    .execute();
  const ended = await trx
    .selectFrom('coordinator_runs')
    .select(columns)
    .where('status', '<>', 'running')
    .orderBy('ended_at', 'desc')
    .orderBy('id')
    .limit(Math.min(scope.limit, 10))
    .execute();
  const counts = await taskCountsByRun(
    trx,
    [...running, ...ended].map((r) => r.id),
  );
  const runningTotal = await countRows(
    trx
      .selectFrom('coordinator_runs')
      .select((eb) => eb.fn.countAll().as('n'))
      .where('status', '=', 'running'),
  );
  const endedTotal = await countRows(
    trx
      .selectFrom('coordinator_runs')
      .select((eb) => eb.fn.countAll().as('n'))
      .where('status', '<>', 'running'),
  );
  return {
    at: scope.now,
    staleAfterMs: scope.staleAfterMs,
    running: { total: runningTotal, items: running.map((r) => runView(r, scope, counts.get(r.id))) },
    recentlyEnded: { total: endedTotal, items: ended.map((r) => runView(r, scope, counts.get(r.id))) },
  };
}

/** Active dispatches by terminal, each with the task lease it runs under (if held). */
export async function readDispatches(trx: Trx, scope: SectionScope): Promise<DispatchesSection> {
  const rows = await trx
    .selectFrom('dispatch_contexts as d')
    .innerJoin('tasks as t', 't.id', 'd.task_id')
    .leftJoin('task_leases as l', (join) => join.onRef('l.task_id', '=', 'd.task_id').on('l.holder', 'is not', null))
    .select([
      'd.id',
      'd.terminal_handle',
      'd.task_id',
      't.title',
      't.status as task_status',
      'd.coordinator_run_id',
      'd.agent_id',
      'd.created_at',
      'l.holder',
      'l.token',
      'l.expires_at',
    ])
    .where('d.status', '=', 'active')
    .orderBy('d.terminal_handle')
    .limit(scope.limit)
    .execute();
  const total = await countRows(
    trx
      .selectFrom('dispatch_contexts')
      .select((eb) => eb.fn.countAll().as('n'))
      .where('status', '=', 'active'),
  );
  return {
    at: scope.now,
    active: {
      total,
      items: rows.map((r) => ({
        id: r.id,
        terminalHandle: r.terminal_handle,
        taskId: r.task_id,
        taskTitle: r.title,
        taskStatus: r.task_status,
        coordinatorRunId: r.coordinator_run_id,
        agentId: r.agent_id,
        createdAt: num(r.created_at),
        ageMs: scope.now - num(r.created_at),
        lease:
          r.holder === null || r.holder === undefined || r.expires_at === null
            ? null
            : {
                holder: r.holder,
                token: num(r.token),
                expiresAt: num(r.expires_at),
                leftMs: num(r.expires_at) - scope.now,
              },
      })),
    },
  };
}

function leaseTimes(row: { acquired_at: number | null; expires_at: number | null }, now: number) {
  const expiresAt = num(row.expires_at ?? 0);
  return { acquiredAt: numOrNull(row.acquired_at), expiresAt, leftMs: expiresAt - now, expired: expiresAt <= now };
}

/** Held workspace locks on `workspaceId` or held for run `runId` (either may be null). */
export async function readWorkspaceLocksOf(
  trx: Trx,
  of: { workspaceId: string | null; runId: string | null },
  now: number,
): Promise<WorkspaceLockView[]> {
  if (of.workspaceId === null && of.runId === null) return [];
  const rows = await trx
    .selectFrom('workspace_locks')
    .selectAll()
    .where('holder', 'is not', null)
    .where((eb) =>
      eb.or([
        ...(of.workspaceId === null ? [] : [eb('workspace_id', '=', of.workspaceId)]),
        ...(of.runId === null ? [] : [eb('run_id', '=', of.runId)]),
      ]),
    )
    .orderBy('workspace_id')
    .execute();
  return rows.map((row) => toWorkspaceLockView(row, now));
}

function toWorkspaceLockView(
  row: {
    workspace_id: string;
    holder: string | null;
    run_id: string | null;
    token: number;
    acquired_at: number | null;
    expires_at: number | null;
  },
  now: number,
): WorkspaceLockView {
  return {
    workspaceId: row.workspace_id,
    holder: row.holder!,
    runId: row.run_id,
    token: num(row.token),
    ...leaseTimes(row, now),
  };
}

function toTaskLeaseView(
  row: { task_id: string; holder: string | null; token: number; acquired_at: number | null; expires_at: number | null },
  now: number,
): TaskLeaseView {
  return { taskId: row.task_id, holder: row.holder!, token: num(row.token), ...leaseTimes(row, now) };
}

/** The task lease of `taskId` if someone holds it. */
export async function readTaskLease(trx: Trx, taskId: string, now: number): Promise<TaskLeaseView | null> {
  const row = await trx
    .selectFrom('task_leases')
    .selectAll()
    .where('task_id', '=', taskId)
    .where('holder', 'is not', null)
    .executeTakeFirst();
  return row ? toTaskLeaseView(row, now) : null;
}

/** Held workspace locks and task leases, soonest to expire first (expired but unreleased ones lead). */
export async function readLocks(trx: Trx, scope: SectionScope): Promise<LocksSection> {
  const workspaces = await trx
    .selectFrom('workspace_locks')
    .selectAll()
    .where('holder', 'is not', null)
    .orderBy('expires_at')
    .orderBy('workspace_id')
    .limit(scope.limit)
    .execute();
  const tasks = await trx
    .selectFrom('task_leases')
    .selectAll()
    .where('holder', 'is not', null)
    .orderBy('expires_at')
    .orderBy('task_id')
    .limit(scope.limit)
    .execute();
  return {
    at: scope.now,
    workspaces: {
      total: await countRows(
        trx
          .selectFrom('workspace_locks')
          .select((eb) => eb.fn.countAll().as('n'))
          .where('holder', 'is not', null),
      ),
      items: workspaces.map((r) => toWorkspaceLockView(r, scope.now)),
    },
    tasks: {
      total: await countRows(
        trx
          .selectFrom('task_leases')
          .select((eb) => eb.fn.countAll().as('n'))
          .where('holder', 'is not', null),
      ),
      items: tasks.map((r) => toTaskLeaseView(r, scope.now)),
    },
  };
}

/** Live path leases of each workspace that has any, as a tree; `limit` caps workspaces and leases per workspace. */
export async function readPaths(trx: Trx, scope: SectionScope): Promise<PathsSection> {
  const perWorkspace = await trx
    .selectFrom('path_leases')
    .select([
      'workspace_id',
      (eb) => eb.fn.countAll().as('n'),
      (eb) => eb.fn.sum<number>(eb.case().when('expires_at', '>', scope.now).then(1).else(0).end()).as('live'),
    ])
    .groupBy('workspace_id')
    .orderBy('workspace_id')
    .execute();
  const shown = perWorkspace.filter((w) => num(w.live) > 0);
  const workspaces = [];
  for (const w of shown.slice(0, scope.limit)) {
    const leases = await trx
      .selectFrom('path_leases')
      .select(['lease_key', 'holder', 'task_id', 'expires_at'])
      .where('workspace_id', '=', w.workspace_id)
      .where('expires_at', '>', scope.now)
      .orderBy('lease_key')
      .orderBy('holder')
      .limit(scope.limit)
      .execute();
    workspaces.push({
      workspaceId: w.workspace_id,
      live: num(w.live),
      expired: num(w.n) - num(w.live),
      tree: buildPathTree(
        leases.map((l) => ({
          path: decodePathLeaseKey(l.lease_key),
          lease: {
            holder: l.holder,
            taskId: l.task_id,
            expiresAt: num(l.expires_at),
            leftMs: num(l.expires_at) - scope.now,
          } satisfies PathHolderView,
        })),
      ),
    });
  }
  return { at: scope.now, workspaces: { total: shown.length, items: workspaces } };
}

function cleanupClaim(
  row: { cleanup_claimed_by: string | null; cleanup_claim_expires_at: number | null },
  now: number,
): { cleanup: CleanupClaimState; cleanupClaimedBy: string | null; cleanupClaimLeftMs: number | null } {
  if (row.cleanup_claimed_by === null) return { cleanup: 'none', cleanupClaimedBy: null, cleanupClaimLeftMs: null };
  const left = num(row.cleanup_claim_expires_at ?? 0) - now;
  return {
    cleanup: left > 0 ? 'claimed' : 'claim-expired',
    cleanupClaimedBy: row.cleanup_claimed_by,
    cleanupClaimLeftMs: left,
  };
}

/** Active environments and groups (or those of `ownerTaskId`), with generation and cleanup claim. */
export async function readOwnedResources(
  trx: Trx,
  scope: SectionScope,
  ownerTaskId?: string,
): Promise<{ total: number; items: OwnedResourceView[] }> {
  let environments = trx
    .selectFrom('task_environments')
    .select(['id', 'task_id', 'status', 'ownership_generation', 'cleanup_claimed_by', 'cleanup_claim_expires_at']);
  let groups = trx
    .selectFrom('workspace_groups')
    .select([
      'id',
      'steward_task_id',
      'status',
      'ownership_generation',
      'cleanup_claimed_by',
      'cleanup_claim_expires_at',
    ]);
  let envCount = trx.selectFrom('task_environments').select((eb) => eb.fn.countAll().as('n'));
  let groupCount = trx.selectFrom('workspace_groups').select((eb) => eb.fn.countAll().as('n'));
  if (ownerTaskId === undefined) {
    environments = environments.where('status', '=', 'active');
    groups = groups.where('status', '=', 'active');
    envCount = envCount.where('status', '=', 'active');
    groupCount = groupCount.where('status', '=', 'active');
  } else {
    environments = environments.where('task_id', '=', ownerTaskId);
    groups = groups.where('steward_task_id', '=', ownerTaskId);
    envCount = envCount.where('task_id', '=', ownerTaskId);
    groupCount = groupCount.where('steward_task_id', '=', ownerTaskId);
  }
  const envRows = await environments.orderBy('id').limit(scope.limit).execute();
  const groupRows = await groups.orderBy('id').limit(scope.limit).execute();
  const items: OwnedResourceView[] = [
    ...groupRows.map((g) => ({
      kind: 'group' as const,
      id: g.id,
      ownerTaskId: g.steward_task_id,
      status: g.status,
      generation: num(g.ownership_generation),
      ...cleanupClaim(g, scope.now),
    })),
    ...envRows.map((e) => ({
      kind: 'environment' as const,
      id: e.id,
      ownerTaskId: e.task_id,
      status: e.status,
      generation: num(e.ownership_generation),
      ...cleanupClaim(e, scope.now),
    })),
  ];
  return { total: (await countRows(envCount)) + (await countRows(groupCount)), items: items.slice(0, scope.limit) };
}

/** Ownership: active resources, cleanup admissions, unfinished cleanup snapshots. */
export async function readOwnership(trx: Trx, scope: SectionScope): Promise<OwnershipSection> {
  const admissions = await trx
    .selectFrom('task_cleanup_admissions')
    .selectAll()
    .orderBy('admitted_at')
    .orderBy('task_id')
    .limit(scope.limit)
    .execute();
  const snapshots = await trx
    .selectFrom('cleanup_snapshots')
    .selectAll()
    .where('state', '<>', 'completed')
    .orderBy('created_at')
    .orderBy('id')
    .limit(scope.limit)
    .execute();
  return {
    at: scope.now,
    resources: await readOwnedResources(trx, scope),
    admissions: {
      total: await countRows(trx.selectFrom('task_cleanup_admissions').select((eb) => eb.fn.countAll().as('n'))),
      items: admissions.map((a) => ({ taskId: a.task_id, kind: a.kind, admittedAt: num(a.admitted_at) })),
    },
    snapshots: {
      total: await countRows(
        trx
          .selectFrom('cleanup_snapshots')
          .select((eb) => eb.fn.countAll().as('n'))
          .where('state', '<>', 'completed'),
      ),
      items: snapshots.map((s) => ({
        id: s.id,
        taskId: s.task_id,
        resourceKind: s.resource_kind,
        resourceId: s.resource_id,
        generation: num(s.ownership_generation),
        state: s.state,
        attempts: num(s.attempts),
        claimedBy: s.claimed_by,
        lastError: s.last_error,
      })),
    },
  };
}

/** Inboxes with pending or dead messages, deepest first; the dead messages, most recently dead first. */
export async function readInbox(trx: Trx, scope: SectionScope): Promise<InboxSection> {
  const live = (eb: ExpressionBuilder<Database, 'messages'>) => eb('dead_at', 'is', null);
  const rows = await trx
    .selectFrom('messages')
    .select((eb) => [
      'to_handle',
      eb.fn.sum<number>(eb.case().when(live(eb)).then(1).else(0).end()).as('depth'),
      eb.fn
        .sum<number>(
          eb
            .case()
            .when(eb.and([live(eb), eb('visible_at', '>', scope.now)]))
            .then(1)
            .else(0)
            .end(),
        )
        .as('in_flight'),
      eb.fn
        .sum<number>(
          eb
            .case()
            .when(eb.and([live(eb), eb('attempts', '>', 1)]))
            .then(1)
            .else(0)
            .end(),
        )
        .as('redelivered'),
      eb.fn.sum<number>(eb.case().when('dead_at', 'is not', null).then(1).else(0).end()).as('dead'),
      eb.fn.min(eb.case().when(live(eb)).then(eb.ref('created_at')).end()).as('oldest'),
    ])
    .where('status', '=', 'pending')
    .groupBy('to_handle')
    .execute();
  const inboxes = rows
    .map((r) => {
      const oldestAt = numOrNull(r.oldest);
      return {
        handle: r.to_handle,
        depth: num(r.depth),
        inFlight: num(r.in_flight),
        redelivered: num(r.redelivered),
        dead: num(r.dead),
        oldestAt,
        oldestAgeMs: oldestAt === null ? null : scope.now - oldestAt,
      };
    })
    .sort(
      (a, b) =>
        b.depth - a.depth ||
        b.dead - a.dead ||
        (a.oldestAt ?? Infinity) - (b.oldestAt ?? Infinity) ||
        (a.handle < b.handle ? -1 : 1),
    );
  const dead = await trx
    .selectFrom('messages')
    .select(['id', 'to_handle', 'from_handle', 'kind', 'attempts', 'dead_at', 'last_error'])
    .where('status', '=', 'pending')
    .where('dead_at', 'is not', null)
    .orderBy('dead_at', 'desc')
    .orderBy('seq', 'desc')
    .limit(scope.limit)
    .execute();
  const sum = (pick: (i: (typeof inboxes)[number]) => number) => inboxes.reduce((n, i) => n + pick(i), 0);
  return {
    at: scope.now,
    inboxes: { total: inboxes.length, items: inboxes.slice(0, scope.limit) },
    pendingTotal: sum((i) => i.depth),
    redeliveredTotal: sum((i) => i.redelivered),
    deadTotal: sum((i) => i.dead),
    dead: {
      total: sum((i) => i.dead),
      items: dead.map((m) => ({
        id: m.id,
        handle: m.to_handle,
        from: m.from_handle,
        kind: m.kind,
        attempts: num(m.attempts),
        deadAt: num(m.dead_at),
        deadAgeMs: scope.now - num(m.dead_at),
        lastError: m.last_error,
      })),
    },
  };
}

/** Semaphores with slot rows (live or not yet reclaimed), fullest first, each with its live slots. */
export async function readSemaphores(trx: Trx, scope: SectionScope): Promise<SemaphoresSection> {
  const counts = await trx
    .selectFrom('semaphore_holders as h')
    .innerJoin('semaphores as s', 's.name', 'h.name')
    .select((eb) => [
      'h.name',
      's.token',
      's.slot_limit',
      eb.fn.countAll().as('n'),
      eb.fn.sum<number>(eb.case().when('h.expires_at', '>', scope.now).then(1).else(0).end()).as('held'),
    ])
    .groupBy(['h.name', 's.token', 's.slot_limit'])
    .execute();
  const ordered = counts
    .map((c) => ({
      name: c.name,
      token: num(c.token),
      held: num(c.held),
      limit: c.slot_limit === null ? null : num(c.slot_limit),
      expired: num(c.n) - num(c.held),
    }))
    .sort((a, b) => b.held - a.held || (a.name < b.name ? -1 : 1));
  const semaphores: SemaphoreView[] = [];
  for (const s of ordered.slice(0, scope.limit)) {
    const slots = await trx
      .selectFrom('semaphore_holders')
      .select(['holder', 'token', 'acquired_at', 'expires_at'])
      .where('name', '=', s.name)
      .where('expires_at', '>', scope.now)
      .orderBy('expires_at')
      .orderBy('token')
      .limit(scope.limit)
      .execute();
    semaphores.push({
      ...s,
      slots: slots.map((h) => ({
        holder: h.holder,
        token: num(h.token),
        acquiredAt: num(h.acquired_at),
        expiresAt: num(h.expires_at),
        leftMs: num(h.expires_at) - scope.now,
      })),
    });
  }
  return { at: scope.now, semaphores: { total: ordered.length, items: semaphores } };
}

/**
 * The dependency edges of the lifecycle work (issue 22): migration 0090 adds
 * `task_dependencies (task_id, depends_on_id)` and the `blocked` status. This code was written
 * before 0090 was merged and reads the table only where it exists: whether it exists is
 * detected once per store (a table, once there, stays: a positive answer is kept; a negative one
 * is asked again at the next snapshot, one catalog query, so a store migrated while a dashboard
 * runs starts showing dependencies). Without the table nothing is blocked by a dependency. Since
 * inspect requires the latest schema, the table is always there now; the check can go.
 */
interface TaskDependenciesTable {
  task_id: string;
  depends_on_id: string;
}
type WithDependencies = Database & { task_dependencies: TaskDependenciesTable };
const hasDependencies = new WeakMap<object, true>();

/** Whether the store's database has the `task_dependencies` table (asked once per store once it has). */
export async function dependenciesTracked(trx: Trx, store: object, dialect: 'sqlite' | 'postgres'): Promise<boolean> {
  if (hasDependencies.has(store)) return true;
  const found =
    dialect === 'sqlite'
      ? await sql<{
          n: unknown;
        }>`select count(*) as n from sqlite_master where type = 'table' and name = 'task_dependencies'`.execute(trx)
      : await sql<{ n: unknown }>`select count(*) as n from information_schema.tables
          where table_schema = coalesce(${schemaOf(trx) ?? null}, current_schema()) and table_name = 'task_dependencies'`.execute(
          trx,
        );
  const present = num(found.rows[0]?.n ?? 0) > 0;
  if (present) hasDependencies.set(store, true);
  return present;
}

/** What task `taskId` depends on, oldest first (call only where `dependenciesTracked`). */
export async function readDependenciesOf(trx: Trx, taskId: string): Promise<{ id: string; status: TaskStatus }[]> {
  return (trx as unknown as Transaction<WithDependencies>)
    .selectFrom('task_dependencies as d')
    .innerJoin('tasks as u', 'u.id', 'd.depends_on_id')
    .select(['u.id', 'u.status'])
    .where('d.task_id', '=', taskId)
    .orderBy('u.created_at')
    .orderBy('u.id')
    .execute();
}

/** Statuses a task waits in before it is dispatched. */
const WAITING: readonly TaskStatus[] = ['backlog', 'todo', 'ready', 'blocked'];
/** Statuses of a task not finished. */
const UNFINISHED: readonly TaskStatus[] = [...WAITING, 'dispatched', 'in_progress'];
/** How many of a blocked task's open dependencies are listed. */
const WAITING_ON_SHOWN = 5;

function queuedView(
  t: {
    id: string;
    title: string;
    status: TaskStatus;
    coordinator_run_id: string | null;
    target_key: string | null;
    created_at: number;
    updated_at: number;
  },
  now: number,
): QueuedTaskView {
  return {
    id: t.id,
    title: t.title,
    status: t.status,
    coordinatorRunId: t.coordinator_run_id,
    targetKey: t.target_key,
    createdAt: num(t.created_at),
    waitingMs: now - num(t.updated_at),
  };
}

const TASK_COLUMNS = [
  't.id',
  't.title',
  't.status',
  't.coordinator_run_id',
  't.target_key',
  't.created_at',
  't.updated_at',
] as const;

/**
 * The ready queue: `ready` tasks with no open gate and (where dependencies are tracked) every
 * dependency done; waiting tasks with a dependency not done; unfinished tasks with an open gate.
 */
export async function readReadyQueue(trx: Trx, scope: SectionScope, tracked: boolean): Promise<ReadyQueueSection> {
  const dtrx = trx as unknown as Transaction<WithDependencies>;
  const openGate = (eb: ExpressionBuilder<WithDependencies & { t: TasksTable }, 't'>) =>
    eb.exists(
      eb
        .selectFrom('decision_gates as g')
        .select('g.id')
        .whereRef('g.task_id', '=', 't.id')
        .where('g.status', '=', 'open'),
    );
  const openDependency = (eb: ExpressionBuilder<WithDependencies & { t: TasksTable }, 't'>) =>
    eb.exists(
      eb
        .selectFrom('task_dependencies as d')
        .innerJoin('tasks as u', 'u.id', 'd.depends_on_id')
        .select('d.depends_on_id')
        .whereRef('d.task_id', '=', 't.id')
        .where('u.status', '<>', 'done'),
    );
  const ready = dtrx
    .selectFrom('tasks as t')
    .where('t.status', '=', 'ready')
    .where((eb) => eb.not(openGate(eb)))
    .$if(tracked, (qb) => qb.where((eb) => eb.not(openDependency(eb))));
  // The order dispatchNext takes them in: highest priority first, then oldest (seq).
  const readyRows = await ready
    .select(TASK_COLUMNS)
    .orderBy('t.priority', 'desc')
    .orderBy('t.seq')
    .limit(scope.limit)
    .execute();

  let blockedByDependency: ReadyQueueSection['blockedByDependency'] = { total: 0, items: [] };
  if (tracked) {
    const blocked = dtrx
      .selectFrom('tasks as t')
      .where('t.status', 'in', WAITING)
      .where((eb) => openDependency(eb));
    const rows = await blocked
      .select(TASK_COLUMNS)
      .orderBy('t.updated_at')
      .orderBy('t.id')
      .limit(scope.limit)
      .execute();
    const open =
      rows.length === 0
        ? []
        : await dtrx
            .selectFrom('task_dependencies as d')
            .innerJoin('tasks as u', 'u.id', 'd.depends_on_id')
            .select(['d.task_id', 'u.id', 'u.status'])
            .where(
              'd.task_id',
              'in',
              rows.map((r) => r.id),
            )
            .where('u.status', '<>', 'done')
            .orderBy('u.created_at')
            .orderBy('u.id')
            .execute();
    const byTask = new Map<string, { id: string; status: TaskStatus }[]>();
    for (const o of open) byTask.set(o.task_id, [...(byTask.get(o.task_id) ?? []), { id: o.id, status: o.status }]);
    blockedByDependency = {
      total: await countRows(blocked.select((eb) => eb.fn.countAll().as('n'))),
      items: rows.map((r) => {
        const of = byTask.get(r.id) ?? [];
        return { ...queuedView(r, scope.now), openDependencies: of.length, waitingOn: of.slice(0, WAITING_ON_SHOWN) };
      }),
    };
  }

  const gated = dtrx
    .selectFrom('tasks as t')
    .where('t.status', 'in', UNFINISHED)
    .where((eb) => openGate(eb));
  const gatedRows = await gated
    .select(TASK_COLUMNS)
    .orderBy('t.updated_at')
    .orderBy('t.id')
    .limit(scope.limit)
    .execute();
  const gates =
    gatedRows.length === 0
      ? []
      : await trx
          .selectFrom('decision_gates')
          .select(['id', 'task_id', 'question', 'created_at'])
          .where(
            'task_id',
            'in',
            gatedRows.map((r) => r.id),
          )
          .where('status', '=', 'open')
          .orderBy('created_at')
          .orderBy('id')
          .execute();
  return {
    at: scope.now,
    dependenciesTracked: tracked,
    ready: {
      total: await countRows(ready.select((eb) => eb.fn.countAll().as('n'))),
      items: readyRows.map((r) => queuedView(r, scope.now)),
    },
    blockedByDependency,
    blockedByGate: {
      total: await countRows(gated.select((eb) => eb.fn.countAll().as('n'))),
      items: gatedRows.map((r) => ({
        ...queuedView(r, scope.now),
        gates: gates
          .filter((g) => g.task_id === r.id)
          .map((g) => ({ id: g.id, question: g.question, openForMs: scope.now - num(g.created_at) })),
      })),
    },
  };
}
