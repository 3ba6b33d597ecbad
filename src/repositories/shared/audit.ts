/**
 * The audit trail's one writer (migration 0080). Every caller passes the transaction of the act it
 * records, so the row commits with the act or not at all; nothing here opens a transaction.
 */
import { sql, type Kysely } from 'kysely';
import { prepared } from '../../query/prepared.js';
import { tableIn } from '../../query/schema.js';
import type { Database } from '../../schema/database.js';

/** One recorded act. */
export interface AuditEvent {
  readonly id: string;
  readonly at: number;
  readonly actor: string;
  readonly action: string;
  readonly subjectKind: string;
  readonly subjectId: string;
  readonly token: number | null;
  readonly generation: number | null;
  /** Parsed JSON, or null. */
  readonly detail: unknown;
}

export type NewAuditEvent = Omit<AuditEvent, 'token' | 'generation' | 'detail'> &
  Partial<Pick<AuditEvent, 'token' | 'generation' | 'detail'>>;

const INSERT_AUDIT_EVENT = prepared(
  (
    db,
    p: {
      id: string;
      at: number;
      actor: string;
      action: string;
      subjectKind: string;
      subjectId: string;
      token: number | null;
      generation: number | null;
      detail: string | null;
    },
  ) => sql`
    insert into ${tableIn(db, 'audit_events')} (id, at, actor, action, subject_kind, subject_id, token, generation, detail)
    values (${p.id}, ${p.at}, ${p.actor}, ${p.action}, ${p.subjectKind}, ${p.subjectId}, ${p.token}, ${p.generation}, ${p.detail})`,
);

/** Appends `event` in `trx`, the transaction of the act it records. */
export async function recordAuditEvent(trx: Kysely<Database>, event: NewAuditEvent): Promise<void> {
  await INSERT_AUDIT_EVENT.execute(trx, {
    id: event.id,
    at: event.at,
    actor: event.actor,
    action: event.action,
    subjectKind: event.subjectKind,
    subjectId: event.subjectId,
    token: event.token ?? null,
    generation: event.generation ?? null,
    detail: event.detail === undefined || event.detail === null ? null : JSON.stringify(event.detail),
  });
}
