/**
 * Workspace locks and task leases (seed 000, SPEC §4): expiring, fenced leases.
 *
 * Both tables hold one row per workspace / task that is never deleted: a claim bumps `token`
 * under the row lock and a release sets `holder` to NULL, so tokens increase strictly for the
 * life of the workspace or task (a fencing token). A holder that crashed loses the lease when it
 * expires; a holder that lost its lease can neither renew nor release it.
 */
import { sql } from 'kysely';
import { NotFoundError } from '../errors.js';
import type { StoreContext } from './context.js';
import { prepared } from '../query/prepared.js';
import { requireCounter, requireId, requireInput, requirePositiveMs } from './validate.js';
import { tableIn } from '../query/schema.js';
import {
  StaleTaskLeaseError,
  StaleWorkspaceLockError,
  type CurrentLeaseState,
  type LockRepository,
  type StaleTokenReason,
  type TaskLeaseClaim,
  type WorkspaceLockClaim,
} from './shared/leases.js';

function requireToken(value: unknown): number {
  return requireCounter('token', value, 'token a claim returned');
}

interface LeaseRow {
  token: number;
  holder: string | null;
  expires_at: number | null;
}

function currentState(row: LeaseRow | undefined): CurrentLeaseState | null {
  return row
    ? {
        token: Number(row.token),
        holder: row.holder,
        expiresAt: row.expires_at === null ? null : Number(row.expires_at),
      }
    : null;
}

/** Why `token` failed against `row` (renew requires a live lease; release does not). */
function staleReason(row: LeaseRow | undefined, token: number): StaleTokenReason {
  if (!row || token > Number(row.token)) return 'unknown';
  if (token < Number(row.token)) return 'superseded';
  return 'expired';
}

// The fenced statements, prepared (see prepared.ts). A claim is one upsert: the row is never
// deleted, so `token + 1` is higher than every token granted before; PostgreSQL (READ COMMITTED)
// evaluates its WHERE on the latest row version under the row lock, SQLite inside BEGIN IMMEDIATE.
// No row back ⇒ someone holds a live lock. Renew and release match the token: a later claim has
// bumped it, so a stale holder matches nothing.

const CLAIM_WORKSPACE_LOCK = prepared(
  (db, p: { workspaceId: string; holder: string; runId: string; now: number; expiresAt: number }) => sql<{
    token: number;
    expires_at: number;
  }>`
    insert into ${tableIn(db, 'workspace_locks')} (workspace_id, holder, run_id, token, acquired_at, expires_at)
    values (${p.workspaceId}, ${p.holder}, ${p.runId}, 1, ${p.now}, ${p.expiresAt})
    on conflict (workspace_id) do update
      set holder = excluded.holder, run_id = excluded.run_id, token = workspace_locks.token + 1,
          acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
      where workspace_locks.holder is null or workspace_locks.expires_at <= ${p.now}
    returning token, expires_at`,
);

const RENEW_WORKSPACE_LOCK = prepared(
  (db, p: { workspaceId: string; token: number; now: number; expiresAt: number }) => sql<{ expires_at: number }>`
    update ${tableIn(db, 'workspace_locks')} set expires_at = ${p.expiresAt}
    where workspace_id = ${p.workspaceId} and token = ${p.token} and holder is not null and expires_at > ${p.now}
    returning expires_at`,
);

const RELEASE_WORKSPACE_LOCK = prepared(
  (db, p: { workspaceId: string; token: number; now: number }) => sql<{ token: number }>`
    update ${tableIn(db, 'workspace_locks')} set holder = null, run_id = null, expires_at = ${p.now}
    where workspace_id = ${p.workspaceId} and token = ${p.token} and holder is not null
    returning token`,
);

const CLAIM_TASK_LEASE = prepared(
  (db, p: { taskId: string; holder: string; now: number; expiresAt: number }) => sql<{
    token: number;
    expires_at: number;
  }>`
    insert into ${tableIn(db, 'task_leases')} (task_id, holder, token, acquired_at, expires_at)
    values (${p.taskId}, ${p.holder}, 1, ${p.now}, ${p.expiresAt})
    on conflict (task_id) do update
      set holder = excluded.holder, token = task_leases.token + 1,
          acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
      where task_leases.holder is null or task_leases.expires_at <= ${p.now}
    returning token, expires_at`,
);

