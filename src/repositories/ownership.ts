import type { StoreContext } from './context.js';

/** Ownership generations and cleanup (issue 6). */
// eslint-disable-next-line @typescript-eslint/no-empty-object-type
export interface OwnershipRepository {}

export function createOwnershipRepository(ctx: StoreContext): OwnershipRepository {
  void ctx;
  return {};
}
