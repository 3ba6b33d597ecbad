import type { StoreContext } from './context.js';

/** Path-scoped write leases (issue 5). */
// eslint-disable-next-line @typescript-eslint/no-empty-object-type
export interface PathLeaseRepository {}

export function createPathLeaseRepository(ctx: StoreContext): PathLeaseRepository {
  void ctx;
  return {};
}
