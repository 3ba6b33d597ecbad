/**
 * The fenced statements of `store.ownership`: every write to an environment or group row is one
 * conditional UPDATE whose WHERE re-checks, on the row's latest version (PostgreSQL READ
 * COMMITTED re-evaluates it under the row lock; SQLite runs it inside BEGIN IMMEDIATE), that the
 * resource is still active and owned by the expected task at the expected generation
 * (`ownedAt`), plus a condition on its cleanup claim. No row back = the fence refused.
 */
import { sql, type Kysely, type RawBuilder, type Transaction } from 'kysely';
import { tableIn } from '../../query/schema.js';
import { prepared } from '../../query/prepared.js';
import type { Database } from '../../schema/database.js';
import type { OwnedResourceKind } from './errors.js';
import type { ResourceCleanupClaim } from './types.js';

type Trx = Transaction<Database>;

/** Each kind's table and owner column. */
export const RESOURCE_TABLE = {
  environment: { table: 'task_environments', owner: 'task_id' },
  group: { table: 'workspace_groups', owner: 'steward_task_id' },
} as const satisfies Record<OwnedResourceKind, { table: keyof Database; owner: string }>;

/** A fence's expectation: the resource, and the owner and generation it must still have. */
export interface OwnedAt {
  readonly id: string;
  readonly owner: string;
  readonly generation: number;
}

/**
 * The one fence fragment: the row is `id`, still `active`, owned by `owner` at `generation`,
 * and its cleanup claim satisfies `claim`.
 */
function ownedAt(kind: OwnedResourceKind, p: OwnedAt, claim: RawBuilder<unknown>) {
  return sql`id = ${p.id} and ${sql.ref(RESOURCE_TABLE[kind].owner)} = ${p.owner}
       and ownership_generation = ${p.generation} and status = 'active'
       and ${claim}`;
}

/** No active claim: none, or an expired one. */
const claimFree = (now: number) => sql`(cleanup_claimed_by is null or cleanup_claim_expires_at <= ${now})`;
/** Held by `claimant`. */
const claimHeldBy = (claimant: string) => sql`cleanup_claimed_by = ${claimant}`;

export interface TransferParams {
  readonly id: string;
  readonly expectedOwner: string;
  readonly expectedGeneration: number;
  readonly newOwner: string;
  readonly now: number;
}

/**
 * Owner transfer as one compare-and-swap (both dialects): of concurrent transfers with one
 * expectation exactly one matches. Success bumps the generation and clears an expired claim.
 * `guards` adds conditions to the WHERE. Returns the new generation, or no row.
 */
function transferSql(db: Kysely<Database>, kind: OwnedResourceKind, p: TransferParams, guards = sql``) {
  const { table, owner } = RESOURCE_TABLE[kind];
  const fence = ownedAt(kind, { id: p.id, owner: p.expectedOwner, generation: p.expectedGeneration }, claimFree(p.now));
  return sql<{ generation: number }>`
    update ${tableIn(db, table)}
       set ${sql.ref(owner)} = ${p.newOwner}, ownership_generation = ownership_generation + 1,
           cleanup_claimed_by = null, cleanup_claim_generation = null, cleanup_claim_expires_at = null,
           updated_at = ${p.now}
     where ${fence}${guards}
    returning ownership_generation as generation`;
}

/** The bare transfer CAS (detachment moves a group and its environments with it). */
export const CAS_TRANSFER = prepared((db, p: TransferParams, kind: OwnedResourceKind) => transferSql(db, kind, p));

/**
 * `transferEnvironmentOwnership` / `transferGroupStewardship` in one statement when they succeed:
 * the CAS plus every precondition the transfer checks (not a no-op, the new owner exists and has
 * no cleanup admission, and, for a group, belongs to no other active group). When it matches
 * nothing, the transfer re-checks each condition in order to throw the documented error.
 */
export const GUARDED_TRANSFER = prepared((db, p: TransferParams, kind: OwnedResourceKind) =>
  transferSql(
    db,
    kind,
    p,
    sql`
       and ${sql.ref(RESOURCE_TABLE[kind].owner)} <> ${p.newOwner}
       and exists (select 1 from ${tableIn(db, 'tasks')} t where t.id = ${p.newOwner})
       and not exists (select 1 from ${tableIn(db, 'task_cleanup_admissions')} a where a.task_id = ${p.newOwner})${
         kind === 'group'
           ? sql`
       and coalesce((select min(g.id) from ${tableIn(db, 'workspace_group_members')} m join ${tableIn(db, 'workspace_groups')} g on g.id = m.group_id
                      where m.task_id = ${p.newOwner} and g.status = 'active'), ${p.id}) = ${p.id}`
           : sql``
       }`,
  ),
);

