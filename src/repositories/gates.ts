import { InvalidArgumentError, NotFoundError, TaskfenceError } from '../errors.js';
import type { DecisionGateRow, GateStatus } from '../schema/database.js';
import type { StoreContext } from './context.js';
import { requireRunningRunIn } from './shared/running-run.js';
import { optionalId, optionalInput, requireId, requireInput, requirePositiveMs, requireText } from './validate.js';
import { dispatchTaskLockKey } from '../protocol.js';
import {
  FAILED_DEPENDENCY_REASON,
  GATE_REASON,
  GATE_TIMEOUT_REASON,
  WAITING_REASON,
  failedDependencyReason,
  openDependencies,
  openGateOf,
  waitingReason,
} from './shared/lifecycle.js';
import type { Database } from '../schema/database.js';
import type { Transaction } from 'kysely';
import {
  createOnce,
  keyedCall,
  keyedWrite,
  requireSameCreate,
  runIdempotent,
  type IdempotencyOptions,
} from './idempotent.js';
import {
  CONSUME_REFUSALS,
  consumeResolutionIn,
  type ConsumedResolution,
  type ConsumeResolutionInput,
} from './gate-resume.js';
import { committed, type OutcomeDeclarations } from './shared/outcomes.js';

/** A decision gate: a question that blocks a task until it is resolved, its resolution consumed once. */
export interface DecisionGate {
  readonly id: string;
  readonly taskId: string | null;
  readonly question: string;
  readonly status: GateStatus;
  readonly resolution: string | null;
  readonly createdAt: number;
  readonly resolvedAt: number | null;
  readonly coordinatorRunId: string | null;
  /** When the gate times out if still open (`gates.expireGates`); null: never. */
  readonly expiresAt: number | null;
}

export interface OpenGateInput {
  /**
   * The gate's id (default: generated). A retry with the same id and input returns the gate as
   * stored; other input under the id is `ALREADY_EXISTS`.
   */
  readonly id?: string;
  readonly question: string;
  /** The task waiting on the decision; the gate follows the task when a run adopts it. */
  readonly taskId?: string | null;
  /** The run asking; must be running. Default: the task's run (or none without a task). */
  readonly runId?: string;
  /** The gate times out after this long if still open (`gates.expireGates`); default: never. */
  readonly ttlMs?: number;
}

/** The gate was already resolved: a decision is made once. */
export class GateAlreadyResolvedError extends TaskfenceError {
  readonly code = 'GATE_ALREADY_RESOLVED';
  constructor(
    readonly gateId: string,
    readonly resolution: string | null,
    readonly resolvedAt: number | null,
    /** `resolved`, or `timeout` for a gate that timed out before a decision. */
    readonly status: 'resolved' | 'timeout' = 'resolved',
  ) {
    super(
      status === 'timeout'
        ? `Decision gate ${gateId} timed out before a decision. Open a new gate to decide again.`
        : `Decision gate ${gateId} was already resolved (resolution ${JSON.stringify(resolution)}). ` +
            'A gate is resolved once; read its resolution, or open a new gate to decide again.',
    );
  }
}

