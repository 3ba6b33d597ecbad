import type { StoreContext } from './context.js';
import { createOrgRepository, type OrgRepository } from './org.js';
import { createTaskRepository, type TaskRepository } from './tasks.js';

/** The repository groups a store exposes. Each later area adds its group here. */
export interface Repositories {
  readonly org: OrgRepository;
  readonly tasks: TaskRepository;
}

export function createRepositories(context: StoreContext): Repositories {
  return {
    org: createOrgRepository(context),
    tasks: createTaskRepository(context),
  };
}
