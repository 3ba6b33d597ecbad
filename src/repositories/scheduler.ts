import type { StoreContext } from './context.js';

/** Lock-mode resolution lookups and dispatchRun (issue 4). */
// eslint-disable-next-line @typescript-eslint/no-empty-object-type
export interface SchedulerRepository {}

export function createSchedulerRepository(ctx: StoreContext): SchedulerRepository {
  void ctx;
  return {};
}