const RENEW_TASK_LEASE = prepared(
  (db, p: { taskId: string; token: number; now: number; expiresAt: number }) => sql<{ expires_at: number }>`
    update ${tableIn(db, 'task_leases')} set expires_at = ${p.expiresAt}
    where task_id = ${p.taskId} and token = ${p.token} and holder is not null and expires_at > ${p.now}
    returning expires_at`,
);

const RELEASE_TASK_LEASE = prepared(
  (db, p: { taskId: string; token: number; now: number }) => sql<{ token: number }>`
    update ${tableIn(db, 'task_leases')} set holder = null, expires_at = ${p.now}
    where task_id = ${p.taskId} and token = ${p.token} and holder is not null
    returning token`,
);

/** Builds `store.locks` on a store context; every claim, renew and release is one write transaction. */
export function createLockRepository(ctx: StoreContext): LockRepository {
  const { dialect } = ctx;
  const db = dialect.db;

  /** Maps a foreign-key failure of a claim (no such workspace / task) to `NotFoundError`. */
  async function mapMissing<T>(entity: string, id: string, fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (error) {
      if (dialect.classifyError(error) === 'foreign_key_violation') throw new NotFoundError(entity, id);
      throw error;
    }
  }

  return {
    async claimWorkspaceLock(workspaceId, input) {
      requireId('workspaceId', workspaceId);
      requireInput('input', input);
      const holder = requireId('holder', input.holder);
      const runId = requireId('runId', input.runId);
      const ttlMs = requirePositiveMs('ttlMs', input.ttlMs);
      return mapMissing('workspace', workspaceId, () =>
        dialect.writeTransaction(async (trx): Promise<WorkspaceLockClaim> => {
          const now = ctx.clock.now();
          const expiresAt = now + ttlMs;
          const row = await CLAIM_WORKSPACE_LOCK.first(trx, { workspaceId, holder, runId, now, expiresAt });
          if (row) return { status: 'claimed', token: Number(row.token), expiresAt: Number(row.expires_at) };
          const held = await trx
            .selectFrom('workspace_locks')
            .select(['holder', 'run_id', 'token', 'expires_at'])
            .where('workspace_id', '=', workspaceId)
            .executeTakeFirstOrThrow();
          return {
            status: 'busy',
            heldBy: {
              holder: held.holder!,
              runId: held.run_id,
              token: Number(held.token),
              expiresAt: Number(held.expires_at),
            },
          };
        }),
      );
    },

    async renewWorkspaceLock(workspaceId, input) {
      requireId('workspaceId', workspaceId);
      requireInput('input', input);
      const token = requireToken(input.token);
      const ttlMs = requirePositiveMs('ttlMs', input.ttlMs);
      return dialect.writeTransaction(async (trx) => {
        const now = ctx.clock.now();
        // Only the latest grant, still held and not yet expired, may extend its lease.
        const row = await RENEW_WORKSPACE_LOCK.first(trx, { workspaceId, token, now, expiresAt: now + ttlMs });
        if (row) return { token, expiresAt: Number(row.expires_at) };
        const current = await trx
          .selectFrom('workspace_locks')
          .select(['token', 'holder', 'expires_at'])
          .where('workspace_id', '=', workspaceId)
          .executeTakeFirst();
        throw new StaleWorkspaceLockError(workspaceId, token, staleReason(current, token), currentState(current));
      });
    },

    async releaseWorkspaceLock(workspaceId, input) {
      requireId('workspaceId', workspaceId);
      requireInput('input', input);
      const token = requireToken(input.token);
      await dialect.writeTransaction(async (trx) => {
        const now = ctx.clock.now();
        // Matching the token is the whole fence: a later claim has bumped it, so a stale holder matches nothing.
        if (await RELEASE_WORKSPACE_LOCK.first(trx, { workspaceId, token, now })) return;
        const current = await trx
          .selectFrom('workspace_locks')
          .select(['token', 'holder', 'expires_at'])
          .where('workspace_id', '=', workspaceId)
          .executeTakeFirst();
        if (current && Number(current.token) === token && current.holder === null) return; // already released
        throw new StaleWorkspaceLockError(workspaceId, token, staleReason(current, token), currentState(current));
      });
    },

    async getWorkspaceLock(workspaceId) {
      requireId('workspaceId', workspaceId);
      const row = await db
        .selectFrom('workspace_locks')
        .select(['holder', 'run_id', 'token', 'expires_at'])
        .where('workspace_id', '=', workspaceId)
        .where('holder', 'is not', null)
        .where('expires_at', '>', ctx.clock.now())
        .executeTakeFirst();
      return row
        ? { holder: row.holder!, runId: row.run_id, token: Number(row.token), expiresAt: Number(row.expires_at) }
        : null;
    },

    async claimTaskLease(taskId, input) {
      requireId('taskId', taskId);
      requireInput('input', input);
      const holder = requireId('holder', input.holder);
      const ttlMs = requirePositiveMs('ttlMs', input.ttlMs);
      return mapMissing('task', taskId, () =>
        dialect.writeTransaction(async (trx): Promise<TaskLeaseClaim> => {
          const now = ctx.clock.now();
          const expiresAt = now + ttlMs;
          // Same fenced upsert as the workspace lock: one winner, token + 1, never reset.
          const row = await CLAIM_TASK_LEASE.first(trx, { taskId, holder, now, expiresAt });
          if (row) return { status: 'claimed', token: Number(row.token), expiresAt: Number(row.expires_at) };
          const held = await trx
            .selectFrom('task_leases')
            .select(['holder', 'token', 'expires_at'])
            .where('task_id', '=', taskId)
            .executeTakeFirstOrThrow();
          return {
            status: 'busy',
            heldBy: { holder: held.holder!, token: Number(held.token), expiresAt: Number(held.expires_at) },
          };
        }),
      );
    },

    async renewTaskLease(taskId, input) {
      requireId('taskId', taskId);
      requireInput('input', input);
      const token = requireToken(input.token);
      const ttlMs = requirePositiveMs('ttlMs', input.ttlMs);
      return dialect.writeTransaction(async (trx) => {
        const now = ctx.clock.now();
        const row = await RENEW_TASK_LEASE.first(trx, { taskId, token, now, expiresAt: now + ttlMs });
        if (row) return { token, expiresAt: Number(row.expires_at) };
        const current = await trx
          .selectFrom('task_leases')
          .select(['token', 'holder', 'expires_at'])
          .where('task_id', '=', taskId)
          .executeTakeFirst();
        throw new StaleTaskLeaseError(taskId, token, staleReason(current, token), currentState(current));
      });
    },

    async releaseTaskLease(taskId, input) {
      requireId('taskId', taskId);
      requireInput('input', input);
      const token = requireToken(input.token);
      await dialect.writeTransaction(async (trx) => {
        const now = ctx.clock.now();
        if (await RELEASE_TASK_LEASE.first(trx, { taskId, token, now })) return;
        const current = await trx
          .selectFrom('task_leases')
          .select(['token', 'holder', 'expires_at'])
          .where('task_id', '=', taskId)
          .executeTakeFirst();
        if (current && Number(current.token) === token && current.holder === null) return; // already released
        throw new StaleTaskLeaseError(taskId, token, staleReason(current, token), currentState(current));
      });
    },

    async getTaskLease(taskId) {
      requireId('taskId', taskId);
      const row = await db
        .selectFrom('task_leases')
        .select(['holder', 'token', 'expires_at'])
        .where('task_id', '=', taskId)
        .where('holder', 'is not', null)
        .where('expires_at', '>', ctx.clock.now())
        .executeTakeFirst();
      return row ? { holder: row.holder!, token: Number(row.token), expiresAt: Number(row.expires_at) } : null;
    },
  };
}
