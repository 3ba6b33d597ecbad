/**
 * Workspace lock mode (seed 000, SPEC §4): the pure decision, apart from any I/O.
 *
 * The runtime reads task state only — the task's explicit workspace, its `requiresFilesystem`
 * flag, its project's primary workspace and the agent's workspace. Roles and departments played
 * their part once, in the v52 backfill; there is no company-wide fallback.
 */
import { InvalidArgumentError, TaskfenceError } from '../errors.js';
import type { WorkspaceRecord } from './workspace.js';

/** Where an exclusive workspace came from, in the order they are tried. */
export type WorkspaceSource = 'task' | 'agent' | 'project_primary';

/** The task fields the decision reads (a `Task` fits). */
export interface LockModeTask {
  readonly id: string;
  readonly workspaceId: string | null;
  readonly requiresFilesystem: boolean;
  readonly projectId: string | null;
}

/** The agent fields the decision reads (an `Agent` fits). */
export interface LockModeAgent {
  readonly id: string;
  readonly workspaceId: string | null;
}

/** The project fields the decision reads (a `Project` fits). */
export interface LockModeProject {
  readonly id: string;
  readonly primaryWorkspaceId: string | null;
}

/** Which workspace id to lock, before the record is looked up. */
export type LockModeDecision =
  | { readonly lockMode: 'exclusive'; readonly workspaceId: string; readonly source: WorkspaceSource }
  | { readonly lockMode: 'none'; readonly workspaceId: null };

/**
 * The resolved lock mode of a (task, agent) pair. `exclusive` always carries a live workspace
 * record and `none` always carries `null`, so reading `workspace.id` needs narrowing on `lockMode`.
 */
export type WorkspaceResolution =
  | { readonly lockMode: 'exclusive'; readonly workspace: WorkspaceRecord; readonly source: WorkspaceSource }
  | { readonly lockMode: 'none'; readonly workspace: null };

/** Why a filesystem task has no workspace to lock. */
export type WorkspaceConfigurationReason =
  /** The task requires the filesystem, but neither the agent nor the task's project names a workspace. */
  | 'no_workspace_bound'
  /** The chosen workspace id (task, agent or project primary) names no workspace row. */
  | 'workspace_missing';

/**
 * A task that needs an exclusive workspace has none it may legitimately use. Raised at resolve
 * time instead of silently serialising on some other workspace of the company.
 */
export class WorkspaceConfigurationError extends TaskfenceError {
  readonly code = 'WORKSPACE_CONFIGURATION';
  constructor(
    readonly taskId: string,
    readonly agentId: string,
    readonly projectId: string | null,
    readonly reason: WorkspaceConfigurationReason,
    readonly workspaceId: string | null = null,
    readonly source: WorkspaceSource | null = null,
  ) {
    super(
      reason === 'no_workspace_bound'
        ? `Task ${taskId} requires the filesystem but has no workspace: agent ${agentId} has no workspace and ` +
            (projectId === null ? 'the task has no project' : `project ${projectId} has no primary workspace`) +
            ". Bind a workspace to the agent, set the project's primary workspace, or give the task an explicit workspaceId " +
            '(taskfence never falls back to another workspace of the company).'
        : `Task ${taskId} resolves to workspace ${workspaceId} (from the ${describeSource(source)}), which does not exist. ` +
            `Point the ${describeSource(source)} at an existing workspace.`,
    );
  }
}

function describeSource(source: WorkspaceSource | null): string {
  if (source === 'task') return "task's workspaceId";
  if (source === 'agent') return "agent's workspace";
  if (source === 'project_primary') return "project's primary workspace";
  return 'binding';
}

/**
 * Decides the lock mode of a (task, agent) pair from task state alone: an explicit
 * `task.workspaceId` wins (exclusive); else `requiresFilesystem` takes the agent's workspace, then
 * the project's primary workspace, else throws `WorkspaceConfigurationError`; else `none`.
 * `project` is the task's project (or null when it has none or it was not found).
 *
 * @example
 * decideLockMode({ id: 't', workspaceId: null, requiresFilesystem: false, projectId: null }, { id: 'a', workspaceId: 'w' }, null);
 * // → { lockMode: 'none', workspaceId: null }
 */
export function decideLockMode(
  task: LockModeTask,
  agent: LockModeAgent,
  project: LockModeProject | null,
): LockModeDecision {
  if (project !== null && project.id !== task.projectId) {
    throw new InvalidArgumentError(
      'project',
      `must be the task's project (${task.projectId ?? 'none'}), got ${project.id}`,
    );
  }
  if (task.workspaceId !== null) return { lockMode: 'exclusive', workspaceId: task.workspaceId, source: 'task' };
  if (!task.requiresFilesystem) return { lockMode: 'none', workspaceId: null };
  if (agent.workspaceId !== null) return { lockMode: 'exclusive', workspaceId: agent.workspaceId, source: 'agent' };
  if (project !== null && project.primaryWorkspaceId !== null) {
    return { lockMode: 'exclusive', workspaceId: project.primaryWorkspaceId, source: 'project_primary' };
  }
  throw new WorkspaceConfigurationError(task.id, agent.id, task.projectId, 'no_workspace_bound');
}

/**
 * Turns a decision and the looked-up workspace record into a `WorkspaceResolution`: an exclusive
 * decision whose workspace does not exist is a `WorkspaceConfigurationError`, never a `none`.
 */
export function completeResolution(
  task: LockModeTask,
  agent: LockModeAgent,
  decision: LockModeDecision,
  workspace: WorkspaceRecord | null,
): WorkspaceResolution {
  if (decision.lockMode === 'none') return { lockMode: 'none', workspace: null };
  if (workspace === null || workspace.id !== decision.workspaceId) {
    throw new WorkspaceConfigurationError(
      task.id,
      agent.id,
      task.projectId,
      'workspace_missing',
      decision.workspaceId,
      decision.source,
    );
  }
  return { lockMode: 'exclusive', workspace, source: decision.source };
}
