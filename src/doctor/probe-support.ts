import { randomBytes } from 'node:crypto';
import { sql, type Kysely, type Transaction } from 'kysely';
import type { StoreDialect } from '../dialects/types.js';
import { schemaOf } from '../query/schema.js';
import type { Database } from '../schema/database.js';
import type { SchemaDescription } from '../schema/describe.js';
import { driverCodeOf, PermissionDeniedError, ReadOnlyError } from '../errors.js';
import { check, type DoctorCheck } from './report.js';

class ProbeRollback extends Error {
  constructor() {
    super('doctor probe: roll back');
  }
}

/**
 * Runs `fn` inside the dialect's own write transaction (the one repositories use, so the probe sees
 * what they see) and rolls it back: a probe leaves nothing behind.
 */
export async function inRolledBackWrite(
  dialect: StoreDialect,
  fn: (trx: Transaction<Database>) => Promise<void>,
): Promise<void> {
  try {
    await dialect.writeTransaction(
      async (trx) => {
        await fn(trx);
        throw new ProbeRollback();
      },
      { deadlineMs: 10_000 },
    );
  } catch (error) {
    if (!(error instanceof ProbeRollback) && !((error as { cause?: unknown } | null)?.cause instanceof ProbeRollback))
      throw error;
  }
}

/** The pool could not hand out a second connection in time (a pool of one, or every client busy). */
export class NoSecondConnectionError extends Error {
  constructor(readonly waitMs: number) {
    super(`no second connection from the store's pool within ${waitMs} ms (poolSize 1, or every connection busy)`);
  }
}

/**
 * Runs `fn` on another connection from `db`'s pool while the caller holds one. Fails with
 * `NoSecondConnectionError` if none is handed out within `waitMs`; a connection handed out later
 * is released untouched.
 */
export async function onSecondConnection<T>(
  db: Kysely<Database>,
  waitMs: number,
  fn: (conn: Kysely<Database>) => Promise<T>,
): Promise<T> {
  let abandoned = false;
  let acquired!: () => void;
  const gotConnection = new Promise<'acquired'>((resolve) => (acquired = () => resolve('acquired')));
  const attempt = db.connection().execute(async (conn) => {
    if (abandoned) return undefined as T;
    acquired();
    return fn(conn);
  });
  attempt.catch(() => {});
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<'timeout'>((resolve) => (timer = setTimeout(() => resolve('timeout'), waitMs)));
  const first = await Promise.race([
    gotConnection,
    attempt.then(
      () => 'acquired' as const,
      () => 'acquired' as const,
    ),
    timeout,
  ]);
  clearTimeout(timer);
  if (first === 'timeout') {
    abandoned = true;
    throw new NoSecondConnectionError(waitMs);
  }
  return attempt;
}

export function probeName(): string {
  return randomBytes(6).toString('hex');
}

export function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** The server's word for "in recovery" in every read-only warning, so an operator can grep for it. */
export const IN_RECOVERY = 'the server is in recovery (a hot standby), writes will fail with READ_ONLY';

/**
 * Runs a probe; a probe that throws unexpectedly is itself a failure, with the reason. Two
 * refusals are not failures of the guarantee and are warnings that say so: the role may not run
 * the probe (42501, the privilege named; the runtime needs only SELECT/INSERT/UPDATE/DELETE), and
 * the server takes no writes (a standby, or default_transaction_read_only).
 */
export async function runProbe(
  id: `${'guarantee' | 'environment'}.${string}`,
  probe: () => Promise<DoctorCheck>,
): Promise<DoctorCheck> {
  try {
    return await probe();
  } catch (error) {
    if (error instanceof NoSecondConnectionError) return check(id, 'warn', `not probed: ${error.message}`);
    if (error instanceof ReadOnlyError) {
      return check(
        id,
        'warn',
        `not probed: ${error.inRecovery ? IN_RECOVERY : 'the database is read-only (default_transaction_read_only), writes will fail with READ_ONLY'}`,
      );
    }
    if (error instanceof PermissionDeniedError || driverCodeOf(error) === '42501') {
      const raw = error instanceof PermissionDeniedError ? error.cause : error;
      const lacks =
        error instanceof PermissionDeniedError && error.privilege && error.object
          ? `${error.privilege} on ${error.object}`
          : missingPrivilege(errorMessage(raw));
      return check(
        id,
        'warn',
        `not probed: this role lacks ${lacks}, which only the probe needs (${errorMessage(raw)}); ${RUNTIME_GRANTS}`,
      );
    }
    return check(id, 'fail', `the probe itself failed: ${errorMessage(error)}`);
  }
}

/** What a least-privilege application role needs, as doctor advises it (README, Least privilege). */
export const RUNTIME_GRANTS =
  "the runtime needs only USAGE on the schema, SELECT, INSERT, UPDATE and DELETE on taskfence's tables and USAGE on its sequences (tasks, dispatch_contexts and messages take seq from nextval)";

