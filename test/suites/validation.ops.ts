/** Contender operations for the validation suite (run in child processes by the race helper). */
import type { Store, TryAcquirePathsResult } from '../../src/index.js';
import type { ContenderTools } from '../support/contender.js';
import { defineOperations } from '../support/operations.js';

/** The key every contender's large set shares; it sorts after all the others, so it lands in the last chunk. */
export const SHARED_KEY = 'zz/shared';

/** `n` paths of this contender's own plus `SHARED_KEY`, in one `tryAcquirePaths`. */
export async function acquireLargeSet(
  store: Store,
  args: { workspaceId: string; n: number },
  tools: ContenderTools,
): Promise<TryAcquirePathsResult> {
  const paths = [...Array.from({ length: args.n }, (_, i) => `c${tools.index}/f${i}`), SHARED_KEY];
  return store.paths.tryAcquirePaths({
    workspaceId: args.workspaceId,
    holder: `c${tools.index}`,
    paths,
    ttlMs: 600_000,
  });
}

/** The operations this module's contenders run (see test/support/operations.ts). */
export const ops = defineOperations(import.meta.url, { acquireLargeSet });
