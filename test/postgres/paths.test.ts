import { afterAll, describe, expect, it } from 'vitest';
import { definePathLeaseSuite } from '../suites/paths.suite.js';
import { postgresFixture } from '../support/dialects.js';

definePathLeaseSuite(postgresFixture);

describe('the path grant function (schema 0106, PostgreSQL)', () => {
  const fx = postgresFixture();
  afterAll(() => fx.cleanup());

  it('before 0106 a grant fails with SCHEMA_OUT_OF_DATE and nothing is leased; other calls work (createTask); migrated, it grants', async () => {
    const store = await fx.freshStore({ to: 105 });
    const company = await store.org.createCompany({ name: 'c' });
    const workspace = await store.org.createWorkspace({ companyId: company.id, name: 'w' });
    const request = { workspaceId: workspace.id, holder: 'agent', paths: ['src'], ttlMs: 60_000 };
    await expect(store.paths.tryAcquirePaths(request)).rejects.toMatchObject({
      code: 'SCHEMA_OUT_OF_DATE',
      currentVersion: 105,
    });
    expect(await store.paths.listPathLeases({ workspaceId: workspace.id })).toEqual([]);
    const task = await store.tasks.createTask({ companyId: company.id, title: 't', requiresFilesystem: false });
    expect(task.status).toBeDefined();
    await store.migrate();
    expect((await store.paths.tryAcquirePaths(request)).status).toBe('acquired');
  });
});
