import type { Kysely, Transaction } from 'kysely';
import { AlreadyExistsError, NotFoundError } from '../errors.js';
import type { StoreDialect } from '../dialects/types.js';
import type { Database } from '../schema/database.js';

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
 *   cannot say which one; the check runs after the rollback, so the happy path pays nothing);
 * - a lost race on its own id (two concurrent creates of one id both see no row on PostgreSQL
 *   READ COMMITTED) runs the create once more, which finds the winner's row and answers as a
 *   retry would.
 */
export async function createOnce<T>(
  dialect: StoreDialect,
  references: readonly Reference[],
  attempt: () => Promise<T>,
): Promise<T> {
  for (let round = 1; ; round++) {
    try {
      return await attempt();
    } catch (error) {
      const kind = dialect.classifyError(error);
      if (kind === 'foreign_key_violation') await requireReferences(dialect.db, references);
      if (kind !== 'unique_violation' || round >= 2) throw error;
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
