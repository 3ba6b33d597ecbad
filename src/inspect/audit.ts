/** The audit trail, read back (newest first) for `inspect`'s callers and the dashboard. */
import { requireId } from '../repositories/validate.js';
import type { AuditEvent } from '../repositories/shared/audit.js';
import { InvalidArgumentError } from '../errors.js';
import type { InspectSource } from './index.js';

export type { AuditEvent } from '../repositories/shared/audit.js';

/** Filters of `readAuditTrail`. */
export interface AuditTrailFilter {
  readonly subjectKind?: string;
  readonly subjectId?: string;
  /** At most this many events (default 100, at most 10 000). */
  readonly limit?: number;
}

/**
 * The most recent audit events (optionally of one subject), newest first. Read-only.
 *
 * @example
 * const events = await readAuditTrail(store, { subjectKind: 'workspace_lock', subjectId: 'ws1' });
 */
export async function readAuditTrail(source: InspectSource, filter: AuditTrailFilter = {}): Promise<AuditEvent[]> {
  const limit = filter.limit ?? 100;
  if (!Number.isSafeInteger(limit) || limit <= 0 || limit > 10_000)
    throw new InvalidArgumentError('limit', 'must be a whole number from 1 to 10000');
  if (filter.subjectKind !== undefined) requireId('subjectKind', filter.subjectKind);
  if (filter.subjectId !== undefined) requireId('subjectId', filter.subjectId);
  const rows = await source.dialect.db
    .selectFrom('audit_events')
    .selectAll()
    .$if(filter.subjectKind !== undefined, (qb) => qb.where('subject_kind', '=', filter.subjectKind!))
    .$if(filter.subjectId !== undefined, (qb) => qb.where('subject_id', '=', filter.subjectId!))
    .orderBy('at', 'desc')
    .orderBy('id', 'desc')
    .limit(limit)
    .execute();
  return rows.map((r) => ({
    id: r.id,
    at: Number(r.at),
    actor: r.actor,
    action: r.action,
    subjectKind: r.subject_kind,
    subjectId: r.subject_id,
    token: r.token === null ? null : Number(r.token),
    generation: r.generation === null ? null : Number(r.generation),
    detail: r.detail === null ? null : (JSON.parse(r.detail) as unknown),
  }));
}
