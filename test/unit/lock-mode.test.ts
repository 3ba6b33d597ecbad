import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { completeResolution } from '../../src/domain/lock-mode.js';
import {
  decideLockMode,
  FILESYSTEM_ROLE_PATTERN,
  roleImpliesFilesystem,
  WorkspaceConfigurationError,
  type LockModeAgent,
  type LockModeProject,
  type LockModeTask,
  type WorkspaceRecord,
} from '../../src/index.js';

const task = (over: Partial<LockModeTask> = {}): LockModeTask => ({
  id: 'task-1',
  workspaceId: null,
  requiresFilesystem: false,
  projectId: null,
  ...over,
});
const agent = (workspaceId: string | null = null): LockModeAgent => ({ id: 'agent-1', workspaceId });
const project = (primaryWorkspaceId: string | null, id = 'project-1'): LockModeProject => ({ id, primaryWorkspaceId });
const workspace = (id: string): WorkspaceRecord => ({ id, companyId: 'c', name: id, rootPath: null, createdAt: 0 });

describe('decideLockMode: the seed 000 decision table', () => {
  it('task.workspaceId set → exclusive on the task workspace, even for a cognitive task', () => {
    expect(decideLockMode(task({ workspaceId: 'ws-task' }), agent('ws-agent'), null)).toEqual({
      lockMode: 'exclusive',
      workspaceId: 'ws-task',
      source: 'task',
    });
  });

  it('task.workspaceId set → wins over the agent workspace and the project primary of a filesystem task', () => {
    const decision = decideLockMode(
      task({ workspaceId: 'ws-task', requiresFilesystem: true, projectId: 'project-1' }),
      agent('ws-agent'),
      project('ws-primary'),
    );
    expect(decision).toEqual({ lockMode: 'exclusive', workspaceId: 'ws-task', source: 'task' });
  });

  it('requiresFilesystem = 1 → exclusive on the agent workspace first', () => {
    const decision = decideLockMode(
      task({ requiresFilesystem: true, projectId: 'project-1' }),
      agent('ws-agent'),
      project('ws-primary'),
    );
    expect(decision).toEqual({ lockMode: 'exclusive', workspaceId: 'ws-agent', source: 'agent' });
  });

  it('requiresFilesystem = 1 and no agent workspace → exclusive on the project primary', () => {
    const decision = decideLockMode(
      task({ requiresFilesystem: true, projectId: 'project-1' }),
      agent(null),
      project('ws-primary'),
    );
    expect(decision).toEqual({ lockMode: 'exclusive', workspaceId: 'ws-primary', source: 'project_primary' });
  });

  it('requiresFilesystem = 1 with no workspace anywhere → WorkspaceConfigurationError naming task, agent and project', () => {
    const run = () =>
      decideLockMode(task({ requiresFilesystem: true, projectId: 'project-1' }), agent(null), project(null));
    expect(run).toThrow(WorkspaceConfigurationError);
    try {
      run();
    } catch (error) {
      const e = error as WorkspaceConfigurationError;
      expect(e).toMatchObject({
        code: 'WORKSPACE_CONFIGURATION',
        taskId: 'task-1',
        agentId: 'agent-1',
        projectId: 'project-1',
        reason: 'no_workspace_bound',
      });
      expect(e.message).toContain('task-1');
      expect(e.message).toContain('agent-1');
      expect(e.message).toContain('project-1');
    }
  });

  it('requiresFilesystem = 1 with no project at all → WorkspaceConfigurationError with a null projectId', () => {
    expect(() => decideLockMode(task({ requiresFilesystem: true }), agent(null), null)).toThrow(
      expect.objectContaining({ code: 'WORKSPACE_CONFIGURATION', projectId: null, reason: 'no_workspace_bound' }),
    );
  });

  it('everything else → none with a null workspace, even when the agent and project have workspaces', () => {
    expect(decideLockMode(task({ projectId: 'project-1' }), agent('ws-agent'), project('ws-primary'))).toEqual({
      lockMode: 'none',
      workspaceId: null,
    });
  });

  it("rejects a project that is not the task's project", () => {
    expect(() =>
      decideLockMode(
        task({ requiresFilesystem: true, projectId: 'project-1' }),
        agent(null),
        project('ws', 'project-2'),
      ),
    ).toThrow(expect.objectContaining({ code: 'INVALID_ARGUMENT', field: 'project' }));
  });
});

