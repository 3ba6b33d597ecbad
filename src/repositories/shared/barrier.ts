/**
 * The task cleanup barrier (SPEC §6): `task_cleanup_admissions` serializes cleanup admission with
 * detachment, with transfers to a task and with creating a resource or a subtask for it. Every
 * writer of that kind takes the barriers of the tasks it involves (`lockBarriers`) and, holding
 * them, refuses if cleanup was admitted for any of them (`refuseIfAdmitted`): once admitted, a
 * task's inventory is fixed, so nothing new may become the task's.
 */
import type { Transaction } from 'kysely';
import { TaskfenceError } from '../../errors.js';
import { elements, prepared } from '../../query/prepared.js';
import type { CleanupKind, Database } from '../../schema/database.js';
import type { StoreContext } from '../context.js';
import { barrierLockKey } from '../../protocol.js';

/** Cleanup (archive/delete) was already admitted for a task the operation involves, so it is refused. */
export class CleanupBarrierError extends TaskfenceError {
  readonly code = 'CLEANUP_BARRIER';
  constructor(
    readonly operation: 'detach' | 'transfer' | 'create',
    readonly taskId: string,
    readonly admittedTaskId: string,
    readonly admittedKind: CleanupKind,
  ) {
    super(
      `Cannot ${operation === 'detach' ? 'detach' : operation === 'transfer' ? 'transfer ownership for' : 'create a resource for'} ` +
        `task ${taskId}: ${admittedKind} cleanup was already admitted for task ${admittedTaskId}, and its inventory is fixed. ` +
        'Let that cleanup finish, or do this before admitting it.',
    );
  }
}

const FIND_ADMISSION = prepared((db, p: { ids: readonly string[] }, n: number) =>
  db
    .selectFrom('task_cleanup_admissions')
    .select(['task_id', 'kind'])
    .where('task_id', 'in', elements(p.ids, n))
    .orderBy('task_id'),
);

/** The first admitted cleanup among `taskIds` (by task id), if any; call with their barriers held. */
export async function findAdmission(trx: Transaction<Database>, taskIds: readonly string[]) {
  if (taskIds.length === 0) return undefined;
  return FIND_ADMISSION.first(trx, { ids: taskIds }, taskIds.length);
}

/**
 * Takes the cleanup barriers of `taskIds` (`barrierLockKey`), each once, in sorted order: two
 * transactions locking overlapping sets cannot deadlock on each other (see src/protocol.ts).
 */
export async function lockBarriers(
  ctx: StoreContext,
  trx: Transaction<Database>,
  taskIds: Iterable<string>,
): Promise<void> {
  for (const id of [...new Set(taskIds)].sort()) await ctx.dialect.lockKey(trx, barrierLockKey(id));
}

/**
 * The barrier check: throws `CleanupBarrierError` (naming `operation` on `taskId`) if cleanup
 * was admitted for any of `involved` (default: `taskId` alone). Call it with their barriers held
 * (`lockBarriers`), so no admission can commit between this check and the caller's write.
 */
export async function refuseIfAdmitted(
  trx: Transaction<Database>,
  operation: CleanupBarrierError['operation'],
  taskId: string,
  involved: readonly string[] = [taskId],
): Promise<void> {
  const admitted = await findAdmission(trx, involved);
  if (admitted) throw new CleanupBarrierError(operation, taskId, admitted.task_id, admitted.kind);
}
