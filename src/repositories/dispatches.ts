import type { StoreContext } from './context.js';

/** Dispatch contexts (issue 3). */
// eslint-disable-next-line @typescript-eslint/no-empty-object-type
export interface DispatchRepository {}

export function createDispatchRepository(ctx: StoreContext): DispatchRepository {
  void ctx;
  return {};
}
