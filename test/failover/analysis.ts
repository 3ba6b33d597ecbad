/**
 * What the failover test concludes from the workers' records and the final primary's rows: which
 * acknowledged writes are missing, whether fencing tokens went backwards, whether two holders
 * held at once, whether a message was delivered twice, and how each switch went.
 */
import type pg from 'pg';
import type { FailedAttempt, LeaseRecord, LockRecord, WorkerReport } from './worker.js';

/** The rows of the final primary the checks compare against. */
export interface ServerState {
  /** workspace id → its lock row's token and holder. */
  readonly locks: ReadonlyMap<string, { token: number; holder: string | null }>;
  readonly runIds: ReadonlySet<string>;
  /** message id → delivered_at (null: pending). */
  readonly messages: ReadonlyMap<string, number | null>;
  /** `workspace/key/holder` of every path lease row. */
  readonly leases: ReadonlySet<string>;
}

export async function readServerState(
  client: pg.Client,
  reports: readonly WorkerReport[],
  schema = 'public',
): Promise<ServerState> {
  const t = (name: string) => `"${schema}".${name}`;
  const locks = new Map<string, { token: number; holder: string | null }>();
  for (const row of (
    await client.query<{ workspace_id: string; token: string; holder: string | null }>(
      `select workspace_id, token::text, holder from ${t('workspace_locks')}`,
    )
  ).rows) {
    locks.set(row.workspace_id, { token: Number(row.token), holder: row.holder });
  }
  const runIds = reports.flatMap((r) => r.runs.map((x) => x.id));
  const found = new Set(
    (
      await client.query<{ id: string }>(`select id from ${t('coordinator_runs')} where id = any($1)`, [runIds])
    ).rows.map((r) => r.id),
  );
  const messageIds = [
    ...new Set(reports.flatMap((r) => [...r.sent.map((m) => m.id), ...r.delivered.map((m) => m.id)])),
  ];
  const messages = new Map<string, number | null>();
  for (const row of (
    await client.query<{ id: string; delivered_at: string | null }>(
      `select id, delivered_at::text from ${t('messages')} where id = any($1)`,
      [messageIds],
    )
  ).rows) {
    messages.set(row.id, row.delivered_at === null ? null : Number(row.delivered_at));
  }
  const leases = new Set(
    (
      await client.query<{ k: string }>(
        `select workspace_id || '/' || lease_key || '/' || holder as k from ${t('path_leases')}`,
      )
    ).rows.map((r) => r.k),
  );
  return { locks, runIds: found, messages, leases };
}

export interface Failover {
  /** When the postmaster was killed (ms since epoch). */
  readonly killedAt: number;
  /** When Patroni listed the new primary. */
  readonly promotedAt: number;
  /** When the cluster had a caught-up (synchronous) standby again. */
  readonly healthyAt: number;
}

export interface SwitchFigures {
  /** Kill to Patroni listing the new primary. */
  readonly promotionMs: number;
  /** Kill to the first acknowledgement of a call sent after the kill: how long callers saw no primary. */
  readonly firstAckMs: number | null;
  /** Failed attempts from the kill to the next failover (or the end), by code. */
  readonly failedByCode: Record<string, number>;
}

export interface Findings {
  readonly ackedWrites: number;
  /** Each acknowledged write the final primary does not have. */
  readonly lost: string[];
  /** Each claim whose token was not above every token acknowledged before it was asked for. */
  readonly tokenRegressions: string[];
  /** Each pair of holders (locks or leases on one key) whose holds certainly overlapped. */
  readonly overlaps: string[];
  /** Each message id acknowledged to more than one delivery. */
  readonly doubleDeliveries: string[];
  /** Failed attempts that were not a TaskfenceError (a raw 25006 included: it must be READ_ONLY). */
  readonly untyped: FailedAttempt[];
  /** Raw 25006 failures among `untyped`: a read-only server's refusal that was not READ_ONLY; must be 0. */
  readonly rawReadOnly: number;
  readonly failedAttempts: number;
  readonly switches: SwitchFigures[];
}

/** Holds that certainly overlapped: b's grant was acknowledged inside a's hold, and asked for after a's grant returned. */
function overlapsOf(
  kind: string,
  records: readonly (LockRecord | LeaseRecord)[],
  keyOf: (r: LockRecord | LeaseRecord) => string,
  end: number,
): string[] {
  const found: string[] = [];
  const byKey = new Map<string, (LockRecord | LeaseRecord)[]>();
  for (const r of records) byKey.set(keyOf(r), [...(byKey.get(keyOf(r)) ?? []), r]);
  for (const [key, list] of byKey) {
    for (const a of list) {
      const heldUntil = a.releaseSentAt ?? end;
      for (const b of list) {
        if (a === b || a.holder === b.holder) continue;
        if (b.sentAt > a.ackAt && b.ackAt < heldUntil) {
          found.push(
            `${kind} ${key}: ${b.holder} was granted at ${b.ackAt} while ${a.holder} held it (${a.ackAt}..${heldUntil})`,
          );
        }
      }
    }
  }
  return found;
}

