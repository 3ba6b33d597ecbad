import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  CleanupBarrierError,
  InvalidArgumentError,
  InvalidWritePathError,
  NotFoundError,
  type CreateTaskInput,
  type Store,
} from '../../src/index.js';
import type { DialectFixture } from '../support/fixtures.js';

export function defineTaskSuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  let store: Store;
  let companyId: string;
  beforeAll(async () => {
    fx = makeFixture();
    store = await fx.freshStore();
    companyId = (await store.org.createCompany({ name: 'Acme' })).id;
  });
  afterAll(() => fx.cleanup());

  describe('createTask', () => {
    it('requires every caller to decide requiresFilesystem, at run time too', async () => {
      const input = { companyId, title: 'no decision' } as unknown as CreateTaskInput;
      await expect(store.tasks.createTask(input)).rejects.toBeInstanceOf(InvalidArgumentError);
      await expect(
        store.tasks.createTask({ ...input, requiresFilesystem: 'yes' } as unknown as CreateTaskInput),
      ).rejects.toThrow(/requiresFilesystem/);
      const task = await store.tasks.createTask({ companyId, title: 'decided', requiresFilesystem: true });
      expect(task).toMatchObject({ requiresFilesystem: true, status: 'backlog', writes: null, coordinatorRunId: null });
    });

    it('stamps the running run of the task’s target, and only of that target', async () => {
      const run = await store.runs.startCoordinatorRun({ targetKey: 'worktree:tasks-a' });
      const mine = await store.tasks.createTask({
        companyId,
        title: 'a',
        targetKey: 'worktree:tasks-a',
        requiresFilesystem: false,
      });
      const other = await store.tasks.createTask({
        companyId,
        title: 'b',
        targetKey: 'worktree:tasks-b',
        requiresFilesystem: false,
      });
      expect(mine.coordinatorRunId).toBe(run.id);
      expect(other.coordinatorRunId).toBeNull();
      expect((await store.tasks.listTasks({ runId: run.id })).map((t) => t.id)).toEqual([mine.id]);
      await store.runs.stopCoordinatorRun(run.id, 'completed');
    });

    it('stores canonical write paths and rejects bad ones when the task is created', async () => {
      const task = await store.tasks.createTask({
        companyId,
        title: 'w',
        writes: ['src\\a.ts', './docs/', 'lib/x/../y'],
        requiresFilesystem: true,
      });
      expect(task.writes).toEqual(['src/a.ts', 'docs', 'lib/y']);
      await expect(
        store.tasks.createTask({ companyId, title: 'w', writes: ['../outside'], requiresFilesystem: true }),
      ).rejects.toBeInstanceOf(InvalidWritePathError);
      await expect(
        store.tasks.createTask({ companyId, title: 'w', writes: ['/etc/passwd'], requiresFilesystem: true }),
      ).rejects.toBeInstanceOf(InvalidWritePathError);
      expect(
        (await store.tasks.createTask({ companyId, title: 'dynamic', writes: [], requiresFilesystem: true })).writes,
      ).toEqual([]);
    });

    it('rejects an empty target key and an unknown status', async () => {
      await expect(
        store.tasks.createTask({ companyId, title: 'x', targetKey: '', requiresFilesystem: false }),
      ).rejects.toBeInstanceOf(InvalidArgumentError);
      await expect(
        store.tasks.createTask({ companyId, title: 'x', status: 'archived' as never, requiresFilesystem: false }),
      ).rejects.toBeInstanceOf(InvalidArgumentError);
    });

    it('attaches a shared child to its parent’s group in the same transaction, and refuses one with no group to join', async () => {
      const parent = await store.tasks.createTask({ companyId, title: 'parent', requiresFilesystem: true });
      const loner = await store.tasks.createTask({ companyId, title: 'loner', requiresFilesystem: true });
      await expect(
        store.tasks.createTask({
          companyId,
          title: 'c',
          parentId: loner.id,
          workspaceMode: 'shared',
          requiresFilesystem: true,
        }),
      ).rejects.toBeInstanceOf(InvalidArgumentError);
      await expect(
        store.tasks.createTask({ companyId, title: 'c', parentId: 'missing', requiresFilesystem: true }),
      ).rejects.toBeInstanceOf(NotFoundError);
      const group = await store.ownership.createWorkspaceGroup({ stewardTaskId: parent.id });
      const child = await store.tasks.createTask({
        companyId,
        title: 'child',
        parentId: parent.id,
        workspaceMode: 'shared',
        requiresFilesystem: true,
      });
      const members = await store.db
        .selectFrom('workspace_group_members')
        .select(['task_id', 'role'])
        .where('group_id', '=', group.id)
        .orderBy('role')
        .execute();
      expect(members).toEqual([
        { task_id: child.id, role: 'member' },
        { task_id: parent.id, role: 'steward' },
      ]);
    });

    it('refuses a child under a parent whose cleanup was admitted (the inventory is fixed)', async () => {
      const parent = await store.tasks.createTask({ companyId, title: 'being archived', requiresFilesystem: false });
      await store.ownership.admitTaskCleanup(parent.id, 'archive');
      const error = await store.tasks
        .createTask({ companyId, title: 'late child', parentId: parent.id, requiresFilesystem: false })
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(CleanupBarrierError);
      expect(error).toMatchObject({ admittedTaskId: parent.id, admittedKind: 'archive' });
      expect(await store.tasks.listTasks({ parentId: parent.id })).toEqual([]);
    });
  });
}
