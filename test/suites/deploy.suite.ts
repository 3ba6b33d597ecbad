/**
 * The deploy of issue 25, at a size CI affords (correctness, not timings; the figures come from
 * `npm run bench:deploy` at 1,000,000 tasks): while `taskfence migrate` (a child process) brings a
 * database from 0008 to the latest version, a writer of the previous release inserts a task and
 * updates one every 10 ms on its own connection. Every write it was told succeeded is there, the
 * backfill flagged exactly what a fresh run of it over the final rows flags, and the writer kept
 * writing while the backfill ran (its writes interleave with the batches).
 */
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from 'kysely';
import { LATEST_VERSION } from '../../src/index.js';
import { backfillRequiresFilesystem } from '../../src/migrations/0052_requires_filesystem.js';
import { runDeploy, seedAt0008 } from '../../bench/lib/deploy.js';
import type { DialectFixture } from '../support/fixtures.js';
import { tbl } from '../support/schema.js';

const TSX = createRequire(import.meta.url).resolve('tsx');
const CLI = fileURLToPath(new URL('../../src/cli.ts', import.meta.url));
const TASKS = 12_000;

export function defineDeploySuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  beforeAll(() => {
    fx = makeFixture();
  });
  afterAll(() => fx.cleanup());

  describe('a deploy while the previous release writes', () => {
    it('migrate 0008 → latest under a writer every 10 ms: every acknowledged write kept, the backfill exact, writes interleaved with its batches', async () => {
      const url = await fx.freshUrl();
      await seedAt0008(url, TASKS);
      // A pause between batches (--pause-ms, the throttle deploys use) leaves the writer windows
      // even on a loaded machine, so the interleaving below is not left to scheduling luck.
      const run = await runDeploy(url, {
        seeded: TASKS,
        migrateArgv: [
          process.execPath,
          '--import',
          TSX,
          CLI,
          'migrate',
          '--db',
          url,
          '--json',
          '--batch-size',
          '1000',
          '--pause-ms',
          '25',
        ],
      });
      expect(run.stderr).toBe('');
      expect(run.exitCode).toBe(0);
      const done = run.events.find((e) => e.type === 'done');
      expect(done).toMatchObject({ fromVersion: 8, toVersion: LATEST_VERSION });
      // The backfill ran in batches after its DDL committed: progress per batch.
      const batches = run.events.filter((e) => e.type === 'progress' && e.version === 52 && e.done !== undefined);
      expect(batches.length).toBeGreaterThanOrEqual(Math.floor(TASKS / 1000));

      const store = await fx.open(url);
      const ids = new Set((await store.db.selectFrom('tasks').select('id').execute()).map((r) => r.id));
      expect(ids.size).toBe(TASKS + run.inserted.length);
      for (const id of run.inserted) expect(ids.has(id)).toBe(true);
      const titles = new Map(
        (
          await store.db
            .selectFrom('tasks')
            .select(['id', 'title'])
            .where('id', 'in', [...run.updated.keys()])
            .execute()
        ).map((r) => [r.id, r.title]),
      );
      expect(titles).toEqual(new Map(run.updated));
      // The old release wrote between the batches: inserts acknowledged between the first and the last batch event.
      const firstBatchAt = Number(batches[0]!.at);
      const lastBatchAt = Number(batches.at(-1)!.at);
      expect(run.insertedAt.filter((at) => at > firstBatchAt && at < lastBatchAt).length).toBeGreaterThan(0);

      // The flags are exactly a fresh backfill's over the same rows, at the `now` the migration recorded.
      const { rows } = await sql<{
        backfill_now: number | string;
      }>`select backfill_now from ${tbl(store.db, 'taskfence_migration_state')} where version = 52`.execute(store.db);
      const now = Number(rows[0]!.backfill_now);
      const flagged = async () =>
        (
          await store.db.selectFrom('tasks').select('id').where('requires_filesystem', '=', 1).orderBy('id').execute()
        ).map((r) => r.id);
      const migrated = await flagged();
      expect(migrated.length).toBeGreaterThan(0);
      await sql`update ${tbl(store.db, 'tasks')} set requires_filesystem = 0`.execute(store.db);
      await backfillRequiresFilesystem(store.db, { now, progress: () => {} });
      expect(await flagged()).toEqual(migrated);
    });
  });
}
