import { sql, type CompiledQuery, type Kysely } from 'kysely';
import type { ColumnTypes } from '../dialects/types.js';
import { MigrationFailedError, TaskfenceError, formatVersion } from '../errors.js';
import type { ConcurrentStep, MigrationDefinition } from '../migrations/types.js';
import { tableIn } from '../query/schema.js';
import type { Chain } from './chain.js';
import type { ChainRun } from './run.js';

/**
 * Beside the history, one row per concurrent step done (`MigrationDefinition.concurrent`): the
 * version, the step's position in its list, what it did, and when. A step whose row is missing
 * runs on the next `migrate` (each is idempotent, so one that finished just before a crash finds
 * its work done and is recorded).
 */
export const STEPS_TABLE = 'taskfence_migration_steps';

/** Creates the steps table if it is missing. */
export async function createStepsTable(db: Kysely<any>, types: ColumnTypes): Promise<void> {
  await db.schema
    .createTable(STEPS_TABLE)
    .ifNotExists()
    .addColumn('version', 'integer', (c) => c.notNull())
    .addColumn('step', 'integer', (c) => c.notNull())
    .addColumn('description', 'text', (c) => c.notNull())
    .addColumn('done_at', types.epochMs, (c) => c.notNull())
    .addPrimaryKeyConstraint(`${STEPS_TABLE}_pkey`, ['version', 'step'])
    .execute();
}

/** The steps done, by version (empty when the table does not exist yet). */
export async function readDoneSteps(db: Kysely<any>): Promise<Map<number, Set<number>>> {
  const done = new Map<number, Set<number>>();
  const tables = await db.introspection.getTables();
  if (!tables.some((t) => t.name === STEPS_TABLE)) return done;
  const { rows } = await sql<{
    version: number | string;
    step: number | string;
  }>`select version, step from ${tableIn(db, STEPS_TABLE)}`.execute(db);
  for (const r of rows) {
    const set = done.get(Number(r.version)) ?? new Set<number>();
    set.add(Number(r.step));
    done.set(Number(r.version), set);
  }
  return done;
}

/** Forgets a version's steps when it is reverted (in its down transaction); nothing if the table is missing. */
export async function deleteSteps(trx: Kysely<any>, version: number): Promise<void> {
  const tables = await trx.introspection.getTables();
  if (!tables.some((t) => t.name === STEPS_TABLE)) return;
  await trx.deleteFrom(STEPS_TABLE).where('version', '=', version).execute();
}

/**
 * The one statement a step runs on a dialect (`types`), compiled on `db` (so with the store's
 * schema): `CREATE INDEX CONCURRENTLY` or `VALIDATE CONSTRAINT` on PostgreSQL, the plain
 * `CREATE INDEX` on SQLite; null when the step has nothing to do there (a validation on SQLite).
 * The checksum, `plan` and the lint read the same statements.
 */
export function stepStatement(step: ConcurrentStep, types: ColumnTypes, db: Kysely<any>): CompiledQuery | null {
  if (step.kind === 'validate-constraint') {
    if (!types.concurrentDdl) return null;
    return sql`alter table ${tableIn(db, step.table)} validate constraint ${sql.id(step.constraint)}`.compile(db);
  }
  const plain = step.build(db).compile();
  if (!types.concurrentDdl) return plain;
  const concurrent = plain.sql.replace(/^create (unique )?index /i, (_, unique: string | undefined) =>
    unique ? 'create unique index concurrently ' : 'create index concurrently ',
  );
  if (concurrent === plain.sql) throw new Error(`step ${step.index}: not a CREATE INDEX: ${plain.sql}`);
  return { ...plain, sql: concurrent };
}

/** What a step does, for the steps table and progress. */
export function describeStep(step: ConcurrentStep): string {
  return step.kind === 'create-index'
    ? `index ${step.index} on ${step.table}`
    : `validate ${step.constraint} on ${step.table}`;
}

