import { afterAll, describe, expect, it } from 'vitest';
import { defineBatchSuite } from '../suites/batches.suite.js';
import { postgresFixture } from '../support/dialects.js';

defineBatchSuite(postgresFixture);

describe('the batch claim function (schema 0107, PostgreSQL)', () => {
  const fx = postgresFixture();
  afterAll(() => fx.cleanup());

  it('before 0107 a batch claim fails with SCHEMA_OUT_OF_DATE and dispatches nothing; dispatchNext works; migrated, it claims', async () => {
    const store = await fx.freshStore({ to: 106 });
    const company = await store.org.createCompany({ name: 'c' });
    const targetKey = 'worktree:batch-0107';
    const run = await store.runs.startCoordinatorRun({ targetKey });
    const [first] = await store.tasks.createTasks(
      ['a', 'b', 'c'].map((title) => ({
        companyId: company.id,
        title,
        targetKey,
        requiresFilesystem: false,
        status: 'ready' as const,
      })),
    );
    const request = { runId: run.id, terminalHandles: ['term-1', 'term-2'] };
    await expect(store.dispatches.dispatchNextBatch(request)).rejects.toMatchObject({
      code: 'SCHEMA_OUT_OF_DATE',
      currentVersion: 106,
    });
    expect(await store.dispatches.listDispatches({ runId: run.id })).toEqual([]);
    expect((await store.dispatches.dispatchNext({ runId: run.id, terminalHandle: 'term-0' }))?.taskId).toBe(first!.id);
    await store.migrate();
    expect((await store.dispatches.dispatchNextBatch(request)).map((d) => d.terminalHandle)).toEqual([
      'term-1',
      'term-2',
    ]);
  });
});
