import { InvalidArgumentError, NotFoundError, TaskfenceError } from '../errors.js';
import type { DecisionGateRow, GateStatus } from '../schema/database.js';
import type { StoreContext } from './context.js';
import { requireRunningRunIn } from './shared/running-run.js';
import { optionalId, optionalInput, requireId, requireInput, requireText } from './validate.js';
import { runIdempotent, type IdempotencyOptions } from './idempotent.js';
import {
  CONSUME_REFUSALS,
  consumeResolutionIn,
  type ConsumedResolution,
  type ConsumeResolutionInput,
} from './gate-resume.js';

export interface DecisionGate {
  readonly id: string;
  readonly taskId: string | null;
  readonly question: string;
  readonly status: GateStatus;
  readonly resolution: string | null;
  readonly createdAt: number;
  readonly resolvedAt: number | null;
  readonly coordinatorRunId: string | null;
}

export interface OpenGateInput {
  readonly question: string;
  /** The task waiting on the decision; the gate follows the task when a run adopts it. */
  readonly taskId?: string | null;
  /** The run asking; must be running. Default: the task's run (or none without a task). */
  readonly runId?: string;
}

/** The gate was already resolved: a decision is made once. */
export class GateAlreadyResolvedError extends TaskfenceError {
  readonly code = 'GATE_ALREADY_RESOLVED';
  constructor(
    readonly gateId: string,
    readonly resolution: string | null,
    readonly resolvedAt: number | null,
  ) {
    super(
      `Decision gate ${gateId} was already resolved (resolution ${JSON.stringify(resolution)}). ` +
        'A gate is resolved once; read its resolution, or open a new gate to decide again.',
    );
  }
}

/** Decision gates (SPEC §3): questions a run waits on, resolved exactly once. */
export interface GateRepository {
  /** Opens a gate, stamped with the asking run (which must be running) or the task's run. */
  openGate(input: OpenGateInput): Promise<DecisionGate>;
  /** The gate with this id, or null; a plain read. */
  getGate(gateId: string): Promise<DecisionGate | null>;
  /**
   * Resolves an open gate. Of concurrent resolutions exactly one wins; a later call with the same
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
    status: row.status,
    resolution: row.resolution,
    createdAt: row.created_at,
    resolvedAt: row.resolved_at,
    coordinatorRunId: row.coordinator_run_id,
  };
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
      const id = ctx.newId();
      const now = ctx.clock.now();
      const row = await dialect.writeTransaction(async (trx) => {
        let runId: string | null = null;
        if (taskId !== null) {
          const task = await trx
            .selectFrom('tasks')
            .select('coordinator_run_id')
            .where('id', '=', taskId)
            .executeTakeFirst();
          if (!task) throw new NotFoundError('task', taskId);
          runId = task.coordinator_run_id;
        }
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
        return trx
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
          })
          .returningAll()
          .executeTakeFirstOrThrow();
      });
      return toDecisionGate(row);
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
          const row = await trx
            .updateTable('decision_gates')
            .set({ status: 'resolved', resolution: text, resolved_at: ctx.clock.now() })
            .where('id', '=', gateId)
            .where('status', '=', 'open')
            .returningAll()
            .executeTakeFirst();
          if (row) return toDecisionGate(row);
          const current = await trx
            .selectFrom('decision_gates')
            .selectAll()
            .where('id', '=', gateId)
            .executeTakeFirst();
          if (!current) throw new NotFoundError('decision gate', gateId);
          // The same resolution again is a retry that converged: the gate, as resolved.
          if (current.status === 'resolved' && current.resolution === text) return toDecisionGate(current);
          throw new GateAlreadyResolvedError(gateId, current.resolution, current.resolved_at);
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
