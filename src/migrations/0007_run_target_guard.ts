import { sql } from 'kysely';
import { tableIn } from '../query/schema.js';
import type { MigrationDefinition } from './types.js';

/**
 * Per-target run guard (seed 001, SPEC §3): `coordinator_runs.target_key`, a heartbeat, and a
 * partial unique index that lets the database itself refuse a second `running` row for one
 * target; all runs with a null target share the '' slot. Older files can hold several running
 * rows (crashed runs nobody reconciled): all but the newest per target are marked failed first,
 * because the index cannot be built over them.
 */
export const migration0007: MigrationDefinition = {
  version: 7,
  name: 'run_target_guard',
  async up({ db, types, now, progress }) {
    await db.schema.alterTable('coordinator_runs').addColumn('target_key', 'text').execute();
    await db.schema.alterTable('coordinator_runs').addColumn('heartbeat_at', types.epochMs).execute();
    const runs = tableIn(db, 'coordinator_runs');
    await sql`update ${runs} set heartbeat_at = started_at`.execute(db);
    const failed = await sql`
      update ${runs} set status = 'failed', ended_at = ${now}
      where status = 'running'
        and exists (select 1 from ${runs} newer
                    where newer.status = 'running'
                      and (newer.started_at > coordinator_runs.started_at
                           or (newer.started_at = coordinator_runs.started_at and newer.id > coordinator_runs.id)))`.execute(
      db,
    );
    if (failed.numAffectedRows && failed.numAffectedRows > 0n) {
      progress(
        `0007: marked ${failed.numAffectedRows} older running coordinator runs failed (only one may run per target)`,
      );
    }
    await sql`create unique index coordinator_runs_one_running_per_target
      on ${runs} ((coalesce(target_key, ''))) where status = 'running'`.execute(db);
    await db.schema
      .createIndex('coordinator_runs_target_status_idx')
      .on('coordinator_runs')
      .columns(['target_key', 'status'])
      .execute();
  },
  async down({ db }) {
    await db.schema.dropIndex('coordinator_runs_target_status_idx').execute();
    await db.schema.dropIndex('coordinator_runs_one_running_per_target').execute();
    await db.schema.alterTable('coordinator_runs').dropColumn('heartbeat_at').execute();
    await db.schema.alterTable('coordinator_runs').dropColumn('target_key').execute();
  },
};
