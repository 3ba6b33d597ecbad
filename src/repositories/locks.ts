import type { StoreContext } from './context.js';

/** Workspace locks and task leases (issue 4). */
// eslint-disable-next-line @typescript-eslint/no-empty-object-type
export interface LockRepository {}

export function createLockRepository(ctx: StoreContext): LockRepository {
  void ctx;
  return {};
}