export function analyse(
  reports: readonly WorkerReport[],
  state: ServerState,
  failovers: readonly Failover[],
  end: number,
): Findings {
  const lost: string[] = [];
  const locks = reports.flatMap((r) => r.locks);
  const leases = reports.flatMap((r) => r.leases);
  let ackedWrites = 0;

  // Claims: the lock row's token must have reached every acknowledged token, and no token may
  // have been acknowledged to two holders (the second proves the first claim was lost).
  for (const c of locks) {
    ackedWrites += c.releaseAckAt === undefined ? 1 : 2;
    const row = state.locks.get(c.workspaceId);
    if (!row || row.token < c.token) lost.push(`claim ${c.workspaceId} token ${c.token} by ${c.holder}`);
    else if (locks.some((o) => o !== c && o.workspaceId === c.workspaceId && o.token === c.token && o.ackAt > c.ackAt))
      lost.push(`claim ${c.workspaceId} token ${c.token} by ${c.holder} (the token was granted again)`);
    if (c.releaseAckAt !== undefined && row && row.token === c.token && row.holder === c.holder)
      lost.push(`release ${c.workspaceId} token ${c.token} by ${c.holder} (still held)`);
  }
  for (const l of leases) {
    ackedWrites += l.releaseAckAt === undefined ? 1 : 2;
    if (l.releaseAckAt !== undefined && state.leases.has(`${l.workspaceId}/${l.key}/${l.holder}`))
      lost.push(`path release ${l.key} by ${l.holder} (the lease is still there)`);
  }
  for (const r of reports.flatMap((x) => x.runs)) {
    ackedWrites++;
    if (!state.runIds.has(r.id)) lost.push(`run start ${r.id}`);
  }
  for (const m of reports.flatMap((x) => x.sent)) {
    ackedWrites++;
    if (!state.messages.has(m.id)) lost.push(`message ${m.id} sent to ${m.to}`);
  }
  const deliveries = reports.flatMap((x) => x.delivered);
  const deliveredCount = new Map<string, number>();
  for (const d of deliveries) {
    ackedWrites++;
    deliveredCount.set(d.id, (deliveredCount.get(d.id) ?? 0) + 1);
    const at = state.messages.get(d.id);
    if (at === undefined || at === null) lost.push(`delivery of message ${d.id} (pending again on the new primary)`);
  }

  // Tokens: a claim must get a token above every token acknowledged before it was sent.
  const tokenRegressions: string[] = [];
  for (const c of locks) {
    const before = locks.filter((o) => o.workspaceId === c.workspaceId && o.ackAt < c.sentAt);
    const highest = Math.max(0, ...before.map((o) => o.token));
    if (c.token <= highest)
      tokenRegressions.push(
        `${c.workspaceId}: ${c.holder} got token ${c.token} after token ${highest} had been granted`,
      );
  }

  const overlaps = [
    ...overlapsOf('workspace lock', locks, (r) => r.workspaceId, end),
    ...overlapsOf('path lease', leases, (r) => `${r.workspaceId}/${(r as LeaseRecord).key}`, end),
  ];
  const doubleDeliveries = [...deliveredCount].filter(([, n]) => n > 1).map(([id]) => id);

  const failures = reports.flatMap((r) => r.failures);
  const rawReadOnly = failures.filter((f) => !f.typed && f.code.endsWith(':25006')).length;
  const untyped = failures.filter((f) => !f.typed);

  // Every acknowledged call, by when it was sent and when it returned.
  const calls = [
    ...locks,
    ...locks.flatMap((c) =>
      c.releaseSentAt === undefined || c.releaseAckAt === undefined
        ? []
        : [{ sentAt: c.releaseSentAt, ackAt: c.releaseAckAt }],
    ),
    ...leases,
    ...reports.flatMap((x) => [...x.runs, ...x.sent, ...x.delivered]),
  ];
  const switches = failovers.map((f, i): SwitchFigures => {
    const next = failovers[i + 1]?.killedAt ?? end;
    const after = calls.filter((c) => c.sentAt > f.killedAt).map((c) => c.ackAt);
    const firstAck = after.length === 0 ? undefined : Math.min(...after);
    const failedByCode: Record<string, number> = {};
    for (const x of failures)
      if (x.at >= f.killedAt && x.at < next) failedByCode[x.code] = (failedByCode[x.code] ?? 0) + 1;
    return {
      promotionMs: f.promotedAt - f.killedAt,
      firstAckMs: firstAck === undefined ? null : firstAck - f.killedAt,
      failedByCode,
    };
  });

  return {
    ackedWrites,
    lost,
    tokenRegressions,
    overlaps,
    doubleDeliveries,
    untyped,
    rawReadOnly,
    failedAttempts: failures.length,
    switches,
  };
}
