import type { StoreContext } from './context.js';

/** Decision gates (issue 3). */
// eslint-disable-next-line @typescript-eslint/no-empty-object-type
export interface GateRepository {}

export function createGateRepository(ctx: StoreContext): GateRepository {
  void ctx;
  return {};
}
