import { sql, type Kysely } from 'kysely';
import type { Database } from '../schema/database.js';
import { check, type DoctorCheck } from './report.js';

/** `synchronous_commit` levels that wait for a synchronous standby to flush (or apply) the commit. */
const WAITS_FOR_STANDBY_FLUSH: ReadonlySet<string> = new Set(['on', 'remote_apply']);

interface Settings {
  in_recovery: boolean;
  synchronous_commit: string;
  synchronous_standby_names: string;
}

interface Standby {
  name: string;
  state: string | null;
  sync_state: string | null;
  lag_bytes: number | null;
  replay_lag_ms: number | null;
}

/**
 * `environment.replication`: whether a failover of this server can lose commits taskfence
 * acknowledged. Fencing rests on every acknowledged claim and token bump surviving: a promoted
 * standby that lacks the last ones hands out a token again, and two holders each believe they
 * hold the lock. So it warns unless replication is synchronous (`synchronous_standby_names` set,
 * a standby synchronous now, and `synchronous_commit` at `on` or `remote_apply` for the store's
 * sessions; Patroni's `synchronous_mode` sets the first two). Lists each standby with its state
 * and lag (`pg_stat_replication`; the lag needs `pg_monitor` or superuser to be visible).
 */
export async function replicationCheck(db: Kysely<Database>): Promise<DoctorCheck> {
  const { rows } = await sql<Settings>`
    select pg_is_in_recovery() as in_recovery,
      current_setting('synchronous_commit') as synchronous_commit,
      current_setting('synchronous_standby_names') as synchronous_standby_names`.execute(db);
  const settings = rows[0]!;
  if (settings.in_recovery) {
    return check(
      'environment.replication',
      'warn',
      'this server is a standby (in recovery): replication is judged on the primary, and a store that writes must reach the primary (a host list with target_session_attrs=read-write finds it)',
    );
  }
  const standbys = (
    await sql<Standby>`
      select coalesce(nullif(application_name, ''), client_addr::text, pid::text) as name, state, sync_state,
        pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::float8 as lag_bytes,
        (extract(epoch from replay_lag) * 1000)::float8 as replay_lag_ms
      from pg_stat_replication order by 1`.execute(db)
  ).rows;
  const items = standbys.map(describeStandby);
  const names = settings.synchronous_standby_names.trim();
  const level = settings.synchronous_commit;
  const synchronousNow = standbys.filter((s) => s.sync_state === 'sync' || s.sync_state === 'quorum');
  const settingsText = `synchronous_commit=${level}, synchronous_standby_names=${names === '' ? "''" : names}`;
  if (standbys.length === 0 && names === '') {
    return check(
      'environment.replication',
      'pass',
      `no streaming standby is attached (${settingsText}): no failover of this server can promote a standby that lacks acknowledged commits (storage-level replication of a managed service is not visible here)`,
    );
  }
  const reasons: string[] = [];
  if (names === '') reasons.push('synchronous_standby_names is empty');
  else if (synchronousNow.length === 0) reasons.push('no attached standby is synchronous now');
  if (!WAITS_FOR_STANDBY_FLUSH.has(level))
    reasons.push(`synchronous_commit is ${level}, below on (commits do not wait for a standby to flush them)`);
  if (reasons.length === 0) {
    return check(
      'environment.replication',
      'pass',
      `replication is synchronous (${settingsText}; ${synchronousNow.length} of ${standbys.length} standbys synchronous): every commit taskfence acknowledges is on a standby before it returns`,
      items,
    );
  }
  return check(
    'environment.replication',
    'warn',
    `fencing can break on failover: replication is asynchronous (${reasons.join('; ')}). A promoted standby can lack commits taskfence acknowledged, so fencing tokens can go backwards and two holders can each believe they hold a lock. ` +
      "Make it synchronous: synchronous_standby_names naming a standby and synchronous_commit = on (or remote_apply), or Patroni's synchronous_mode",
    items,
  );
}

function describeStandby(s: Standby): string {
  const lag =
    s.lag_bytes === null
      ? 'lag not visible to this role (grant pg_monitor)'
      : `replay lag ${Math.round(s.lag_bytes)} bytes${s.replay_lag_ms === null ? '' : ` (${Math.round(s.replay_lag_ms)} ms)`}`;
  return `${s.name}: ${s.state ?? 'state not visible'}, ${s.sync_state ?? 'sync state not visible'}, ${lag}`;
}
