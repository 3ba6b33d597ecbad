/**
 * The benchmarked operations, each as a taskfence call and as a raw-driver baseline that issues
 * the same statements in the same transactions (copied from what taskfence sends, see
 * `onQuery`). Each pair runs on its own copy of the same fixture.
 */
import { randomBytes, randomUUID } from 'node:crypto';
// Types and pure helpers only: the store under measurement is the build's (./lib/taskfence.ts).
import type { Store } from '../src/index.js';
import {
  encodePathLeaseKey,
  leaseKeys,
  normalizeWritePath,
  storedPathAncestorKeys,
  storedPathDescendantRange,
} from '../src/domain/write-paths.js';
import { barrierLockKey, ownedResourceLockKey, pathsLockKey, runTargetLockKey } from '../src/protocol.js';
import { placeholders, type RawClient } from './lib/raw.js';

export interface Fixture {
  companyId: string;
  lockWorkspaceId: string;
  pathWorkspaceId: string;
  taskA: string;
  taskB: string;
  environmentId: string;
  inbox: string;
}

/** Same ids on every copy, so the raw and taskfence databases hold identical data. */
export async function seedFixture(store: Store, tag: string, messages: number): Promise<Fixture> {
  const companyId = `c-${tag}`;
  await store.org.createCompany({ id: companyId, name: 'bench' });
  const lockWorkspaceId = `w-lock-${tag}`;
  const pathWorkspaceId = `w-path-${tag}`;
  await store.org.createWorkspace({ id: lockWorkspaceId, companyId, name: 'lock' });
  await store.org.createWorkspace({ id: pathWorkspaceId, companyId, name: 'paths' });
  const taskA = `t-a-${tag}`;
  const taskB = `t-b-${tag}`;
  await store.tasks.createTask({ id: taskA, companyId, title: 'a', requiresFilesystem: true });
  await store.tasks.createTask({ id: taskB, companyId, title: 'b', requiresFilesystem: true });
  const env = await store.ownership.createEnvironment({ id: `env-${tag}`, ownerTaskId: taskA, rootPath: '/tmp/x' });
  const inbox = `coordinator-${tag}`;
  // Bulk messages with plain SQL: seeding is not what is measured.
  const now = Date.now();
  for (let i = 0; i < messages; i += 500) {
    const rows = [];
    for (let j = i; j < Math.min(messages, i + 500); j++) {
      rows.push({
        id: `m-${tag}-${String(j).padStart(7, '0')}`,
        from_handle: 'worker',
        to_handle: inbox,
        kind: 'k',
        payload: '{"n":1}',
        status: 'pending' as const,
        created_at: now + j,
        delivered_at: null,
      });
    }
    await store.db.insertInto('messages').values(rows).execute();
  }
  return { companyId, lockWorkspaceId, pathWorkspaceId, taskA, taskB, environmentId: env.id, inbox };
}

export interface OpPair {
  readonly name: string;
  taskfence(store: Store, fx: Fixture): () => Promise<unknown>;
  raw(raw: RawClient, fx: Fixture): () => Promise<unknown>;
}

const lock = (raw: RawClient, key: string): [string, unknown[]][] =>
  raw.kind === 'postgres' ? [['select pg_advisory_xact_lock(hashtextextended($1, 0))', [key]]] : [];

let uniq = 0;
const nextTarget = (side: string) => `bench:${side}:${process.pid}:${++uniq}`;