/** The privilege a PostgreSQL "permission denied for …" names, in GRANT's words. */
function missingPrivilege(message: string): string {
  const schema = /permission denied for schema (\S+)/.exec(message);
  if (schema) return `CREATE on schema ${schema[1]}`;
  const relation = /permission denied for (table|sequence|relation) (\S+)/.exec(message);
  if (relation) return `a privilege on ${relation[1]} ${relation[2]}`;
  const database = /permission denied for database (\S+)/.exec(message);
  if (database) return `CREATE or TEMPORARY on database ${database[1]}`;
  return 'a privilege';
}

const GUARD_INDEX = 'coordinator_runs_one_running_per_target';

/**
 * `guarantee.one-running-run`: the partial unique index that lets the database refuse a second
 * running run for one target exists as 0007 made it, and does refuse: two running rows for one
 * (fresh) target inserted in a rolled-back transaction; the second must be a unique violation.
 */
export async function oneRunningRunCheck(dialect: StoreDialect, live: SchemaDescription): Promise<DoctorCheck> {
  const id = 'guarantee.one-running-run';
  const runs = live.tables.coordinator_runs;
  if (!runs || !('target_key' in runs.columns)) {
    return check(
      id,
      'warn',
      'not probed: coordinator_runs has no target_key yet (the guard comes with migration 0007)',
    );
  }
  const index = runs.indexes[GUARD_INDEX];
  if (!index || !index.unique || index.where === null || !index.where.includes("status='running'")) {
    return check(
      id,
      'fail',
      `the partial unique index ${GUARD_INDEX} is missing or altered: two runs could run on one target`,
    );
  }
  const target = `taskfence-doctor-${probeName()}`;
  const outcome: { second: 'inserted' | 'unique_violation' | 'other'; error: string } = { second: 'other', error: '' };
  await inRolledBackWrite(dialect, async (trx) => {
    const row = (n: number) => ({
      id: `${target}-${n}`,
      coordinator_handle: `${target}-${n}`,
      status: 'running' as const,
      spec: null,
      started_at: n,
      ended_at: null,
      target_key: target,
      heartbeat_at: n,
    });
    await trx.insertInto('coordinator_runs').values(row(1)).execute();
    try {
      await trx.insertInto('coordinator_runs').values(row(2)).execute();
      outcome.second = 'inserted';
    } catch (error) {
      outcome.second = dialect.classifyError(error) === 'unique_violation' ? 'unique_violation' : 'other';
      outcome.error = errorMessage(error);
    }
  });
  if (outcome.second === 'unique_violation')
    return check(id, 'pass', `${GUARD_INDEX} rejected a second running run for one target (rolled back)`);
  if (outcome.second === 'inserted')
    return check(id, 'fail', `${GUARD_INDEX} exists but accepted a second running run for one target`);
  return check(
    id,
    'fail',
    `the second running row failed with something other than a unique violation: ${outcome.error}`,
  );
}

/** `select … as v` on `db`, the first row's `v`. */
export async function scalar<T>(db: Kysely<Database>, query: ReturnType<typeof sql<{ v: T }>>): Promise<T | undefined> {
  return (await query.execute(db)).rows[0]?.v;
}

/**
 * The PostgreSQL schema taskfence's tables live in: the configured one (`openStore({ schema })`,
 * `?schema=`, `--schema`) when there is one, whether or not anything was migrated yet; else the
 * schema of the migration history table, asked through the store's own query builder; else
 * `current_schema()` (nothing migrated, no schema configured). Raw probe SQL qualifies its
 * scratch objects and catalog lookups with it, never relying on the search path.
 */
export async function taskfenceSchema(db: Kysely<Database>): Promise<string> {
  const configured = schemaOf(db);
  if (configured !== undefined) return configured;
  const row = await db
    .selectFrom('taskfence_migrations')
    .select(
      sql<string>`(select n.nspname from pg_class c join pg_namespace n on n.oid = c.relnamespace where c.oid = tableoid)`.as(
        'schema',
      ),
    )
    .limit(1)
    .executeTakeFirst()
    .catch(() => undefined);
  return row?.schema ?? (await scalar(db, sql<{ v: string }>`select current_schema() as v`)) ?? 'public';
}

/**
 * For a probe that needs a scratch table in taskfence's schema: a `warn` naming the configured
 * schema when it does not exist yet (`migrate` creates it), else undefined. The probe is not run
 * elsewhere instead: a scratch table in another schema would say nothing about this one.
 */
export async function schemaNotCreated(
  db: Kysely<Database>,
  id: `guarantee.${string}`,
): Promise<DoctorCheck | undefined> {
  const schema = await taskfenceSchema(db);
  const exists = await scalar(
    db,
    sql<{ v: boolean }>`select exists (select 1 from pg_namespace where nspname = ${schema}) as v`,
  );
  return exists
    ? undefined
    : check(id, 'warn', `not probed: the schema ${schema} does not exist yet (migrate creates it)`);
}
