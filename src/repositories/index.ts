import type { StoreContext } from './context.js';
import { createDispatchRepository } from './dispatches/index.js';
import type { DispatchRepository } from './dispatches/types.js';
import { createGateRepository, type GateRepository } from './gates.js';
import { createLockRepository } from './locks.js';
import type { LockRepository } from './shared/leases.js';
import { createMaintenanceRepository, type MaintenanceRepository } from './maintenance.js';
import { createMessageRepository, type MessageRepository } from './messages.js';
import { createOrgRepository, type OrgRepository } from './org.js';
import { createOwnershipRepository } from './ownership/index.js';
import type { OwnershipRepository } from './ownership/types.js';
import { createPathLeaseRepository } from './paths/index.js';
import type { PathLeaseRepository } from './paths/types.js';
import { createRunRepository } from './runs/index.js';
import { createSemaphoreRepository } from './semaphores/index.js';
import type { SemaphoreRepository } from './semaphores/types.js';
import type { RunRepository } from './runs/types.js';
import { createSchedulerRepository, type SchedulerRepository } from './scheduler.js';
import { createTaskRepository, type TaskRepository } from './tasks.js';

/** The repository groups a store exposes, one per area of the spec. */
export interface Repositories {
  readonly org: OrgRepository;
  readonly tasks: TaskRepository;
  /** SPEC §3 */
  readonly runs: RunRepository;
  readonly dispatches: DispatchRepository;
  readonly gates: GateRepository;
  readonly messages: MessageRepository;
  /** SPEC §4 */
  readonly locks: LockRepository;
  readonly scheduler: SchedulerRepository;
  /** SPEC §5 */
  readonly paths: PathLeaseRepository;
  /** SPEC §6 */
  readonly ownership: OwnershipRepository;
  /** Counting semaphores (issue 21). */
  readonly semaphores: SemaphoreRepository;
  /** Retention: pruning what is finished and old. */
  readonly maintenance: MaintenanceRepository;
}

/** Builds every area on one store context (the only module that imports every area). */
export function createRepositories(context: StoreContext): Repositories {
  const locks = createLockRepository(context);
  return {
    org: createOrgRepository(context),
    tasks: createTaskRepository(context),
    runs: createRunRepository(context),
    dispatches: createDispatchRepository(context),
    gates: createGateRepository(context),
    messages: createMessageRepository(context),
    locks,
    scheduler: createSchedulerRepository(context, locks),
    paths: createPathLeaseRepository(context),
    ownership: createOwnershipRepository(context),
    semaphores: createSemaphoreRepository(context),
    maintenance: createMaintenanceRepository(context),
  };
}