/** Decision gates (SPEC §3): questions a run waits on, resolved exactly once. */
export interface GateRepository {
  /**
   * Opens a gate, stamped with the asking run (which must be running) or the task's run. A gate
   * gates its task: a task not yet dispatched (`backlog`, `todo`, `ready`) becomes `blocked`
   * (reason `gate: <id>`) in the same transaction, so `dispatchNext` passes it over; an in-flight
   * task keeps running, but its completion is refused (`GateOpenError`) while the gate is open.
   * With `ttlMs`, `expireGates` moves the gate to `timeout` once it lapses.
   */
  openGate(input: OpenGateInput): Promise<DecisionGate>;
  /**
   * Moves every open gate whose `ttlMs` lapsed to `timeout` and returns them. Their tasks stay
   * `blocked`, with the reason `gate_timeout: <id>`: the coordinator decides (`transitionTask`
   * to `ready` to go on without a decision, or to `cancelled`).
   */
  expireGates(options?: { readonly runId?: string } & IdempotencyOptions): Promise<DecisionGate[]>;
  /** The gate with this id, or null; a plain read. */
  getGate(gateId: string): Promise<DecisionGate | null>;
  /**
   * Resolves an open gate; its task, if the gate held it and no other gate is open on it, becomes
   * `ready` (or stays `blocked` on its dependencies) in the same transaction. Of concurrent
   * resolutions exactly one wins; a later call with the same
   * resolution returns the gate (a retry converges), one with another resolution gets
   * `GateAlreadyResolvedError` carrying the winning resolution. With an `idempotencyKey`, a retry
   * returns the first call's outcome.
   */
  resolveGate(gateId: string, resolution: string, options?: IdempotencyOptions): Promise<DecisionGate>;
  /**
   * Lets exactly one caller take a resolved gate's decision: the first call records `consumer`
   * and returns the resolution; every later call gets `ResolutionAlreadyConsumedError` naming the
   * consumer (and `GateNotResolvedError` before the gate is resolved). Pass an `idempotencyKey` so
   * the consumer's own retry (after `COMMIT_OUTCOME_UNKNOWN`) returns its first outcome.
   *
   * @example
   * const taken = await store.gates.consumeResolution(gate.id, { consumer: run.id, idempotencyKey: `resume:${gate.id}` });
   */
  consumeResolution(gateId: string, input: ConsumeResolutionInput): Promise<ConsumedResolution>;
  /** The run's open gates, oldest first; never another run's. */
  listOpenGates(runId: string): Promise<DecisionGate[]>;
}

/** Maps a `decision_gates` row to the public shape. */
export function toDecisionGate(row: DecisionGateRow): DecisionGate {
  return {
    id: row.id,
    taskId: row.task_id,
    question: row.question,
    status: row.timed_out_at !== null ? 'timeout' : row.status,
    resolution: row.resolution,
    createdAt: row.created_at,
    resolvedAt: row.resolved_at,
    coordinatorRunId: row.coordinator_run_id,
    expiresAt: row.expires_at === null ? null : Number(row.expires_at),
  };
}

/** Reasons the lifecycle gave a blocked task (not a caller's own): a gate's, or its dependencies'. */
const LIFECYCLE_REASONS = [GATE_REASON, GATE_TIMEOUT_REASON, WAITING_REASON, FAILED_DEPENDENCY_REASON];

/**
 * After a gate on `taskId` was resolved, in its transaction: a task the lifecycle blocked moves
 * on to what holds it now (another open gate, its dependencies) or to `ready`. The task row is
 * locked first (`rowLocks`: PostgreSQL), so a dependency finishing at once is seen either here or
 * by its own transaction's readiness check.
 */
async function releaseGatedTask(trx: Transaction<Database>, taskId: string, now: number, rowLocks: boolean) {
  const read = trx.selectFrom('tasks').select(['status', 'blocked_reason']).where('id', '=', taskId);
  const task = await (rowLocks ? read.forUpdate() : read).executeTakeFirst();
  if (!task || task.status !== 'blocked') return;
  if (!LIFECYCLE_REASONS.some((r) => (task.blocked_reason ?? '').startsWith(r))) return;
  const other = await openGateOf(trx, taskId);
  const open = other === null ? await openDependencies(trx, taskId) : [];
  const failed = open.find((d) => d.status === 'failed' || d.status === 'cancelled');
  const reason =
    other !== null
      ? `${GATE_REASON}${other}`
      : failed
        ? failedDependencyReason(failed.id, failed.status)
        : open.length > 0
          ? waitingReason(open.map((d) => d.id))
          : null;
  await trx
    .updateTable('tasks')
    .set({ status: reason === null ? 'ready' : 'blocked', blocked_reason: reason, updated_at: now })
    .where('id', '=', taskId)
    .where('status', '=', 'blocked')
    .execute();
}