export const OPS: OpPair[] = [
  {
    name: 'startCoordinatorRun (disjoint targets)',
    taskfence: (store) => () => store.runs.startCoordinatorRun({ targetKey: nextTarget('tf') }),
    raw: (raw) => {
      const p = (s: string) => placeholders(raw.kind, s);
      const insert = p(
        `insert into "coordinator_runs" ("id", "coordinator_handle", "status", "spec", "started_at", "ended_at", "target_key", "heartbeat_at") values (?, ?, ?, ?, ?, ?, ?, ?)`,
      );
      const adoptTasks =
        p(`update "tasks" set "coordinator_run_id" = ?, "updated_at" = ? where ("tasks"."coordinator_run_id" is null or not exists (
      select 1 from coordinator_runs r where r.id = "tasks"."coordinator_run_id" and r.status = 'running')) and "target_key" = ?`);
      const adopt = (table: string) =>
        p(`update "${table}" set "coordinator_run_id" = ? where "task_id" in (select "tasks"."id" from "tasks" where "tasks"."coordinator_run_id" = ?) and coalesce(coordinator_run_id, '') <> ? and ("${table}"."coordinator_run_id" is null or not exists (
      select 1 from coordinator_runs r where r.id = "${table}"."coordinator_run_id" and r.status = 'running'))`);
      const select = p(`select * from "coordinator_runs" where "id" = ?`);
      return async () => {
        const id = randomUUID();
        const target = nextTarget('raw');
        const now = Date.now();
        await raw.tx([
          [insert, [id, `coordinator-${randomBytes(6).toString('hex')}`, 'running', null, now, null, target, now]],
          ...lock(raw, runTargetLockKey(target)),
          [adoptTasks, [id, now, target]],
          [adopt('dispatch_contexts'), [id, id, id]],
          [adopt('decision_gates'), [id, id, id]],
        ]);
        return raw.query(select, [id]);
      };
    },
  },
  {
    name: 'claimWorkspaceLock + releaseWorkspaceLock',
    taskfence: (store, fx) => async () => {
      const claim = await store.locks.claimWorkspaceLock(fx.lockWorkspaceId, {
        holder: 'bench',
        runId: 'run',
        ttlMs: 60_000,
      });
      if (claim.status !== 'acquired') throw new Error('lock busy');
      await store.locks.releaseWorkspaceLock(fx.lockWorkspaceId, { token: claim.lease.token });
    },
    raw: (raw, fx) => {
      const p = (s: string) => placeholders(raw.kind, s);
      const claim = p(`
            insert into workspace_locks (workspace_id, holder, run_id, token, acquired_at, expires_at)
            values (?, ?, ?, 1, ?, ?)
            on conflict (workspace_id) do update
              set holder = excluded.holder, run_id = excluded.run_id, token = workspace_locks.token + 1,
                  acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
              where workspace_locks.holder is null or workspace_locks.expires_at <= ?
            returning token, expires_at`);
      const release = p(`
          update workspace_locks set holder = null, run_id = null, expires_at = ?
          where workspace_id = ? and token = ? and holder is not null
          returning token`);
      // Since the one exclusion rule: the claim takes the workspace's paths key and probes its path leases.
      const probe = p(`select lease_key from path_leases where workspace_id = ? and expires_at > ? limit 1`);
      return async () => {
        const now = Date.now();
        const token = await raw.txWith(async (run) => {
          if (raw.kind === 'postgres')
            await run('select pg_advisory_xact_lock(hashtextextended($1, 0))', [pathsLockKey(fx.lockWorkspaceId)]);
          if ((await run(probe, [fx.lockWorkspaceId, now])).length > 0) throw new Error('paths held');
          const rows = await run(claim, [fx.lockWorkspaceId, 'bench', 'run', now, now + 60_000, now]);
          return (rows[0] as { token: number } | undefined)?.token;
        });
        if (token === undefined) throw new Error('lock busy');
        await raw.tx([[release, [Date.now(), fx.lockWorkspaceId, token]]]);
      };
    },
  },
  {
    name: 'tryAcquirePaths + releasePaths (2 paths)',
    taskfence: (store, fx) => async () => {
      const r = await store.paths.tryAcquirePaths({
        workspaceId: fx.pathWorkspaceId,
        holder: 'bench',
        paths: ['src/a', 'docs'],
        ttlMs: 60_000,
      });
      if (r.status !== 'acquired') throw new Error('paths busy');
      await store.paths.releasePaths(r.lease);
    },
    raw: (raw, fx) => rawPathCycle(raw, fx.pathWorkspaceId, ['src/a', 'docs']),
  },
  {
    name: 'transferEnvironmentOwnership',
    taskfence: (store, fx) => {
      let generation = 1;
      return async () => {
        const [from, to] = generation % 2 === 1 ? [fx.taskA, fx.taskB] : [fx.taskB, fx.taskA];
        const r = await store.ownership.transferEnvironmentOwnership({
          environmentId: fx.environmentId,
          expectedOwnerTaskId: from,
          expectedGeneration: generation,
          newOwnerTaskId: to,
        });
        generation = r.generation;
      };
    },
    raw: (raw, fx) => {
      const update = placeholders(
        raw.kind,
        `
    update "task_environments"
       set "task_id" = ?, ownership_generation = ownership_generation + 1,
           cleanup_claimed_by = null, cleanup_claim_generation = null, cleanup_claim_expires_at = null,
           updated_at = ?
     where id = ? and "task_id" = ? and ownership_generation = ?
       and status = 'active'
       and (cleanup_claimed_by is null or cleanup_claim_expires_at <= ?)
       and "task_id" <> ?
       and exists (select 1 from tasks t where t.id = ?)
       and not exists (select 1 from task_cleanup_admissions a where a.task_id = ?)
    returning ownership_generation as generation`,
      );
      let generation = 1;
      return async () => {
        const [from, to] = generation % 2 === 1 ? [fx.taskA, fx.taskB] : [fx.taskB, fx.taskA];
        const now = Date.now();
        const results = await raw.tx([
          ...lock(raw, barrierLockKey(to)),
          ...lock(raw, ownedResourceLockKey('environment', fx.environmentId)),
          [update, [to, now, fx.environmentId, from, generation, now, to, to, to]],
        ]);
        const row = results.at(-1)![0] as { generation: number } | undefined;
        if (!row) throw new Error('transfer lost');
        generation = Number(row.generation);
      };
    },
  },
  {
    name: 'deliverPendingMessages (1 message)',
    taskfence: (store, fx) => async () => {
      const got = await store.messages.deliverPendingMessages(fx.inbox, { limit: 1 });
      if (got.length !== 1) throw new Error('inbox empty');
    },
    raw: (raw, fx) => {
      // The same work taskfence does, as hand-written SQL would do it: take over the messages of
      // the target's stopped runs, dead-letter lapsed last attempts, then hand out and ack the
      // oldest (SKIP LOCKED on PostgreSQL; SQLite's writers are serialized). Three statements;
      // taskfence folds them into one on PostgreSQL (since 2026-12-03; before, the baseline was
      // the hand-out alone).
      const [takeOver, deadLetter] = rawInboxUpkeep(raw);
      const deliver =
        raw.kind === 'postgres'
          ? `with "next" as materialized (select "id" from "messages" where "to_handle" = $1 and "status" = $2 and "dead_at" is null and ("visible_at" is null or "visible_at" <= $3) and "attempts" < 5 order by "seq" limit $4 for update skip locked) update "messages" set "status" = $5, "delivered_at" = $6, "attempts" = "attempts" + 1, "visible_at" = null where "id" in (select "next"."id" from "next") and "status" = $7 returning *`
          : placeholders(
              raw.kind,
              `update "messages" set "status" = ?, "delivered_at" = ?, "attempts" = "attempts" + 1, "visible_at" = null where "id" in (select "m"."id" from "messages" as "m" where "m"."to_handle" = ? and "m"."status" = ? and "m"."dead_at" is null and ("m"."visible_at" is null or "m"."visible_at" <= ?) and "m"."attempts" < 5 order by "m"."seq" limit cast(? as integer)) and "status" = ? returning *`,
            );
      return async () => {
        const now = Date.now();
        const params =
          raw.kind === 'postgres'
            ? [fx.inbox, 'pending', now, 1, 'delivered', now, 'pending']
            : ['delivered', now, fx.inbox, 'pending', now, 1, 'pending'];
        const results = await raw.tx([
          [takeOver, [fx.inbox, fx.inbox]],
          [deadLetter, [now, fx.inbox, now]],
          [deliver, params],
        ]);
        const rows = results.at(-1)! as { payload: string }[];
        if (rows.length !== 1) throw new Error('inbox empty');
        return rows.map((r) => JSON.parse(r.payload));
      };
    },
  },
  {
    name: 'receiveMessages → ackMessages (1 message)',
    taskfence: (store, fx) => async () => {
      const [m] = await store.messages.receiveMessages(fx.inbox, { limit: 1, visibilityMs: 60_000 });
      if (!m) throw new Error('inbox empty');
      const { acked } = await store.messages.ackMessages(fx.inbox, [m.receipt]);
      if (acked.length !== 1) throw new Error('ack refused');
    },
    raw: (raw, fx) => {
      // The floor of leased delivery, as a hand-written queue does it (pgmq's read + delete):
      // lease the oldest visible row (SKIP LOCKED on PostgreSQL), then ack it by its receipt.
      const visible = `"to_handle" = ? and "status" = 'pending' and "dead_at" is null and ("visible_at" is null or "visible_at" <= ?) and "attempts" < 5`;
      const receive = placeholders(
        raw.kind,
        raw.kind === 'postgres'
          ? `with "next" as materialized (select "id" from "messages" where ${visible} order by "seq" limit 1 for update skip locked) update "messages" set "attempts" = "attempts" + 1, "visible_at" = ?, "receipt" = ? where "id" in (select "id" from "next") returning *`
          : `update "messages" set "attempts" = "attempts" + 1, "visible_at" = ?, "receipt" = ? where "id" in (select "id" from "messages" where ${visible} order by "seq" limit 1) returning *`,
      );
      const ack = placeholders(
        raw.kind,
        `update "messages" set "status" = 'delivered', "delivered_at" = ?, "visible_at" = null where "id" = ? and "receipt" = ? returning "id"`,
      );
      // The same inbox upkeep as deliverPendingMessages (see there), before the hand-out.
      const [takeOver, deadLetter] = rawInboxUpkeep(raw);
      return async () => {
        const now = Date.now();
        const receipt = randomUUID();
        const params =
          raw.kind === 'postgres' ? [fx.inbox, now, now + 60_000, receipt] : [now + 60_000, receipt, fx.inbox, now];
        const [, , rows] = await raw.tx([
          [takeOver, [fx.inbox, fx.inbox]],
          [deadLetter, [now, fx.inbox, now]],
          [receive, params],
        ]);
        const m = (rows as { id: string }[])[0];
        if (!m) throw new Error('inbox empty');
        const [acked] = await raw.tx([[ack, [Date.now(), m.id, receipt]]]);
        if ((acked as unknown[]).length !== 1) throw new Error('ack refused');
      };
    },
  },
];

