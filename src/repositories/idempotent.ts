import { createHash } from 'node:crypto';
import { sql, type CompiledQuery, type Kysely, type Transaction } from 'kysely';
import {
  AlreadyExistsError,
  CommitOutcomeUnknownError,
  DatabaseFaultError,
  IdempotencyKeyConflictError,
  NotFoundError,
  type TaskfenceError,
} from '../errors.js';
import type { StoreDialect } from '../dialects/types.js';
import type { Database } from '../schema/database.js';
import type { StoreContext } from './context.js';
import { explainAfterRollback } from './shared/misses.js';
import { requireId } from './validate.js';

/*
 * Creates are idempotent where the caller names the row: a retry after COMMIT_OUTCOME_UNKNOWN
 * (or any retry) with the same id and the same input returns the row that exists, and converges
 * to exactly one row. The same id with other input is `AlreadyExistsError`.
 */

/** Throws `AlreadyExistsError` unless every requested value equals the stored one (null and undefined alike). */
export function requireSameCreate(
  entity: string,
  id: string,
  fields: Readonly<Record<string, readonly [requested: unknown, stored: unknown]>>,
): void {
  const differences = Object.entries(fields)
    .filter(([, [requested, stored]]) => !sameValue(requested, stored))
    .map(([field]) => field);
  if (differences.length > 0) throw new AlreadyExistsError(entity, id, differences);
}

function sameValue(a: unknown, b: unknown): boolean {
  if ((a === undefined || a === null) && (b === undefined || b === null)) return true;
  if (typeof a === 'object' || typeof b === 'object') return JSON.stringify(a) === JSON.stringify(b);
  return a === b;
}

/** A reference a create depends on: the entity kind for the error, its table, and the id (null: none). */
export type Reference = readonly [entity: string, table: ReferencedTable, id: string | null | undefined];
type ReferencedTable = 'companies' | 'workspaces' | 'agents' | 'projects' | 'tasks';

/**
 * Runs a create (a whole write transaction), turning its constraint failures into answers:
 * - a foreign-key violation becomes `NotFoundError` for the first missing reference (the database
 *   cannot say which one; the check runs after the rollback, `explainAfterRollback`, so the happy
 *   path pays nothing);
 * - a lost race on its own id (two concurrent creates of one id both see no row on PostgreSQL
 *   READ COMMITTED) runs the create once more, which finds the winner's row and answers as a
 *   retry would.
 */
export async function createOnce<T>(
  dialect: StoreDialect,
  references: readonly Reference[],
  attempt: () => Promise<T>,
  /**
   * A batch of N ids may lose a race N times to creators of overlapping batches, each lost race
   * meaning one more of its ids committed by another: it then gets N + 1 rounds.
   */
  rounds = 2,
): Promise<T> {
  for (let round = 1; ; round++) {
    try {
      return await explainAfterRollback(dialect, 'foreign_key_violation', attempt, async (db, error) => {
        await requireReferences(db, references);
        throw error;
      });
    } catch (error) {
      if (dialect.classifyError(error) !== 'unique_violation' || round >= rounds) throw error;
    }
  }
}

/** Fails with `NotFoundError` for the first reference that does not exist. */
export async function requireReferences(
  db: Kysely<Database> | Transaction<Database>,
  references: readonly Reference[],
): Promise<void> {
  for (const [entity, table, id] of references) {
    if (id === null || id === undefined) continue;
    const row = await db.selectFrom(table).select('id').where('id', '=', id).executeTakeFirst();
    if (!row) throw new NotFoundError(entity, id);
  }
}

/*
 * Idempotency keys, for mutations without a natural id (issue 23 item 3). A call that passes
 * `idempotencyKey` records, in the same transaction as its effect, the key, a fingerprint of its
 * input and its outcome: the result, or one of the call's typed refusals. A retry with the same
 * key and input (after COMMIT_OUTCOME_UNKNOWN, say) returns that outcome without running again;
 * other input under the key is `IdempotencyKeyConflictError`. Keys are per operation.
 *
 * The key row is inserted first: on PostgreSQL a concurrent call with the same key waits on the
 * primary key until the first commits (then reads its outcome) or rolls back (then runs itself);
 * on SQLite writers are serialized. Without a key, a call pays nothing.
 *
 * Keys are kept for at least `IDEMPOTENCY_WINDOW_MS` (24 hours); `maintenance.prune` deletes
 * older ones (those older than its cutoff too).
 */

/** How long a key (and a message id) is remembered at least: 24 hours. */
export const IDEMPOTENCY_WINDOW_MS = 24 * 3600_000;

