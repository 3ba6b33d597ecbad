/**
 * The task, project and workspace records and their row mappers: `store.tasks` and `store.org`
 * return them, and `store.scheduler` reads the same rows to resolve a dispatch's workspace.
 */
import type { WorkspaceRecord } from '../../domain/workspace.js';
import type { ProjectRow, TaskRow, TaskStatus, WorkspaceMode, WorkspaceRow } from '../../schema/database.js';

/** A task as the repositories return it: a unit of work, its status, assignment and run scoping. */
export interface Task {
  readonly id: string;
  readonly companyId: string;
  readonly projectId: string | null;
  readonly assigneeAgentId: string | null;
  readonly workspaceId: string | null;
  readonly title: string;
  readonly description: string | null;
  readonly status: TaskStatus;
  readonly createdAt: number;
  readonly updatedAt: number;
  readonly coordinatorRunId: string | null;
  readonly targetKey: string | null;
  readonly requiresFilesystem: boolean;
  readonly parentId: string | null;
  readonly workspaceMode: WorkspaceMode | null;
  /** Paths the task writes; null = omitted (the whole workspace), [] = dynamic. */
  readonly writes: readonly string[] | null;
  /** The insertion order: "oldest first" is ascending `seq`, never a timestamp. */
  readonly seq: number;
  /** Higher is taken first by `dispatchNext` (default 0). */
  readonly priority: number;
  /** The caller's JSON payload describing the work, or null. */
  readonly spec: unknown;
  /** The JSON result recorded when the task finished (`completeDispatch`), or null. */
  readonly result: unknown;
  /** Why the task is `blocked` (its open or failed dependencies, or the caller's reason); null otherwise. */
  readonly blockedReason: string | null;
}

/** Maps a `tasks` row to the public shape. */
export function toTask(row: TaskRow): Task {
  return {
    id: row.id,
    companyId: row.company_id,
    projectId: row.project_id,
    assigneeAgentId: row.assignee_agent_id,
    workspaceId: row.workspace_id,
    title: row.title,
    description: row.description,
    status: row.status,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
    coordinatorRunId: row.coordinator_run_id,
    targetKey: row.target_key,
    requiresFilesystem: row.requires_filesystem === 1,
    parentId: row.parent_id,
    workspaceMode: row.workspace_mode,
    writes: row.writes === null ? null : (JSON.parse(row.writes) as string[]),
    seq: Number(row.seq),
    priority: Number(row.priority),
    spec: row.spec === null ? null : (JSON.parse(row.spec) as unknown),
    result: row.result === null ? null : (JSON.parse(row.result) as unknown),
    blockedReason: row.blocked_reason,
  };
}

export type { WorkspaceRecord } from '../../domain/workspace.js';

export interface Project {
  readonly id: string;
  readonly companyId: string;
  readonly name: string;
  readonly primaryWorkspaceId: string | null;
  readonly createdAt: number;
}

/** Maps a `workspaces` row to the public shape. */
export function toWorkspace(row: WorkspaceRow): WorkspaceRecord {
  return { id: row.id, companyId: row.company_id, name: row.name, rootPath: row.root_path, createdAt: row.created_at };
}

/** Maps a `projects` row to the public shape. */
export function toProject(row: ProjectRow): Project {
  return {
    id: row.id,
    companyId: row.company_id,
    name: row.name,
    primaryWorkspaceId: row.primary_workspace_id,
    createdAt: row.created_at,
  };
}
