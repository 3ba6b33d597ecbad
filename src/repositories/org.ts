import type { AgentRow } from '../schema/database.js';
import { NotFoundError } from '../errors.js';
import type { StoreContext } from './context.js';
import { createOnce, requireSameCreate } from './idempotent.js';
import { toProject, toWorkspace, type Project, type WorkspaceRecord } from './shared/records.js';
import { optionalId, optionalString, requireId, requireInput, requireText } from './validate.js';
import { committed, type OutcomeDeclarations } from './shared/outcomes.js';

export interface Company {
  readonly id: string;
  readonly name: string;
  readonly createdAt: number;
}
export interface Agent {
  readonly id: string;
  readonly companyId: string;
  readonly name: string;
  readonly role: string | null;
  readonly department: string | null;
  readonly workspaceId: string | null;
  readonly createdAt: number;
}

/**
 * Companies, workspaces, agents and projects: the records tasks point at.
 *
 * Every create is idempotent by caller-chosen id: the same id with the same input returns the
 * existing row (so a retry after `COMMIT_OUTCOME_UNKNOWN` converges to one row); the same id with
 * other input is `AlreadyExistsError`; a missing company or workspace is `NotFoundError`.
 */
export interface OrgRepository {
  /** Creates a company (a tenant): every workspace, agent, project and task belongs to one. */
  createCompany(input: { id?: string; name: string }): Promise<Company>;
  /** Creates a workspace (a working directory, `rootPath`) of a company. */
  createWorkspace(input: {
    id?: string;
    companyId: string;
    name: string;
    rootPath?: string | null;
  }): Promise<WorkspaceRecord>;
  /** Creates an agent of a company, with an optional role, department and home workspace. */
  createAgent(input: {
    id?: string;
    companyId: string;
    name: string;
    role?: string | null;
    department?: string | null;
    workspaceId?: string | null;
  }): Promise<Agent>;
  /** Creates a project of a company: a group of tasks with an optional primary workspace. */
  createProject(input: {
    id?: string;
    companyId: string;
    name: string;
    primaryWorkspaceId?: string | null;
  }): Promise<Project>;
  /** The workspace, or null if there is none with that id. */
  getWorkspace(id: string): Promise<WorkspaceRecord | null>;
  /** The agent, or null if there is none with that id. */
  getAgent(id: string): Promise<Agent | null>;
  /** The project, or null if there is none with that id. */
  getProject(id: string): Promise<Project | null>;
  /** Like `getAgent`, but a missing agent is a `NotFoundError`. */
  requireAgent(id: string): Promise<Agent>;
}

export function toAgent(row: AgentRow): Agent {
  return {
    id: row.id,
    companyId: row.company_id,
    name: row.name,
    role: row.role,
    department: row.department,
    workspaceId: row.workspace_id,
    createdAt: row.created_at,
  };
}

/** The arguments every org create checks: the input object, its optional id, `name`, the given ids and optional texts. */
function checkCreate(
  input: unknown,
  ids: readonly string[],
  optionalIds: readonly string[] = [],
  optionalTexts: readonly string[] = [],
): void {
  const record = requireInput('input', input) as Record<string, unknown>;
  optionalId('id', record.id);
  requireText('name', record.name);
  for (const field of ids) requireId(field, record[field]);
  for (const field of optionalIds) optionalId(field, record[field]);
  for (const field of optionalTexts) optionalString(field, record[field]);
}

