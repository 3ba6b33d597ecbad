import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { inject } from 'vitest';
import { openStore, type Store } from '../../src/index.js';
import { runDoctorCommand } from '../../src/doctor/cli.js';
import { postgresFixture } from '../support/dialects.js';
import { pgbouncerRunsHere, startPgbouncer, throughPooler } from '../support/pgbouncer.js';

const runHere = pgbouncerRunsHere('doctor-pgbouncer.test.ts');

describe.runIf(runHere)('doctor through PgBouncer in transaction mode', () => {
  const fx = postgresFixture();
  let bouncer: Awaited<ReturnType<typeof startPgbouncer>>;
  let store: Store;
  let url: string;
  beforeAll(async () => {
    bouncer = await startPgbouncer(inject('pgAdminUrl'));
    const seed = await fx.freshStore();
    url = throughPooler(bouncer, seed.location.url);
    store = await openStore(url);
  });
  afterAll(async () => {
    await store?.close();
    await fx.cleanup();
    await bouncer?.stop();
  });

  it('reports the pooler, and every guarantee still passes through it', async () => {
    const report = await store.doctor();
    expect(report.checks.find((c) => c.id === 'environment.pooler')).toMatchObject({
      status: 'warn',
      detail: expect.stringMatching(/^a transaction-mode pooler sits in the path/),
    });
    expect(report.checks.filter((c) => c.status === 'fail')).toEqual([]);
    for (const c of report.checks.filter((c) => c.area === 'guarantee' || c.area === 'drift'))
      expect(c.status, c.id).toBe('pass');
    const lines: string[] = [];
    expect(await runDoctorCommand({ db: url, json: false }, (l) => lines.push(l))).toBe(0);
    expect(lines.join('\n')).toMatch(/^WARN +environment\.pooler +a transaction-mode pooler/m);
  });
});
