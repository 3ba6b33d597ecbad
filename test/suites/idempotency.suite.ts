import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AlreadyExistsError, NotFoundError, type Store } from '../../src/index.js';
import type { DialectFixture } from '../support/fixtures.js';
import { Contenders } from '../support/race.js';
import { ops as OPS } from './idempotency.ops.js';

const CONTENDERS = 6;

/**
 * Creates are idempotent by caller-chosen id (SPEC §8): a retry after COMMIT_OUTCOME_UNKNOWN
 * with the same id and input returns the stored row, other input under the same id is
 * ALREADY_EXISTS, a missing reference is NOT_FOUND naming it, and concurrent creates of one id
 * from several processes all answer with the one row.
 */
export function defineIdempotencySuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  let store: Store;
  beforeAll(async () => {
    fx = makeFixture();
    store = await fx.freshStore();
  });
  afterAll(() => fx.cleanup());

  describe('creates with a caller-chosen id', () => {
    it('return the stored row for the same input and refuse other input, for every kind of row', async () => {
      const company = await store.org.createCompany({ id: 'co', name: 'Acme' });
      expect(await store.org.createCompany({ id: 'co', name: 'Acme' })).toEqual(company);
      await expect(store.org.createCompany({ id: 'co', name: 'Other' })).rejects.toMatchObject({
        code: 'ALREADY_EXISTS',
        entity: 'company',
        differences: ['name'],
      });

      const ws = await store.org.createWorkspace({ id: 'ws', companyId: 'co', name: 'main', rootPath: '/w' });
      expect(await store.org.createWorkspace({ id: 'ws', companyId: 'co', name: 'main', rootPath: '/w' })).toEqual(ws);
      await expect(store.org.createWorkspace({ id: 'ws', companyId: 'co', name: 'main' })).rejects.toBeInstanceOf(
        AlreadyExistsError,
      );

      const agent = await store.org.createAgent({
        id: 'ag',
        companyId: 'co',
        name: 'dev',
        role: 'Engineer',
        workspaceId: 'ws',
      });
      expect(
        await store.org.createAgent({ id: 'ag', companyId: 'co', name: 'dev', role: 'Engineer', workspaceId: 'ws' }),
      ).toEqual(agent);
      await expect(
        store.org.createAgent({ id: 'ag', companyId: 'co', name: 'dev', role: 'CTO', workspaceId: 'ws' }),
      ).rejects.toMatchObject({ differences: ['role'] });

      const project = await store.org.createProject({ id: 'pr', companyId: 'co', name: 'p', primaryWorkspaceId: 'ws' });
      expect(await store.org.createProject({ id: 'pr', companyId: 'co', name: 'p', primaryWorkspaceId: 'ws' })).toEqual(
        project,
      );

      const input = {
        id: 'tk',
        companyId: 'co',
        title: 'T',
        requiresFilesystem: true,
        writes: ['src/a.ts'],
        projectId: 'pr',
      } as const;
      const task = await store.tasks.createTask(input);
      expect(await store.tasks.createTask(input)).toEqual(task);
      expect(await store.tasks.getTask('tk')).toEqual(task);
      await expect(store.tasks.createTask({ ...input, writes: ['src/b.ts'] })).rejects.toMatchObject({
        code: 'ALREADY_EXISTS',
        differences: ['writes'],
      });

      const env = await store.ownership.createEnvironment({ id: 'env', ownerTaskId: 'tk', rootPath: '/w/tk' });
      expect(await store.ownership.createEnvironment({ id: 'env', ownerTaskId: 'tk', rootPath: '/w/tk' })).toEqual(env);
      await expect(
        store.ownership.createEnvironment({ id: 'env', ownerTaskId: 'tk', rootPath: '/elsewhere' }),
      ).rejects.toBeInstanceOf(AlreadyExistsError);

      const group = await store.ownership.createWorkspaceGroup({ id: 'grp', stewardTaskId: 'tk' });
      expect(await store.ownership.createWorkspaceGroup({ id: 'grp', stewardTaskId: 'tk' })).toEqual(group);

      const run = await store.runs.startCoordinatorRun({ id: 'run', targetKey: 'worktree:idem' });
      expect(await store.runs.startCoordinatorRun({ id: 'run', targetKey: 'worktree:idem' })).toEqual({
        ...run,
        adoptedTaskCount: 0,
      });
      await expect(store.runs.startCoordinatorRun({ id: 'run', targetKey: 'worktree:other' })).rejects.toMatchObject({
        code: 'ALREADY_EXISTS',
        differences: ['targetKey'],
      });
      // Another id on the same target is still a conflict with the running run.
      await expect(store.runs.startCoordinatorRun({ id: 'run-2', targetKey: 'worktree:idem' })).rejects.toMatchObject({
        code: 'COORDINATOR_RUN_CONFLICT',
        runningRunId: 'run',
      });

      expect(await store.db.selectFrom('tasks').select('id').where('id', '=', 'tk').execute()).toHaveLength(1);
    });

    it('name the missing reference instead of leaking a foreign-key error, and write nothing', async () => {
      await store.org.createCompany({ id: 'co2', name: 'Two' });
      const cases: [() => Promise<unknown>, string, string][] = [
        [() => store.org.createWorkspace({ companyId: 'nope', name: 'x' }), 'company', 'nope'],
        [() => store.org.createAgent({ companyId: 'co2', name: 'x', workspaceId: 'no-ws' }), 'workspace', 'no-ws'],
        [
          () => store.org.createProject({ companyId: 'co2', name: 'x', primaryWorkspaceId: 'no-ws' }),
          'workspace',
          'no-ws',
        ],
        [
          () => store.tasks.createTask({ id: 'fk-1', companyId: 'no-co', title: 'x', requiresFilesystem: false }),
          'company',
          'no-co',
        ],
        [
          () =>
            store.tasks.createTask({
              id: 'fk-2',
              companyId: 'co2',
              title: 'x',
              requiresFilesystem: false,
              assigneeAgentId: 'no-agent',
            }),
          'assignee agent',
          'no-agent',
        ],
        [
          () =>
            store.tasks.createTask({
              id: 'fk-3',
              companyId: 'co2',
              title: 'x',
              requiresFilesystem: false,
              projectId: 'no-project',
            }),
          'project',
          'no-project',
        ],
      ];
      for (const [call, entity, id] of cases) {
        const error = await call().catch((e: unknown) => e);
        expect(error).toBeInstanceOf(NotFoundError);
        expect(error).toMatchObject({ entity, id });
      }
      expect(
        await store.db.selectFrom('tasks').select('id').where('id', 'in', ['fk-1', 'fk-2', 'fk-3']).execute(),
      ).toEqual([]);
    });
  });

  describe('concurrent creates of one id', () => {
    let contenders: Contenders<typeof OPS>;
    let url: string;
    beforeAll(async () => {
      url = await fx.freshUrl();
      const setup = await fx.open(url);
      await setup.migrate();
      await setup.org.createCompany({ id: 'race-co', name: 'Race' });
      contenders = await Contenders.start(CONTENDERS, { url, ops: OPS, storeOptions: { poolSize: 2 } });
    });
    afterAll(() => contenders?.close());

    it(`all ${CONTENDERS} processes get the one row, 10 rounds each for tasks, runs and companies`, async () => {
      const check = await fx.open(url);
      for (let round = 0; round < 10; round++) {
        const tasks = await contenders.race('createSameTask', () => ({
          id: `task-${round}`,
          companyId: 'race-co',
        }));
        expect(tasks.map((o) => (o.ok ? o.value.id : o.error.code))).toEqual(Array(CONTENDERS).fill(`task-${round}`));
        const runs = await contenders.race('startSameRun', () => ({
          id: `run-${round}`,
          targetKey: `worktree:race-${round}`,
        }));
        expect(runs.map((o) => (o.ok ? o.value.id : o.error.code))).toEqual(Array(CONTENDERS).fill(`run-${round}`));
        const companies = await contenders.race('createSameCompany', () => ({
          id: `company-${round}`,
        }));
        expect(companies.map((o) => (o.ok ? o.value.id : o.error.code))).toEqual(
          Array(CONTENDERS).fill(`company-${round}`),
        );
      }
      expect(await check.db.selectFrom('tasks').select('id').execute()).toHaveLength(10);
      expect(
        await check.db.selectFrom('coordinator_runs').select('id').where('status', '=', 'running').execute(),
      ).toHaveLength(10);
    });
  });
}
