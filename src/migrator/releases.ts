import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { sql, type Kysely } from 'kysely';
import type { ColumnTypes, StoreDialect } from '../dialects/types.js';
import { ReleaseOutsideWindowError } from '../errors.js';
import { tableIn } from '../query/schema.js';
import { compareReleases } from '../release.js';
import { STATE_TABLE } from './state.js';

/**
 * The open stores, one row each: which release, which schema version it needs, where it runs,
 * and when it was last seen (at open, then every `HEARTBEAT_MS`). `close()` removes the row; a
 * crashed process's row goes stale after `STALE_MS`. `migrate --to` reads it to refuse reverting
 * a version a running release needs.
 */
export const RELEASES_TABLE = 'taskfence_releases';
/** How often an open store refreshes its row. */
export const HEARTBEAT_MS = 60_000;
/** A row not refreshed for this long belongs to a process that is gone. */
export const STALE_MS = 5 * HEARTBEAT_MS;

/** The row id of the store opened on each dialect, so its own `migrate` does not count it as another release. */
const instances = new WeakMap<StoreDialect, string>();

/** The registry row id of the store opened on `dialect`, if it registered. */
export function instanceOf(dialect: StoreDialect): string | undefined {
  return instances.get(dialect);
}

/** Creates the registry table if it is missing (in a migration's transaction, under the migration lock). */
export async function createReleasesTable(trx: Kysely<any>, types: ColumnTypes): Promise<void> {
  await trx.schema
    .createTable(RELEASES_TABLE)
    .ifNotExists()
    .addColumn('instance_id', 'text', (c) => c.primaryKey())
    .addColumn('release', 'text', (c) => c.notNull())
    .addColumn('needs_version', 'integer', (c) => c.notNull())
    .addColumn('host', 'text', (c) => c.notNull())
    .addColumn('pid', 'integer', (c) => c.notNull())
    .addColumn('opened_at', types.epochMs, (c) => c.notNull())
    .addColumn('seen_at', types.epochMs, (c) => c.notNull())
    .execute();
}

/**
 * At `openStore`: refuses a release older than the database's compatibility window
 * (`ReleaseOutsideWindowError`), then registers the store (best effort: a database migrated
 * before the registry existed, a role that may not write it, or a busy SQLite file leaves it
 * unregistered). Returns what `close()` calls to unregister, and stops the heartbeat.
 */
export async function openRegistration(
  dialect: StoreDialect,
  release: string,
  needsVersion: number,
): Promise<() => Promise<void>> {
  const db = dialect.db as Kysely<any>;
  let window: { version: number | string; min_writer_release: string }[] = [];
  try {
    window = (
      await sql<{
        version: number | string;
        min_writer_release: string;
      }>`select version, min_writer_release from ${tableIn(db, STATE_TABLE)} where min_writer_release is not null`.execute(
        db,
      )
    ).rows;
  } catch {
    // No state table: a database no migrate of this taskfence has touched, so no window.
  }
  for (const row of window) {
    if (compareReleases(release, row.min_writer_release) < 0) {
      throw new ReleaseOutsideWindowError(release, row.min_writer_release, Number(row.version));
    }
  }
  const id = randomUUID();
  const now = Date.now();
  try {
    await sql`insert into ${tableIn(db, RELEASES_TABLE)} (instance_id, release, needs_version, host, pid, opened_at, seen_at)
      values (${id}, ${release}, ${needsVersion}, ${hostname()}, ${process.pid}, ${now}, ${now})`.execute(db);
  } catch {
    return async () => {};
  }
  instances.set(dialect, id);
  const timer = setInterval(() => {
    void sql`update ${tableIn(db, RELEASES_TABLE)} set seen_at = ${Date.now()} where instance_id = ${id}`
      .execute(db)
      .catch(() => {});
  }, HEARTBEAT_MS);
  timer.unref();
  return async () => {
    clearInterval(timer);
    await sql`delete from ${tableIn(db, RELEASES_TABLE)} where instance_id = ${id}`.execute(db).catch(() => {});
  };
}

/** Open stores other than `exclude` seen within `STALE_MS` that need a version above `target`. */
export async function runningReleasesAbove(
  db: Kysely<any>,
  target: number,
  exclude: string | undefined,
): Promise<{ release: string; needsVersion: number; host: string; pid: number; seenAt: number }[]> {
  try {
    const { rows } = await sql<{
      instance_id: string;
      release: string;
      needs_version: number | string;
      host: string;
      pid: number | string;
      seen_at: number | string;
    }>`select * from ${tableIn(db, RELEASES_TABLE)} where needs_version > ${target} and seen_at > ${Date.now() - STALE_MS}
       order by seen_at desc`.execute(db);
    return rows
      .filter((r) => r.instance_id !== exclude)
      .map((r) => ({
        release: r.release,
        needsVersion: Number(r.needs_version),
        host: r.host,
        pid: Number(r.pid),
        seenAt: Number(r.seen_at),
      }));
  } catch {
    return [];
  }
}
