/**
 * The dashboard's operator actions. Each is one `store.transaction`: the same fenced repository
 * call any caller makes (`tx.locks.releaseWorkspaceLock` with the token the operator saw,
 * `tx.runs.stopCoordinatorRun`, `tx.messages.requeueDeadMessages`), and its audit row, committed together or not at all. A token
 * that moved on since the page showed it (a new claim) is refused by the repository's fence with
 * its typed error, and nothing is recorded.
 */
import { randomUUID } from 'node:crypto';
import { InvalidArgumentError, NotFoundError } from '../errors.js';
import { recordAuditEvent } from '../repositories/shared/audit.js';
import { requireCounter, requireId } from '../repositories/validate.js';
import type { Store } from '../store.js';

/** Who performed an action, as the audit trail records it. */
export interface ActionOrigin {
  /** The dashboard's remote address (loopback by default). */
  readonly remoteAddress: string;
}

/** What an action did, as the dashboard reports it. */
export interface ActionResult {
  readonly action: OperatorActionName;
  readonly auditId: string;
}

/** Every operator action the dashboard and `runOperatorAction` offer; each is audited. */
export const OPERATOR_ACTIONS = [
  'release-workspace-lock',
  'release-task-lease',
  'fail-run',
  'requeue-message',
] as const;
export type OperatorActionName = (typeof OPERATOR_ACTIONS)[number];

function field(body: unknown, name: string): unknown {
  return body !== null && typeof body === 'object' ? (body as Record<string, unknown>)[name] : undefined;
}

/**
 * Runs operator action `name` with the JSON `body` the page sent; validation before any statement
 * (`InvalidArgumentError`), then one transaction with its audit row (`actor` `operator`).
 *
 * @example
 * await runOperatorAction(store, 'release-workspace-lock', { workspaceId: 'ws1', token: 7 }, { remoteAddress: '127.0.0.1' });
 */
export async function runOperatorAction(
  store: Store,
  name: string,
  body: unknown,
  origin: ActionOrigin,
): Promise<ActionResult> {
  const detail = { via: 'taskfence ui', remoteAddress: origin.remoteAddress };
  const auditId = randomUUID();
  const at = () => store.dialect.clock.now();
  switch (name) {
    case 'release-workspace-lock': {
      const workspaceId = requireId('workspaceId', field(body, 'workspaceId'));
      const token = requireCounter('token', field(body, 'token'), 'token the page showed');
      await store.transaction(async (tx) => {
        const held = await tx.locks.getWorkspaceLock(workspaceId);
        await tx.locks.releaseWorkspaceLock(workspaceId, { token });
        await recordAuditEvent(tx.db, {
          id: auditId,
          at: at(),
          actor: 'operator',
          action: 'operator.release-workspace-lock',
          subjectKind: 'workspace_lock',
          subjectId: workspaceId,
          token,
          detail: { ...detail, holder: held?.holder ?? null, runId: held?.runId ?? null },
        });
      });
      return { action: name, auditId };
    }
    case 'release-task-lease': {
      const taskId = requireId('taskId', field(body, 'taskId'));
      const token = requireCounter('token', field(body, 'token'), 'token the page showed');
      await store.transaction(async (tx) => {
        const held = await tx.locks.getTaskLease(taskId);
        await tx.locks.releaseTaskLease(taskId, { token });
        await recordAuditEvent(tx.db, {
          id: auditId,
          at: at(),
          actor: 'operator',
          action: 'operator.release-task-lease',
          subjectKind: 'task_lease',
          subjectId: taskId,
          token,
          detail: { ...detail, holder: held?.holder ?? null },
        });
      });
      return { action: name, auditId };
    }
    case 'fail-run': {
      const runId = requireId('runId', field(body, 'runId'));
      await store.transaction(async (tx) => {
        const before = await tx.runs.getCoordinatorRun(runId);
        const run = await tx.runs.stopCoordinatorRun(runId, 'failed');
        await recordAuditEvent(tx.db, {
          id: auditId,
          at: at(),
          actor: 'operator',
          action: 'operator.fail-run',
          subjectKind: 'coordinator_run',
          subjectId: runId,
          detail: {
            ...detail,
            targetKey: run.targetKey,
            lastHeartbeatAt: before?.heartbeatAt ?? null,
            coordinatorHandle: run.coordinatorHandle,
          },
        });
      });
      return { action: name, auditId };
    }
    case 'requeue-message': {
      const handle = requireId('handle', field(body, 'handle'));
      const messageId = requireId('messageId', field(body, 'messageId'));
      await store.transaction(async (tx) => {
        const [requeued] = await tx.messages.requeueDeadMessages(handle, [messageId]);
        // Not dead (requeued already, or acked) or not in this inbox: nothing changed, nothing recorded.
        if (requeued === undefined)
          throw new NotFoundError(`dead message in inbox ${JSON.stringify(handle)}`, messageId);
        await recordAuditEvent(tx.db, {
          id: auditId,
          at: at(),
          actor: 'operator',
          action: 'operator.requeue-message',
          subjectKind: 'message',
          subjectId: messageId,
          detail: { ...detail, handle, kind: requeued.kind, lastError: requeued.lastError },
        });
      });
      return { action: name, auditId };
    }
    default:
      throw new InvalidArgumentError('action', `must be one of ${OPERATOR_ACTIONS.join(', ')}`);
  }
}