/**
 * What a hand-written inbox does before a hand-out, as two statements: the coordinator of a
 * running run takes over the pending messages of its target's stopped runs, and the inbox's
 * lapsed last attempts (5 attempts, the store's default) are dead-lettered.
 */
function rawInboxUpkeep(raw: RawClient): [string, string] {
  return [
    placeholders(
      raw.kind,
      `update "messages" set "to_handle" = ? where "status" = 'pending' and "to_handle" in (select "old"."coordinator_handle" from "coordinator_runs" "old" where "old"."status" <> 'running' and "old"."target_key" = (select "me"."target_key" from "coordinator_runs" "me" where "me"."coordinator_handle" = ? and "me"."status" = 'running'))`,
    ),
    placeholders(
      raw.kind,
      `update "messages" set "dead_at" = ?, "last_error" = coalesce("last_error", 'lapsed') where "to_handle" = ? and "status" = 'pending' and "dead_at" is null and "visible_at" <= ? and "attempts" >= 5`,
    ),
  ];
}

/** The raw equivalent of tryAcquirePaths + releasePaths, statement for statement. */
export function rawPathCycle(raw: RawClient, workspaceId: string, paths: string[]) {
  const p = (s: string) => placeholders(raw.kind, s);
  const keys = leaseKeys(paths.map(normalizeWritePath));
  const stored = keys.map(encodePathLeaseKey);
  const ancestors = [...new Set(keys.flatMap(storedPathAncestorKeys))];
  const live = 'workspace_id = ? and expires_at > ?';
  const branches: string[] = [];
  if (ancestors.length > 0)
    branches.push(
      `select lease_key, holder, expires_at, token from path_leases where ${live} and lease_key in (${ancestors.map(() => '?').join(', ')})`,
    );
  for (const _ of keys)
    branches.push(
      `select lease_key, holder, expires_at, token from path_leases where ${live} and lease_key >= ? and lease_key < ?`,
    );
  // The report limit as a literal, as taskfence sends it (a bound SQLite limit is a REAL).
  const conflicts = p(`${branches.join(' union all ')} limit 16`);
  // Since 0095: lock the workspace's token row, read its workspace lock, take the next token.
  const lockTokens = p(
    `select "token" from "path_lease_tokens" where "workspace_id" = ?${raw.kind === 'postgres' ? ' for update' : ''}`,
  );
  const readLock = p(
    `select "holder", "token", "expires_at" from "workspace_locks" where "workspace_id" = ? and "holder" is not null and "expires_at" > ?`,
  );
  const nextToken = p(
    `insert into "path_lease_tokens" ("workspace_id", "token", "updated_at") values (?, 1, ?) on conflict ("workspace_id") do update set "token" = path_lease_tokens.token + 1, "updated_at" = ? returning "token"`,
  );
  const prune = p(
    `delete from "path_leases" where "workspace_id" = ? and "lease_key" in (${stored.map(() => '?').join(', ')}) and "expires_at" <= ?`,
  );
  const insert = p(
    `insert into "path_leases" ("workspace_id", "lease_key", "holder", "task_id", "acquired_at", "expires_at", "token") values ${stored.map(() => '(?, ?, ?, ?, ?, ?, ?)').join(', ')} on conflict ("workspace_id", "lease_key", "holder") do update set "task_id" = coalesce("excluded"."task_id", path_leases.task_id), "acquired_at" = "excluded"."acquired_at", "expires_at" = "excluded"."expires_at", "token" = "excluded"."token" returning *`,
  );
  const release = p(
    `delete from "path_leases" where "workspace_id" = ? and "token" = ? and "holder" = ? returning "lease_key"`,
  );
  return async () => {
    const now = Date.now();
    const holder = 'bench';
    const conflictParams: unknown[] = [];
    if (ancestors.length > 0) conflictParams.push(workspaceId, now, ...ancestors);
    for (const key of keys) {
      const { from, to } = storedPathDescendantRange(key);
      conflictParams.push(workspaceId, now, from, to);
    }
    let token = 0;
    await raw.txWith(async (run) => {
      if (raw.kind === 'postgres')
        await run('select pg_advisory_xact_lock(hashtextextended($1, 0))', [pathsLockKey(workspaceId)]);
      // SQLite's write transaction holds the whole database: taskfence reads no token row there.
      if (raw.kind === 'postgres') await run(lockTokens, [workspaceId]);
      if ((await run(readLock, [workspaceId, now])).length > 0) throw new Error('workspace locked');
      const found = await run(conflicts, conflictParams);
      if (found.length > 0) throw new Error('paths busy');
      token = Number(((await run(nextToken, [workspaceId, now, now]))[0] as { token: number | string }).token);
      await run(prune, [workspaceId, ...stored, now]);
      await run(
        insert,
        stored.flatMap((key) => [workspaceId, key, holder, null, now, now + 60_000, token]),
      );
    });
    await raw.tx([[release, [workspaceId, token, holder]]]);
  };
}