/**
 * Runs `m`'s concurrent steps that are not recorded as done, in order, each through
 * `StoreDialect.withMigrationSession` (outside any transaction on PostgreSQL, holding the
 * migration lock as a session lock; one short `BEGIN IMMEDIATE` on SQLite), and records each
 * when it is done. Under the lock it re-reads the record (another migrator may have done it) and
 * then looks at the database itself:
 * - an index that exists and is valid is not built again; an INVALID one (a killed or failed
 *   `CREATE INDEX CONCURRENTLY`) is dropped concurrently and built again; a build that fails
 *   drops what it left INVALID before the error surfaces;
 * - a constraint that is validated already is not validated again.
 * A crash anywhere loses at most the step in flight, which the next `migrate` runs again.
 */
export async function runConcurrentSteps(chain: Chain, m: MigrationDefinition, run: ChainRun): Promise<void> {
  const steps = m.concurrent ?? [];
  if (steps.length === 0) return;
  const { dialect } = chain;
  const recorded = (await readDoneSteps(dialect.db)).get(m.version) ?? new Set<number>();
  for (const [position, step] of steps.entries()) {
    if (recorded.has(position)) continue;
    const started = Date.now();
    let rebuilt = false;
    let outcome: 'done' | 'found' | 'recorded';
    try {
      outcome = await dialect.withMigrationSession(
        async (db): Promise<'done' | 'found' | 'recorded'> => {
          let outcome: 'done' | 'found' = 'done';
          await createStepsTable(db, dialect.columnTypes);
          const again = await sql<{ step: number }>`
            select step from ${tableIn(db, STEPS_TABLE)} where version = ${m.version} and step = ${position}`.execute(
            db,
          );
          if (again.rows.length > 0) return 'recorded';
          const statement = stepStatement(step, dialect.columnTypes, db);
          if (step.kind === 'create-index') {
            const state = await dialect.indexState(db, step.index);
            if (state === 'valid') outcome = 'found';
            else {
              if (state === 'invalid') {
                rebuilt = true;
                await dropInvalidIndex(db, step.index);
              }
              try {
                await db.executeQuery(statement!);
              } catch (error) {
                // A failed concurrent build (a duplicate for a unique index, a cancel) leaves the
                // index INVALID, updated by every write yet never read: do not leave it there.
                if ((await dialect.indexState(db, step.index).catch(() => null)) === 'invalid')
                  await dropInvalidIndex(db, step.index).catch(() => {});
                throw error;
              }
            }
          } else if (statement !== null) {
            const validated = await dialect.constraintValidated(db, step.table, step.constraint);
            if (validated === null) throw new Error(`constraint ${step.constraint} on ${step.table} does not exist`);
            if (validated) outcome = 'found';
            else await db.executeQuery(statement);
          }
          await sql`
            insert into ${tableIn(db, STEPS_TABLE)} (version, step, description, done_at)
            values (${m.version}, ${position}, ${describeStep(step)}, ${Date.now()})`.execute(db);
          return outcome;
        },
        { waitMs: run.lock.waitMs, onWaiting: run.lock.onWaiting },
      );
    } catch (error) {
      if (error instanceof TaskfenceError) throw error;
      throw new MigrationFailedError(m.version, m.name, 'up', error);
    }
    if (outcome === 'recorded') continue;
    run.emit({
      type: 'progress',
      version: m.version,
      message:
        outcome === 'found'
          ? `${formatVersion(m.version)}: ${describeStep(step)}: already there`
          : `${formatVersion(m.version)}: ${describeStep(step)}: done concurrently in ${Date.now() - started} ms` +
            (rebuilt ? ' (an INVALID index left by an interrupted build was dropped first)' : ''),
    });
  }
}

async function dropInvalidIndex(db: Kysely<any>, index: string): Promise<void> {
  await sql`drop index concurrently if exists ${tableIn(db, index)}`.execute(db);
}

/** Versions applied whose concurrent steps are not all recorded, with how many are done. */
export function pendingSteps(
  migrations: readonly MigrationDefinition[],
  applied: ReadonlySet<number>,
  withState: ReadonlySet<number>,
  done: ReadonlyMap<number, ReadonlySet<number>>,
): { version: number; name: string; done: number; total: number }[] {
  return migrations
    .filter((m) => (m.concurrent?.length ?? 0) > 0 && applied.has(m.version) && withState.has(m.version))
    .map((m) => ({
      version: m.version,
      name: m.name,
      done: done.get(m.version)?.size ?? 0,
      total: m.concurrent!.length,
    }))
    .filter((p) => p.done < p.total);
}
