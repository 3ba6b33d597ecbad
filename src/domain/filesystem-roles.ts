/**
 * The legacy role signal of seed 000, used only by the v52 backfill: unanchored and
 * case-insensitive, so "Director" matches through "cto" and "Sre Lead" through "sre".
 */
export const FILESYSTEM_ROLE_PATTERN = /cto|engineer|developer|devops|sre/i;

/** The department that also implies filesystem work, compared exactly (case-sensitive). */
export const FILESYSTEM_DEPARTMENT = 'engineering';

/** Whether an agent role implies that its todo/backlog tasks mutate files. */
export function roleImpliesFilesystem(role: string | null | undefined): boolean {
  return typeof role === 'string' && FILESYSTEM_ROLE_PATTERN.test(role);
}
