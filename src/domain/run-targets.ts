import { TaskfenceError } from '../errors.js';

/**
 * Orchestration targets (seed 001, SPEC §3). A coordinator run and the tasks it may adopt are
 * scoped to a target: the worktree they operate on, keyed `worktree:<id>`. The key must be the
 * same string for a target everywhere, or the one-running-run-per-target guard cannot see a
 * duplicate; so resolution fails closed instead of guessing. Runs and tasks with no selector
 * share the null target.
 */

/** Prefix of every resolved target key. */
export const WORKTREE_TARGET_PREFIX = 'worktree:';

/**
 * Maps a worktree selector (a path, branch name, id… whatever the caller's terminals use) to the
 * worktree's stable id; `null`/`undefined` when it does not resolve.
 */
export type WorktreeLookup = (selector: string) => string | null | undefined;
export type AsyncWorktreeLookup = (selector: string) => Promise<string | null | undefined> | string | null | undefined;

/** A worktree selector that did not resolve to a worktree: the run (or task) is refused rather than keyed by a guess. */
export class UnresolvedTargetError extends TaskfenceError {
  readonly code = 'UNRESOLVED_ORCHESTRATION_TARGET';
  constructor(
    readonly selector: string,
    readonly reason: string,
    options?: { cause?: unknown },
  ) {
    super(
      `The worktree selector ${JSON.stringify(selector)} does not resolve to a worktree (${reason}). ` +
        'Nothing was started: pass a selector of an existing worktree, or omit it to use the shared null target.',
      options,
    );
  }
}

/**
 * Resolves a worktree selector to its orchestration target key, failing closed: no selector
 * (`null`/`undefined`) is the null target, a selector that resolves is `worktree:<id>`, and
 * anything else (blank selector, unknown worktree, lookup error, blank id) is an `UnresolvedTargetError`.
 *
 * @example
 * resolveOrchestrationTargetKey('feature-x', (s) => worktrees.get(s)?.id); // 'worktree:7f3a…'
 * resolveOrchestrationTargetKey(undefined, lookup); // null
 */
export function resolveOrchestrationTargetKey(
  selector: string | null | undefined,
  lookup: WorktreeLookup,
): string | null {
  if (selector === null || selector === undefined) return null;
  checkSelector(selector);
  let id: string | null | undefined;
  try {
    id = lookup(selector);
  } catch (error) {
    throw new UnresolvedTargetError(selector, 'the worktree lookup failed', { cause: error });
  }
  return toTargetKey(selector, id);
}

/** `resolveOrchestrationTargetKey` for lookups that return a promise; the same fail-closed rules. */
export async function resolveOrchestrationTargetKeyAsync(
  selector: string | null | undefined,
  lookup: AsyncWorktreeLookup,
): Promise<string | null> {
  if (selector === null || selector === undefined) return null;
  checkSelector(selector);
  let id: string | null | undefined;
  try {
    id = await lookup(selector);
  } catch (error) {
    throw new UnresolvedTargetError(selector, 'the worktree lookup failed', { cause: error });
  }
  return toTargetKey(selector, id);
}

function checkSelector(selector: string): void {
  if (typeof selector !== 'string' || selector.trim() === '') {
    throw new UnresolvedTargetError(String(selector), 'the selector is blank; omit it instead to use the null target');
  }
}

function toTargetKey(selector: string, id: unknown): string {
  if (id === null || id === undefined) throw new UnresolvedTargetError(selector, 'no worktree matches it');
  if (typeof id !== 'string' || id.trim() === '' || id !== id.trim()) {
    throw new UnresolvedTargetError(selector, `the lookup returned an unusable worktree id ${JSON.stringify(id)}`);
  }
  return `${WORKTREE_TARGET_PREFIX}${id}`;
}
