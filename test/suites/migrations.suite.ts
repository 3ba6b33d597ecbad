import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fileURLToPath } from 'node:url';
import { LATEST_VERSION, MIGRATIONS } from '../../src/index.js';
import type { DialectFixture } from '../support/fixtures.js';
import { Contenders } from '../support/race.js';

const OPS = fileURLToPath(new URL('./migrations.ops.ts', import.meta.url));

export function defineMigrationSuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  beforeAll(() => {
    fx = makeFixture();
  });
  afterAll(() => fx.cleanup());

  describe('concurrent deploys', () => {
    it('six processes migrating one database at once all succeed and each migration is applied once', async () => {
      for (let round = 0; round < 3; round++) {
        const url = await fx.freshUrl();
        const contenders = await Contenders.start(6, { url, module: OPS });
        try {
          const outcomes = await contenders.race<{ applied: number[]; toVersion: number }>('migrate');
          for (const o of outcomes) expect(o, JSON.stringify(o)).toMatchObject({ ok: true, value: { toVersion: LATEST_VERSION } });
          const appliedEverywhere = outcomes.flatMap((o) => (o.ok ? o.value.applied : []));
          expect(appliedEverywhere.sort((a, b) => a - b)).toEqual(MIGRATIONS.map((m) => m.version));
        } finally {
          await contenders.close();
        }
        const store = await fx.open(url);
        const history = await store.db.selectFrom('taskfence_migrations').select('version').orderBy('version').execute();
        expect(history.map((h) => h.version)).toEqual(MIGRATIONS.map((m) => m.version));
      }
    });
  });
}