/** An idempotency key for a call without a natural id (see the README: Failure model). */
export interface IdempotencyOptions {
  /**
   * A retry with the same key and the same input returns the first call's outcome (a result or
   * the same typed refusal); other input under the key is `IDEMPOTENCY_KEY_CONFLICT`. Keys are
   * per operation and kept at least 24 hours (`IDEMPOTENCY_WINDOW_MS`).
   */
  readonly idempotencyKey?: string;
}

/** A typed refusal a call may record as its outcome (the class, rebuilt on a replay). */
export type RefusalClass = abstract new (...args: never[]) => TaskfenceError;

/** One keyed call: the operation (keys are per operation), the caller's key, and its input. */
export interface IdempotentCall {
  readonly operation: string;
  readonly key: string;
  /** The call's input (JSON); a retry must pass the same. */
  readonly input: unknown;
  /** The typed refusals that are outcomes (stored and replayed); any other error stores nothing. */
  readonly refusals: readonly RefusalClass[];
}

interface StoredRefusal {
  readonly name: string;
  readonly message: string;
  /** Own fields, `code` and `name` included. */
  readonly fields: Record<string, unknown>;
}

type StoredOutcome =
  | { readonly ok: true; readonly value: unknown }
  | { readonly ok: false; readonly error: StoredRefusal };

/**
 * The keyed call of `operation`, or null when `options` carries no `idempotencyKey` (then the
 * call runs as a plain write transaction). The key is validated before any statement.
 */
export function keyedCall(
  operation: string,
  options: IdempotencyOptions | null | undefined,
  input: unknown,
  refusals: readonly RefusalClass[],
): IdempotentCall | null {
  const key = options?.idempotencyKey;
  if (key === undefined) return null;
  return { operation, key: requireId('idempotencyKey', key), input, refusals };
}

/**
 * `runIdempotent` on a store context's dialect and clock: what each repository's keyed write calls.
 * `lockKeys`: the keys `effect` locks first, taken as the transaction begins when the call is not
 * keyed (`WriteTransactionOptions.lockKeys`); a keyed call locks its key first and takes them in order.
 * `first`: the statement `effect` sends first, sent with BEGIN the same way
 * (`WriteTransactionOptions.first`; `effect` reads it with `beginResult`, else sends it), and
 * `commit`: BEGIN commits too (`WriteTransactionOptions.commit`; `effect` sends nothing else).
 */
export function keyedWrite<T>(
  ctx: StoreContext,
  call: IdempotentCall | null,
  effect: (trx: Transaction<Database>) => Promise<T>,
  lockKeys?: readonly string[],
  first?: CompiledQuery | readonly CompiledQuery[],
  commit = false,
): Promise<T> {
  if (call === null)
    return ctx.dialect.writeTransaction(
      effect,
      lockKeys || first ? { ...(lockKeys ? { lockKeys } : {}), ...(first ? { first, commit } : {}) } : undefined,
    );
  return runIdempotent(ctx.dialect, () => ctx.clock.now(), call, effect);
}

/**
 * A call whose whole write is one idempotent statement (a release, an ack), in one round trip on
 * PostgreSQL when `once` (an unkeyed call whose acts are not audited): BEGIN, `statement` and
 * COMMIT as one query (`WriteTransactionOptions.first` with `commit`). `settle` reads the
 * statement's rows: the call's result, or null when they do not settle it (a miss to explain).
 * Then, and wherever BEGIN did not carry the statement (SQLite, a host transaction), `ordinary`
 * runs the call as a transaction.
 *
 * A connection lost in that round trip leaves the outcome unknown. A repeat of these calls
 * converges (a second release is a no-op under the lease protocol's release rule; a second ack
 * under the same receipt is `acked`), so `ordinary` resolves it: it finds the effect in place or
 * makes it, and the caller never sees `COMMIT_OUTCOME_UNKNOWN` for a cut it could not tell from a
 * cut before COMMIT. If `ordinary` cannot reach the database either, the error is that
 * `CommitOutcomeUnknownError`: the outcome is still unknown.
 */
export async function idempotentInOneTrip<R, T>(
  ctx: StoreContext,
  once: boolean,
  statement: CompiledQuery<R>,
  settle: (rows: R[]) => { readonly value: T } | null,
  ordinary: () => Promise<T>,
): Promise<T> {
  if (!once) return ordinary();
  let settled: { readonly value: T } | null;
  try {
    settled = await ctx.dialect.writeTransaction(
      async () => {
        const sent = ctx.dialect.beginResult(statement);
        return sent ? settle(sent.rows) : null;
      },
      { first: statement, commit: true },
    );
  } catch (error) {
    if (!(error instanceof CommitOutcomeUnknownError)) throw error;
    try {
      return await ordinary();
    } catch (again) {
      throw again instanceof DatabaseFaultError ? error : again;
    }
  }
  return settled ? settled.value : ordinary();
}

