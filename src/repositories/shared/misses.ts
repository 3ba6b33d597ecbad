/**
 * Explaining a miss: telling the caller why a write did not happen. Every guarded write is one
 * statement whose WHERE states its preconditions, so "no row back" (or a constraint violation)
 * says only that something did not hold; the typed error says what. There are two ways to find
 * out, and each has its one use (ARCHITECTURE.md, "Explaining a miss"):
 *
 * 1. **Holding the keys** (the default). A compare-and-set matched no row: the same transaction,
 *    still holding the keys it took before the write, reads why and throws the typed error (or
 *    returns the answer of a repeat that converged, such as a second release). Nobody can change
 *    the rows in between, so the explanation is exact; the rollback loses nothing, because
 *    nothing was written; and a keyed call stores the refusal with its key, so a retry replays
 *    it. The explanation is plain code in the transaction, named for its area
 *    (`explainTransferMiss`, `explainMisses`, `lostGrantReason`, …): it reads on the `trx` it is
 *    given, never on the store's `db`.
 * 2. **After the rollback, on a fresh read** (`explainAfterRollback`). The database refused the
 *    statement itself with a constraint violation (a unique index another writer won, a foreign
 *    key to a row that does not exist). On PostgreSQL that aborts the transaction, which can read
 *    nothing more, so the explanation reads the store as it is now, after the rollback. The state
 *    may have moved on meanwhile (the winner may already be gone): the explanation must allow for
 *    it, and a keyed call does not store the refusal (a retry meets the constraint again).
 *
 * Use the second only for a constraint the database enforces and the transaction did not check
 * first (deliberately: the index decides, and the happy path pays nothing); anything a
 * transaction can check under its keys is explained the first way.
 */
import type { Kysely } from 'kysely';
import type { ErrorKind, StoreDialect } from '../../dialects/types.js';
import type { Database } from '../../schema/database.js';

/** The constraint violations whose miss is explained after the rollback (see `explainAfterRollback`). */
export type ConstraintRefusal = Extract<ErrorKind, 'unique_violation' | 'foreign_key_violation'>;

/**
 * Runs `write` (a whole write transaction, or a call in `tx.*`), and explains the miss the second
 * way: when the database refused it with `refusal`, the transaction is over (rolled back; in
 * `tx.*`, its savepoint), and `explain` reads why on a fresh read of `dialect.db`. `explain`
 * throws the typed error, or returns the call's answer (the caller's own row, committed by a
 * concurrent retry), or rethrows `error` when nothing explains it. Any other failure of `write`
 * propagates unchanged.
 *
 * @example
 * return explainAfterRollback(dialect, 'unique_violation', () => insertDispatch(…), async (db) => {
 *   const active = await newestActiveFor(db, terminalHandle);
 *   throw new TerminalBusyError(terminalHandle, active?.id ?? null);
 * });
 */
export async function explainAfterRollback<T>(
  dialect: Pick<StoreDialect, 'db' | 'classifyError'>,
  refusal: ConstraintRefusal,
  write: () => Promise<T>,
  explain: (db: Kysely<Database>, error: unknown) => Promise<T>,
): Promise<T> {
  try {
    return await write();
  } catch (error) {
    if (dialect.classifyError(error) !== refusal) throw error;
    return explain(dialect.db, error);
  }
}
