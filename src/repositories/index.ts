import type { StoreContext } from './context.js';
import { createDispatchRepository } from './dispatches/index.js';
import type { DispatchRepository } from './dispatches/types.js';
import { createGateRepository, GATE_OUTCOMES, type GateRepository } from './gates.js';
import { createLockRepository } from './locks.js';
import type { LockRepository } from './shared/leases.js';
import { createMaintenanceRepository, MAINTENANCE_OUTCOMES, type MaintenanceRepository } from './maintenance.js';
import { createMessageRepository, type MessageRepository } from './messages/index.js';
import { createOrgRepository, ORG_OUTCOMES, type OrgRepository } from './org.js';
import { createOwnershipRepository } from './ownership/index.js';
import type { OwnershipRepository } from './ownership/types.js';
import { createPathLeaseRepository } from './paths/index.js';
import type { PathLeaseRepository } from './paths/types.js';
import { createRunRepository } from './runs/index.js';
import { createSemaphoreRepository } from './semaphores/index.js';
import type { SemaphoreRepository } from './semaphores/types.js';
import type { RunRepository } from './runs/types.js';
import { createSchedulerRepository, SCHEDULER_OUTCOMES, type SchedulerRepository } from './scheduler.js';
import { createTaskRepository, TASK_OUTCOMES, type TaskRepository } from './tasks.js';
import type { OutcomeDeclaration, OutcomeDeclarations } from './shared/outcomes.js';
import { LOCK_OUTCOMES } from './shared/leases.js';
import { DISPATCH_OUTCOMES } from './dispatches/types.js';
import { MESSAGE_OUTCOMES } from './messages/types.js';
import { OWNERSHIP_OUTCOMES } from './ownership/types.js';
import { PATH_OUTCOMES } from './paths/types.js';
import { RUN_OUTCOMES } from './runs/types.js';
import { SEMAPHORE_OUTCOMES } from './semaphores/types.js';

/** The repository groups a store exposes, one per area of the spec. */
export interface Repositories {
  /** Companies, workspaces, agents and projects. */
  readonly org: OrgRepository;
  /** Tasks: creation (with dependencies), reads, transitions and the dependency graph. */
  readonly tasks: TaskRepository;
  /** Coordinator runs: start, heartbeat, stop, and reconciling stale ones (SPEC §3). */
  readonly runs: RunRepository;
  /** Dispatches of tasks to terminals: the ready queue, completion and dispatch leases (SPEC §3). */
  readonly dispatches: DispatchRepository;
  /** Decision gates that block a task until resolved, resumed exactly once (SPEC §3). */
  readonly gates: GateRepository;
  /** Messages between handles: send, leased receive and ack, delivery (SPEC §3). */
  readonly messages: MessageRepository;
  /** Workspace locks and task leases (SPEC §4). */
  readonly locks: LockRepository;
  /** Lock-mode resolution and dispatch decisions (SPEC §4). */
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

/**
 * Every call's declared outcome, by area, as each area declares it beside its functions: what the
 * event hub reports and the OpenTelemetry spans record (see shared/outcomes.ts).
 */
export const OUTCOMES: { readonly [A in keyof Repositories]: OutcomeDeclarations<Repositories[A]> } = Object.freeze({
  org: ORG_OUTCOMES,
  tasks: TASK_OUTCOMES,
  runs: RUN_OUTCOMES,
  dispatches: DISPATCH_OUTCOMES,
  gates: GATE_OUTCOMES,
  messages: MESSAGE_OUTCOMES,
  locks: LOCK_OUTCOMES,
  scheduler: SCHEDULER_OUTCOMES,
  paths: PATH_OUTCOMES,
  ownership: OWNERSHIP_OUTCOMES,
  semaphores: SEMAPHORE_OUTCOMES,
  maintenance: MAINTENANCE_OUTCOMES,
});

/** The declaration of `area.name`; throws for a call nobody declared (a new method must declare its outcome). */
export function declarationOf(area: string, name: string): OutcomeDeclaration<never> {
  const declaration = (OUTCOMES as Record<string, Record<string, OutcomeDeclaration<never>> | undefined>)[area]?.[name];
  if (!declaration) throw new Error(`taskfence: ${area}.${name} declares no outcome (see shared/outcomes.ts)`);
  return declaration;
}
