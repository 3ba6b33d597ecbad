/**
 * The audit trail's one writer (migration 0080). Every caller passes the transaction of the act it
 * records, so the row commits with the act or not at all; nothing here opens a transaction.
 */
import { sql, type Kysely } from 'kysely';
import { prepared } from '../../query/prepared.js';
import { tableIn } from '../../query/schema.js';
import type { Database } from '../../schema/database.js';
import type { StoreContext } from '../context.js';
import type { LeaseKind } from './lease.js';

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

/**
 * Which lease acts the trail records (`openStore({ audit: { leases } })`):
 * - `grants`: every grant (a claim, an acquisition, a dispatch, an ownership transfer) and every
 *   loss (a lapsed lease someone else was granted over);
 * - `all`: those, and every renewal and release;
 * - `off` (the default): none. Operator actions are recorded whatever the mode.
 */
export type LeaseAuditMode = 'grants' | 'all' | 'off';
export const LEASE_AUDIT_MODES: readonly LeaseAuditMode[] = Object.freeze(['grants', 'all', 'off']);

/**
 * What happened to a lease. `lost` is recorded by the grant that took a lapsed lease over (the
 * loss is a fact only once someone else holds the resource): its `holder` and `token` are the
 * previous grant's, and `detail.by` names the new one. A renewal or release the fence refuses
 * rolls back, and records nothing.
 */
export type LeaseAct = 'granted' | 'renewed' | 'released' | 'lost';

/** One lease act, as the repository that made it describes it. */
export interface LeaseActRecord {
  readonly act: LeaseAct;
  /** A lease kind, or `ownership` for a transfer (`act` `granted`, with `generation`). */
  readonly kind: LeaseKind | 'environment_ownership' | 'group_ownership';
  readonly resource: string;
  readonly holder: string;
  readonly token: number | null;
  readonly generation?: number | null;
  /** Anything else worth keeping: `expiresAt`, the run, the keys, who took a lost lease over. */
  readonly detail?: Record<string, unknown>;
}

/** Whether `mode` records `act`. */
export function recordsLeaseAct(mode: LeaseAuditMode, act: LeaseAct): boolean {
  return mode === 'all' || (mode === 'grants' && (act === 'granted' || act === 'lost'));
}

/**
 * Appends the acts `mode` records, in `trx`, the transaction of the acts: one statement, or none
 * when the mode records none of them. Rows are `actor` = the holder, `action` = `lease.<act>`,
 * `subject_kind` = the lease kind, `subject_id` = the resource, with the token.
 */
export async function recordLeaseActs(
  trx: Kysely<Database>,
  mode: LeaseAuditMode,
  at: number,
  newId: () => string,
  acts: readonly LeaseActRecord[],
): Promise<void> {
  if (mode === 'off') return;
  const rows = acts.filter((a) => recordsLeaseAct(mode, a.act));
  if (rows.length === 0) return;
  const toEvent = (a: LeaseActRecord): NewAuditEvent => ({
    id: newId(),
    at,
    actor: a.holder,
    action: a.kind.endsWith('_ownership') ? 'ownership.transferred' : `lease.${a.act}`,
    subjectKind: a.kind,
    subjectId: a.resource,
    token: a.token,
    generation: a.generation ?? null,
    detail: a.detail ?? null,
  });
  if (rows.length === 1) {
    await recordAuditEvent(trx, toEvent(rows[0]!));
    return;
  }
  await trx
    .insertInto('audit_events')
    .values(
      rows.map(toEvent).map((e) => ({
        id: e.id,
        at: e.at,
        actor: e.actor,
        action: e.action,
        subject_kind: e.subjectKind,
        subject_id: e.subjectId,
        token: e.token ?? null,
        generation: e.generation ?? null,
        detail: e.detail === undefined || e.detail === null ? null : JSON.stringify(e.detail),
      })),
    )
    .execute();
}

/** `recordLeaseActs` with the store's mode, clock reading and ids: what the repositories call. */
export function auditLeaseActs(
  ctx: StoreContext,
  trx: Kysely<Database>,
  at: number,
  acts: readonly LeaseActRecord[],
): Promise<void> {
  return recordLeaseActs(trx, ctx.settings.auditLeases, at, () => ctx.newId(), acts);
}

/** Whether the store records `act` (to skip reading what only the trail needs). */
export function auditsLeaseAct(ctx: StoreContext, act: LeaseAct): boolean {
  return recordsLeaseAct(ctx.settings.auditLeases, act);
}

/**
 * The trail's rows of a claim that granted `token`: the grant, and the loss of the previous grant
 * when it lapsed unreleased (`before`, the row read before the claim; only a grant one token
 * higher took it over, so a row another claim moved on in between names no loss).
 */
export function grantedActs(
  kind: 'workspace_lock' | 'task_lease',
  resource: string,
  holder: string,
  token: number,
  detail: Record<string, unknown>,
  before:
    | { readonly holder: string | null; readonly token: number | string; readonly expires_at: number | string | null }
    | undefined,
): LeaseActRecord[] {
  const acts: LeaseActRecord[] = [{ act: 'granted', kind, resource, holder, token, detail }];
  if (before?.holder != null && Number(before.token) + 1 === token)
    acts.push({
      act: 'lost',
      kind,
      resource,
      holder: before.holder,
      token: Number(before.token),
      detail: { reason: 'superseded', expiresAt: Number(before.expires_at), by: { holder, token } },
    });
  return acts;
}