/** One fenced UPDATE of a resource row: `set` where `ownedAt(p)` and `claim` hold. True if it matched. */
async function updateOwned(
  trx: Trx,
  kind: OwnedResourceKind,
  p: OwnedAt,
  set: RawBuilder<unknown>,
  claim: RawBuilder<unknown>,
): Promise<boolean> {
  const { rows } = await sql<{ id: string }>`
    update ${tableIn(trx, RESOURCE_TABLE[kind].table)} set ${set}
     where ${ownedAt(kind, p, claim)}
    returning id`.execute(trx);
  return rows.length === 1;
}

/**
 * The cleanup claim: fenced on (owner, generation); blocks transfers until completed, failed,
 * released or expired. The same claimant may re-claim (a retried call). True if it matched.
 */
export function claimResource(
  trx: Trx,
  kind: OwnedResourceKind,
  p: OwnedAt & { readonly claimant: string; readonly expiresAt: number; readonly now: number },
): Promise<boolean> {
  const set = sql`cleanup_claimed_by = ${p.claimant}, cleanup_claim_generation = ownership_generation,
           cleanup_claim_expires_at = ${p.expiresAt}, updated_at = ${p.now}`;
  const claim = sql`(cleanup_claimed_by is null or cleanup_claim_expires_at <= ${p.now} or cleanup_claimed_by = ${p.claimant})`;
  return updateOwned(trx, kind, p, set, claim);
}

/** Extends the claimant's claim to `expiresAt`, fenced on (owner, generation, claimant). True if it matched. */
export function renewResourceClaim(
  trx: Trx,
  kind: OwnedResourceKind,
  p: OwnedAt & { readonly claimant: string; readonly expiresAt: number; readonly now: number },
): Promise<boolean> {
  const set = sql`cleanup_claim_expires_at = ${p.expiresAt}, updated_at = ${p.now}`;
  return updateOwned(trx, kind, p, set, claimHeldBy(p.claimant));
}

/**
 * Ends the claimant's claim on the resource, fenced on (owner, generation, claimant, claimed
 * generation); with `remove` the resource becomes `removed`. True if it matched.
 */
export function endResourceClaim(
  trx: Trx,
  kind: OwnedResourceKind,
  p: OwnedAt & { readonly claimant: string; readonly now: number; readonly remove: boolean },
): Promise<boolean> {
  const status = p.remove ? sql`'removed'` : sql`status`;
  const set = sql`status = ${status}, cleanup_claimed_by = null, cleanup_claim_generation = null,
           cleanup_claim_expires_at = null, updated_at = ${p.now}`;
  return updateOwned(trx, kind, p, set, sql`${claimHeldBy(p.claimant)} and cleanup_claim_generation = ${p.generation}`);
}

/** A resource row as the fences see it. */
export interface ResourceState {
  readonly id: string;
  readonly owner: string;
  readonly generation: number;
  readonly status: 'active' | 'removed';
  readonly claimedBy: string | null;
  readonly claimGeneration: number | null;
  readonly claimExpiresAt: number | null;
  readonly rootPath: string | null;
}

interface RawResource {
  id: string;
  owner: string;
  generation: number;
  status: 'active' | 'removed';
  claimed_by: string | null;
  claim_generation: number | null;
  claim_expires_at: number | null;
  root_path: string | null;
}

const READ_RESOURCE = prepared((db, p: { id: string }, kind: OwnedResourceKind) => {
  const { table, owner } = RESOURCE_TABLE[kind];
  const rootPath = kind === 'environment' ? sql`root_path` : sql`null`;
  return sql<RawResource>`
    select id, ${sql.ref(owner)} as owner, ownership_generation as generation, status,
           cleanup_claimed_by as claimed_by, cleanup_claim_generation as claim_generation,
           cleanup_claim_expires_at as claim_expires_at, ${rootPath} as root_path
      from ${tableIn(db, table)} where id = ${p.id}`;
});

/** The resource row of either kind, or null. */
export async function readResource(trx: Trx, kind: OwnedResourceKind, id: string): Promise<ResourceState | null> {
  const row = await READ_RESOURCE.first(trx, { id }, kind);
  if (!row) return null;
  return {
    id: row.id,
    owner: row.owner,
    generation: Number(row.generation),
    status: row.status,
    claimedBy: row.claimed_by,
    claimGeneration: row.claim_generation === null ? null : Number(row.claim_generation),
    claimExpiresAt: row.claim_expires_at === null ? null : Number(row.claim_expires_at),
    rootPath: row.root_path,
  };
}

/** The resource's claim if it is still active at `now` (an expired claim blocks nothing). */
export function activeClaim(state: ResourceState, now: number): ResourceCleanupClaim | null {
  if (state.claimedBy === null || state.claimExpiresAt === null || state.claimExpiresAt <= now) return null;
  return {
    claimant: state.claimedBy,
    generation: state.claimGeneration ?? state.generation,
    expiresAt: state.claimExpiresAt,
  };
}