/**
 * What an effect returns to keep its writes and still refuse (a cleanup fence marks a snapshot
 * stale, then refuses): the refusal is stored with the writes and thrown after the commit.
 */
export class RefusalAfterWrites {
  constructor(readonly error: TaskfenceError) {}
}

const SAVEPOINT = sql.raw('savepoint taskfence_idempotent');
const ROLLBACK_TO = sql.raw('rollback to savepoint taskfence_idempotent');
const RELEASE = sql.raw('release savepoint taskfence_idempotent');

/** A stable fingerprint of a JSON input: object keys sorted, undefined dropped. */
export function fingerprintOf(input: unknown): string {
  return createHash('sha256').update(stableJson(input)).digest('hex');
}

function stableJson(value: unknown): string {
  if (value === undefined || value === null) return 'null';
  if (Array.isArray(value)) return `[${value.map(stableJson).join(',')}]`;
  if (typeof value === 'object') {
    const entries = Object.entries(value as Record<string, unknown>)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${stableJson(v)}`).join(',')}}`;
  }
  return JSON.stringify(value);
}

/**
 * Runs `effect` in one write transaction of `dialect`, under `call`'s key when there is one
 * (null: no key, exactly `dialect.writeTransaction(effect)`). The result must be JSON data.
 */
export async function runIdempotent<T>(
  dialect: StoreDialect,
  now: () => number,
  call: IdempotentCall | null,
  effect: (trx: Transaction<Database>) => Promise<T>,
): Promise<T> {
  if (call === null) return dialect.writeTransaction(effect);
  const fingerprint = fingerprintOf(call.input);
  const outcome = await dialect.writeTransaction(async (trx): Promise<StoredOutcome> => {
    const claimed = await trx
      .insertInto('idempotency_keys')
      .values({ operation: call.operation, key: call.key, fingerprint, outcome: '{}', created_at: now() })
      .onConflict((oc) => oc.columns(['operation', 'key']).doNothing())
      .returning('key')
      .executeTakeFirst();
    if (!claimed) {
      const stored = await trx
        .selectFrom('idempotency_keys')
        .select(['fingerprint', 'outcome'])
        .where('operation', '=', call.operation)
        .where('key', '=', call.key)
        .executeTakeFirstOrThrow();
      if (stored.fingerprint !== fingerprint) throw new IdempotencyKeyConflictError(call.operation, call.key);
      return JSON.parse(stored.outcome) as StoredOutcome;
    }
    let result: StoredOutcome;
    await SAVEPOINT.execute(trx);
    try {
      const value = await effect(trx);
      await RELEASE.execute(trx);
      result = value instanceof RefusalAfterWrites ? refusalOf(value.error) : { ok: true, value };
    } catch (error) {
      const refusal = call.refusals.find((cls) => error instanceof cls) !== undefined;
      if (!refusal) throw error;
      // Undo whatever the refused effect wrote; the key keeps the refusal.
      await ROLLBACK_TO.execute(trx);
      await RELEASE.execute(trx);
      result = refusalOf(error as TaskfenceError);
    }
    await trx
      .updateTable('idempotency_keys')
      .set({ outcome: JSON.stringify(result) })
      .where('operation', '=', call.operation)
      .where('key', '=', call.key)
      .execute();
    return result;
  });
  if (outcome.ok) return outcome.value as T;
  throw replayRefusal(call, outcome.error);
}

function refusalOf(refused: TaskfenceError): StoredOutcome {
  return { ok: false, error: { name: refused.name, message: refused.message, fields: { ...refused } } };
}

/** The stored refusal as an instance of its class again (same fields and message as first thrown). */
function replayRefusal(call: IdempotentCall, stored: StoredRefusal): Error {
  const cls = call.refusals.find((c) => c.name === stored.name);
  if (cls === undefined) return new IdempotencyKeyConflictError(call.operation, call.key);
  const error = Object.create(cls.prototype as object) as TaskfenceError;
  Object.assign(error, stored.fields);
  Object.defineProperty(error, 'stack', {
    value: `${stored.name}: ${stored.message}\n    (replayed for idempotency key ${JSON.stringify(call.key)})`,
    configurable: true,
    writable: true,
  });
  Object.defineProperty(error, 'message', { value: stored.message, configurable: true, writable: true });
  return error;
}
