import type { StoreContext } from './context.js';

/** Coordinator runs (issue 3). */
// eslint-disable-next-line @typescript-eslint/no-empty-object-type
export interface RunRepository {}

export function createRunRepository(ctx: StoreContext): RunRepository {
  void ctx;
  return {};
}