export function createOrgRepository(ctx: StoreContext): OrgRepository {
  const { db } = ctx.dialect;
  const repo: OrgRepository = {
    async createCompany(input) {
      checkCreate(input, []);
      const row = { id: input.id ?? ctx.newId(), name: requireText('name', input.name), created_at: ctx.clock.now() };
      return createOnce(ctx.dialect, [], () =>
        ctx.dialect.writeTransaction(async (trx) => {
          if (input.id !== undefined) {
            const existing = await trx.selectFrom('companies').selectAll().where('id', '=', row.id).executeTakeFirst();
            if (existing) {
              requireSameCreate('company', row.id, { name: [row.name, existing.name] });
              return { id: existing.id, name: existing.name, createdAt: existing.created_at };
            }
          }
          await trx.insertInto('companies').values(row).execute();
          return { id: row.id, name: row.name, createdAt: row.created_at };
        }),
      );
    },
    async createWorkspace(input) {
      checkCreate(input, ['companyId'], [], ['rootPath']);
      const row = {
        id: input.id ?? ctx.newId(),
        company_id: requireText('companyId', input.companyId),
        name: requireText('name', input.name),
        root_path: input.rootPath ?? null,
        created_at: ctx.clock.now(),
      };
      return createOnce(ctx.dialect, [['company', 'companies', row.company_id]], () =>
        ctx.dialect.writeTransaction(async (trx) => {
          if (input.id !== undefined) {
            const existing = await trx.selectFrom('workspaces').selectAll().where('id', '=', row.id).executeTakeFirst();
            if (existing) {
              requireSameCreate('workspace', row.id, {
                companyId: [row.company_id, existing.company_id],
                name: [row.name, existing.name],
                rootPath: [row.root_path, existing.root_path],
              });
              return toWorkspace(existing);
            }
          }
          await trx.insertInto('workspaces').values(row).execute();
          return toWorkspace(row);
        }),
      );
    },
    async createAgent(input) {
      checkCreate(input, ['companyId'], ['workspaceId'], ['role', 'department']);
      const row = {
        id: input.id ?? ctx.newId(),
        company_id: requireText('companyId', input.companyId),
        name: requireText('name', input.name),
        role: input.role ?? null,
        department: input.department ?? null,
        workspace_id: input.workspaceId ?? null,
        created_at: ctx.clock.now(),
      };
      const references = [
        ['company', 'companies', row.company_id],
        ['workspace', 'workspaces', row.workspace_id],
      ] as const;
      return createOnce(ctx.dialect, references, () =>
        ctx.dialect.writeTransaction(async (trx) => {
          if (input.id !== undefined) {
            const existing = await trx.selectFrom('agents').selectAll().where('id', '=', row.id).executeTakeFirst();
            if (existing) {
              requireSameCreate('agent', row.id, {
                companyId: [row.company_id, existing.company_id],
                name: [row.name, existing.name],
                role: [row.role, existing.role],
                department: [row.department, existing.department],
                workspaceId: [row.workspace_id, existing.workspace_id],
              });
              return toAgent(existing);
            }
          }
          await trx.insertInto('agents').values(row).execute();
          return toAgent(row);
        }),
      );
    },
    async createProject(input) {
      checkCreate(input, ['companyId'], ['primaryWorkspaceId']);
      const row = {
        id: input.id ?? ctx.newId(),
        company_id: requireText('companyId', input.companyId),
        name: requireText('name', input.name),
        primary_workspace_id: input.primaryWorkspaceId ?? null,
        created_at: ctx.clock.now(),
      };
      const references = [
        ['company', 'companies', row.company_id],
        ['workspace', 'workspaces', row.primary_workspace_id],
      ] as const;
      return createOnce(ctx.dialect, references, () =>
        ctx.dialect.writeTransaction(async (trx) => {
          if (input.id !== undefined) {
            const existing = await trx.selectFrom('projects').selectAll().where('id', '=', row.id).executeTakeFirst();
            if (existing) {
              requireSameCreate('project', row.id, {
                companyId: [row.company_id, existing.company_id],
                name: [row.name, existing.name],
                primaryWorkspaceId: [row.primary_workspace_id, existing.primary_workspace_id],
              });
              return toProject(existing);
            }
          }
          await trx.insertInto('projects').values(row).execute();
          return toProject(row);
        }),
      );
    },
    async getWorkspace(id) {
      requireId('id', id);
      const row = await db.selectFrom('workspaces').selectAll().where('id', '=', id).executeTakeFirst();
      return row ? toWorkspace(row) : null;
    },
    async getAgent(id) {
      requireId('id', id);
      const row = await db.selectFrom('agents').selectAll().where('id', '=', id).executeTakeFirst();
      return row ? toAgent(row) : null;
    },
    async getProject(id) {
      requireId('id', id);
      const row = await db.selectFrom('projects').selectAll().where('id', '=', id).executeTakeFirst();
      return row ? toProject(row) : null;
    },
    async requireAgent(id) {
      requireId('id', id);
      const agent = await repo.getAgent(id);
      if (!agent) throw new NotFoundError('agent', id);
      return agent;
    },
  };
  return repo;
}

/** Each call's declared outcome (see shared/outcomes.ts): org records are plain writes and reads. */
export const ORG_OUTCOMES: OutcomeDeclarations<OrgRepository> = {
  createCompany: committed,
  createWorkspace: committed,
  createAgent: committed,
  createProject: committed,
  getWorkspace: committed,
  getAgent: committed,
  getProject: committed,
  requireAgent: committed,
};
