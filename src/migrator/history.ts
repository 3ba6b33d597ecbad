import { sql, type Kysely } from 'kysely';
import type { MigrationParams, UmzugStorage } from 'umzug';
import { MigrationHistoryDamagedError, formatVersion } from '../errors.js';
import type { ColumnTypes, StoreDialect } from '../dialects/types.js';
import { schemaOf } from '../query/schema.js';
import type { Database } from '../schema/database.js';
import type { MigrationDefinition } from '../migrations/types.js';
import type { AppliedMigration } from './types.js';

/** The migration history: one row per applied migration, written in that migration's own transaction. */
export const HISTORY_TABLE = 'taskfence_migrations';
const HISTORY_COLUMNS = ['version', 'name', 'checksum', 'applied_at', 'duration_ms'] as const;

/** The name umzug knows a migration by: `0052_requires_filesystem`. */
export function migrationName(m: Pick<MigrationDefinition, 'version' | 'name'>): string {
  return `${formatVersion(m.version)}_${m.name}`;
}

/** The history rows in version order (none when the table does not exist yet); throws `MigrationHistoryDamagedError` on a damaged table or row. */
export async function readHistory(db: Kysely<Database>): Promise<AppliedMigration[]> {
  const tables = await db.introspection.getTables();
  const table = tables.find((t) => t.name === HISTORY_TABLE);
  if (!table) return [];
  const columns = new Set(table.columns.map((c) => c.name));
  const missing = HISTORY_COLUMNS.filter((c) => !columns.has(c));
  if (missing.length > 0) {
    throw new MigrationHistoryDamagedError(
      `column${missing.length > 1 ? 's' : ''} ${missing.join(', ')} ${missing.length > 1 ? 'are' : 'is'} missing (it has ${[...columns].join(', ')})`,
    );
  }
  const rows = await db.selectFrom(HISTORY_TABLE).selectAll().orderBy('version').execute();
  return rows.map((r) => {
    const version = Number(r.version);
    const bad =
      !Number.isInteger(version) || version <= 0
        ? 'version'
        : typeof r.name !== 'string' || r.name === ''
          ? 'name'
          : typeof r.checksum !== 'string' || r.checksum === ''
            ? 'checksum'
            : r.applied_at === null || !Number.isFinite(Number(r.applied_at))
              ? 'applied_at'
              : undefined;
    if (bad) {
      throw new MigrationHistoryDamagedError(
        `the row for version ${String(r.version)} has ${r[bad as keyof typeof r] === null ? 'a NULL' : 'an invalid'} ${bad}`,
      );
    }
    return {
      version,
      name: r.name,
      checksum: r.checksum,
      appliedAt: Number(r.applied_at),
      durationMs: Number(r.duration_ms),
    };
  });
}

/** Creates the history table if it is missing (inside the migration's transaction, under the migration lock). */
export async function createHistoryTable(trx: Kysely<Database>, types: ColumnTypes): Promise<void> {
  await trx.schema
    .createTable(HISTORY_TABLE)
    .ifNotExists()
    .addColumn('version', 'integer', (c) => c.primaryKey())
    .addColumn('name', 'text', (c) => c.notNull())
    .addColumn('checksum', 'text', (c) => c.notNull())
    .addColumn('applied_at', types.epochMs, (c) => c.notNull())
    .addColumn('duration_ms', 'integer', (c) => c.notNull())
    .execute();
}

/**
 * Creates the configured PostgreSQL schema if it is missing, so `migrate` (the CLI's too) can
 * write into it; nothing without one. Several deploys may race to do it.
 */
export async function ensureConfiguredSchema(dialect: StoreDialect): Promise<void> {
  const schema = schemaOf(dialect.db);
  if (dialect.kind !== 'postgres' || schema === undefined) return;
  const { rows } = await sql<{
    found: boolean;
  }>`select exists (select 1 from pg_namespace where nspname = ${schema}) as found`.execute(dialect.db);
  if (rows[0]?.found) return;
  try {
    await sql`create schema if not exists ${sql.id(schema)}`.execute(dialect.db);
  } catch (error) {
    // 23505/42P06: a concurrent deploy created it between the check and the create.
    const code = (error as { code?: unknown }).code;
    if (code !== '23505' && code !== '42P06') throw error;
  }
}

/** What one migration's transaction did: applied (or reverted) it, or found another migrator had. */
export interface UnitOutcome {
  readonly direction: 'up' | 'down';
  readonly done: boolean;
  readonly durationMs: number;
}

/**
 * umzug's storage, backed by taskfence's history table: `executed` starts as the history read
 * under the migration lock at the start of the run (so umzug decides what is pending, in which
 * order and up to which target from one consistent read, which another deploy committing
 * meanwhile cannot shift under it), and follows what this run settles.
 *
 * The row itself is written (or deleted) by the migration's own transaction, under the migration
 * lock, together with the migration: writing it here, in a second transaction after umzug's
 * `up` returned, would let a crash between the two leave a migration applied but unrecorded. So
 * `logMigration` / `unlogMigration` take the row the migration's transaction settled (written by
 * this run, or found written by another migrator) into the run's view, and refuse a name this run
 * did not migrate.
 */
export class HistoryStorage implements UmzugStorage<object> {
  readonly #executed: Set<string>;

  constructor(
    history: readonly Pick<AppliedMigration, 'version' | 'name'>[],
    private readonly outcomes: ReadonlyMap<string, UnitOutcome>,
  ) {
    this.#executed = new Set(history.map(migrationName));
  }

  async executed(): Promise<string[]> {
    return [...this.#executed];
  }

  async logMigration({ name }: MigrationParams<object>): Promise<void> {
    this.#confirm(name, 'up');
    this.#executed.add(name);
  }

  async unlogMigration({ name }: MigrationParams<object>): Promise<void> {
    this.#confirm(name, 'down');
    this.#executed.delete(name);
  }

  #confirm(name: string, direction: 'up' | 'down'): void {
    if (this.outcomes.get(name)?.direction !== direction) {
      throw new Error(
        `umzug asked to ${direction === 'up' ? 'log' : 'unlog'} ${name}, which this run did not ${direction === 'up' ? 'apply' : 'revert'} in its own transaction`,
      );
    }
  }
}