describe('completeResolution', () => {
  it('an exclusive decision carries the looked-up workspace record', () => {
    const r = completeResolution(
      task(),
      agent(),
      { lockMode: 'exclusive', workspaceId: 'ws-1', source: 'agent' },
      workspace('ws-1'),
    );
    expect(r).toEqual({ lockMode: 'exclusive', workspace: workspace('ws-1'), source: 'agent' });
  });

  it('an exclusive decision whose workspace does not exist is a configuration error, never none', () => {
    expect(() =>
      completeResolution(task(), agent(), { lockMode: 'exclusive', workspaceId: 'ws-gone', source: 'task' }, null),
    ).toThrow(
      expect.objectContaining({
        code: 'WORKSPACE_CONFIGURATION',
        reason: 'workspace_missing',
        workspaceId: 'ws-gone',
        source: 'task',
      }),
    );
  });

  it('a none decision resolves to a null workspace', () => {
    expect(completeResolution(task(), agent(), { lockMode: 'none', workspaceId: null }, null)).toEqual({
      lockMode: 'none',
      workspace: null,
    });
  });
});

describe('decideLockMode properties', () => {
  const id = fc.option(fc.constantFrom('ws-a', 'ws-b', 'ws-c'), { nil: null });
  it('exclusive only on a workspace the task, agent or project names; none only without a filesystem signal', () => {
    fc.assert(
      fc.property(id, fc.boolean(), id, fc.option(id, { nil: undefined }), (taskWs, fs, agentWs, primary) => {
        const t = task({
          workspaceId: taskWs,
          requiresFilesystem: fs,
          projectId: primary === undefined ? null : 'project-1',
        });
        const p = primary === undefined ? null : project(primary);
        let decision;
        try {
          decision = decideLockMode(t, agent(agentWs), p);
        } catch (error) {
          // Only a filesystem task without any binding may fail.
          expect(error).toBeInstanceOf(WorkspaceConfigurationError);
          expect(taskWs === null && fs && agentWs === null && (p?.primaryWorkspaceId ?? null) === null).toBe(true);
          return;
        }
        if (taskWs !== null) expect(decision).toEqual({ lockMode: 'exclusive', workspaceId: taskWs, source: 'task' });
        else if (!fs) expect(decision).toEqual({ lockMode: 'none', workspaceId: null });
        else {
          expect(decision.lockMode).toBe('exclusive');
          expect([agentWs, p?.primaryWorkspaceId]).toContain(decision.workspaceId);
        }
      }),
      { numRuns: 300 },
    );
  });
});

describe('the v52 role signal', () => {
  it('is exactly /cto|engineer|developer|devops|sre/i', () => {
    expect(FILESYSTEM_ROLE_PATTERN.source).toBe('cto|engineer|developer|devops|sre');
    expect(FILESYSTEM_ROLE_PATTERN.flags).toBe('i');
  });

  it.each([
    ['CTO', true],
    ['Director', true], // "cto" inside a longer word: unanchored on purpose
    ['Actor', true],
    ['sre', true],
    ['SRE Lead', true],
    ['Sr. Engineer', true],
    ['ENGINEERING MANAGER', true],
    ['DevOps', true],
    ['developer advocate', true],
    ['Dev', false],
    ['Dev Ops', false],
    ['Treasurer', false],
    ['Chief Executive Officer', false],
    ['', false],
    ['ＣＴＯ', false], // fullwidth letters are not folded by a non-unicode /i regex
  ])('%j → %s', (role, expected) => {
    expect(roleImpliesFilesystem(role)).toBe(expected);
  });

  it('a null or missing role never matches (not even as the string "null")', () => {
    expect(roleImpliesFilesystem(null)).toBe(false);
    expect(roleImpliesFilesystem(undefined)).toBe(false);
  });
});
