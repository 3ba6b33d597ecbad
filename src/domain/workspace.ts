/** A workspace as the repositories return it (SPEC §4): a company's working copy, by root path. */
export interface WorkspaceRecord {
  readonly id: string;
  readonly companyId: string;
  readonly name: string;
  readonly rootPath: string | null;
  readonly createdAt: number;
}