/** The gate repository on a store context (wired as `store.gates`). */
export function createGateRepository(ctx: StoreContext): GateRepository {
  const { dialect } = ctx;
  const { db } = dialect;

  async function getGate(gateId: string): Promise<DecisionGate | null> {
    requireId('gateId', gateId);
    const row = await db.selectFrom('decision_gates').selectAll().where('id', '=', gateId).executeTakeFirst();
    return row ? toDecisionGate(row) : null;
  }

  return {
    async openGate(input) {
      requireInput('input', input);
      const question = requireText('question', input.question);
      const taskId = optionalId('taskId', input.taskId);
      if (input.runId !== undefined) requireId('runId', input.runId);
      const ttlMs = input.ttlMs === undefined ? null : requirePositiveMs('ttlMs', input.ttlMs);
      const id = input.id === undefined ? ctx.newId() : requireId('id', input.id);
      const row = await createOnce(dialect, [], () =>
        dialect.writeTransaction(async (trx) => {
          if (input.id !== undefined) {
            const existing = await trx.selectFrom('decision_gates').selectAll().where('id', '=', id).executeTakeFirst();
            if (existing) {
              // A retry of this open (e.g. after COMMIT_OUTCOME_UNKNOWN): the same input gets the stored gate.
              requireSameCreate('decision gate', id, {
                question: [question, existing.question],
                taskId: [taskId, existing.task_id],
                runId: [input.runId ?? existing.coordinator_run_id, existing.coordinator_run_id],
                ttlMs: [
                  ttlMs,
                  existing.expires_at === null ? null : Number(existing.expires_at) - Number(existing.created_at),
                ],
              });
              return existing;
            }
          }
          let runId: string | null = null;
          // The task's dispatch key first, as every call that moves a task takes it.
          if (taskId !== null) {
            await dialect.lockKey(trx, dispatchTaskLockKey(taskId));
            // The task row too (PostgreSQL): a dispatchNext holding it (it claims without the key)
            // commits first, and one that comes later skips the row, then sees it blocked.
            const read = trx.selectFrom('tasks').select('coordinator_run_id').where('id', '=', taskId);
            const task = await (dialect.supportsSkipLocked ? read.forUpdate() : read).executeTakeFirst();
            if (!task) throw new NotFoundError('task', taskId);
            runId = task.coordinator_run_id;
          }
          // The clock after the locks: the gate's time follows every move of the task before it.
          const now = ctx.clock.now();
          if (input.runId !== undefined) {
            await requireRunningRunIn(trx, input.runId);
            if (taskId !== null && runId !== input.runId) {
              throw new InvalidArgumentError(
                'runId',
                `task ${taskId} belongs to ${runId === null ? 'no run' : `run ${runId}`}, not run ${input.runId}`,
              );
            }
            runId = input.runId;
          }
          const gate = await trx
            .insertInto('decision_gates')
            .values({
              id,
              task_id: taskId,
              question,
              status: 'open',
              resolution: null,
              created_at: now,
              resolved_at: null,
              coordinator_run_id: runId,
              expires_at: ttlMs === null ? null : now + ttlMs,
            })
            .returningAll()
            .executeTakeFirstOrThrow();
          // The gate gates its task: one not yet dispatched waits for the decision.
          if (taskId !== null)
            await trx
              .updateTable('tasks')
              .set({ status: 'blocked', blocked_reason: `${GATE_REASON}${id}`, updated_at: now })
              .where('id', '=', taskId)
              .where('status', 'in', ['backlog', 'todo', 'ready'])
              .execute();
          return gate;
        }),
      );
      return toDecisionGate(row);
    },

    async expireGates(options) {
      const opts = optionalInput('options', options);
      const runId = optionalId('runId', opts.runId ?? null);
      return keyedWrite(ctx, keyedCall('gates.expireGates', opts, { runId }, []), async (trx) => {
        const now = ctx.clock.now();
        let query = trx
          .updateTable('decision_gates')
          .set({ status: 'resolved', resolution: null, resolved_at: now, timed_out_at: now })
          .where('status', '=', 'open')
          .where('expires_at', '<=', now);
        if (runId !== null) query = query.where('coordinator_run_id', '=', runId);
        const expired = await query.returningAll().execute();
        for (const gate of expired) {
          if (gate.task_id === null) continue;
          await trx
            .updateTable('tasks')
            .set({ blocked_reason: `${GATE_TIMEOUT_REASON}${gate.id}`, updated_at: now })
            .where('id', '=', gate.task_id)
            .where('status', '=', 'blocked')
            .where('blocked_reason', '=', `${GATE_REASON}${gate.id}`)
            .execute();
        }
        return expired.sort((a, b) => Number(a.created_at) - Number(b.created_at)).map(toDecisionGate);
      });
    },

    getGate,

    async resolveGate(gateId, resolution, options) {
      requireId('gateId', gateId);
      const text = requireText('resolution', resolution);
      const key = optionalInput('options', options).idempotencyKey;
      const call =
        key === undefined
          ? null
          : {
              operation: 'gates.resolveGate',
              key: requireId('idempotencyKey', key),
              input: { gateId, resolution: text },
              refusals: [GateAlreadyResolvedError, NotFoundError],
            };
      return runIdempotent(
        dialect,
        () => ctx.clock.now(),
        call,
        async (trx) => {
          // `status = 'open'` in the WHERE makes the resolution a compare-and-set.
          const now = ctx.clock.now();
          const row = await trx
            .updateTable('decision_gates')
            .set({ status: 'resolved', resolution: text, resolved_at: now })
            .where('id', '=', gateId)
            .where('status', '=', 'open')
            .returningAll()
            .executeTakeFirst();
          if (row) {
            if (row.task_id !== null) await releaseGatedTask(trx, row.task_id, now, dialect.supportsSkipLocked);
            return toDecisionGate(row);
          }
          const current = await trx
            .selectFrom('decision_gates')
            .selectAll()
            .where('id', '=', gateId)
            .executeTakeFirst();
          if (!current) throw new NotFoundError('decision gate', gateId);
          // The same resolution again is a retry that converged: the gate, as resolved.
          if (current.status === 'resolved' && current.resolution === text) return toDecisionGate(current);
          throw new GateAlreadyResolvedError(
            gateId,
            current.resolution,
            current.resolved_at,
            current.timed_out_at !== null ? 'timeout' : 'resolved',
          );
        },
      );
    },

    async consumeResolution(gateId, input) {
      requireId('gateId', gateId);
      requireInput('input', input);
      const consumer = requireId('consumer', input.consumer);
      const call =
        input.idempotencyKey === undefined
          ? null
          : {
              operation: 'gates.consumeResolution',
              key: requireId('idempotencyKey', input.idempotencyKey),
              input: { gateId, consumer },
              refusals: CONSUME_REFUSALS,
            };
      return runIdempotent(
        dialect,
        () => ctx.clock.now(),
        call,
        (trx) => consumeResolutionIn(trx, gateId, consumer, ctx.clock.now()),
      );
    },

    async listOpenGates(runId) {
      const rows = await db
        .selectFrom('decision_gates')
        .selectAll()
        .where('coordinator_run_id', '=', requireId('runId', runId))
        .where('status', '=', 'open')
        .orderBy('created_at')
        .orderBy('id')
        .execute();
      return rows.map(toDecisionGate);
    },
  };
}

/** Each call's declared outcome (see shared/outcomes.ts); a resolved or consumed gate is `busy` by its code. */
export const GATE_OUTCOMES: OutcomeDeclarations<GateRepository> = {
  openGate: committed,
  expireGates: committed,
  getGate: committed,
  resolveGate: committed,
  consumeResolution: committed,
  listOpenGates: committed,
};
