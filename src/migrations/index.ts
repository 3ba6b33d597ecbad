import { migration0005 } from './0005_baseline.js';
import { migration0006 } from './0006_coordinator_run_id.js';
import { migration0007 } from './0007_run_target_guard.js';
import { migration0008 } from './0008_task_target_key.js';
import { migration0052 } from './0052_requires_filesystem.js';
import { migration0053 } from './0053_task_environments.js';
import { migration0054 } from './0054_ownership_generations.js';
import { migration0055 } from './0055_path_leases.js';
import { migration0056 } from './0056_bigint_counters.js';
import { migration0060 } from './0060_semaphores.js';
import { migration0070 } from './0070_message_delivery.js';
import { migration0071 } from './0071_idempotency_keys.js';
import { migration0072 } from './0072_gate_consumption.js';
import { migration0080 } from './0080_audit_events.js';
import { migration0090 } from './0090_work_lifecycle.js';
import { migration0095 } from './0095_path_lease_tokens.js';
import { migration0096 } from './0096_gate_expiry.js';
import { migration0097 } from './0097_trace_context.js';
import { migration0098 } from './0098_semaphore_limits.js';
import { migration0099 } from './0099_message_lease_index.js';
import { migration0100 } from './0100_unfinished_task_index.js';
import { migration0101 } from './0101_dispatch_functions.js';
import { migration0102 } from './0102_complete_and_next.js';
import { migration0103 } from './0103_batch_claim_json.js';
import { migration0104 } from './0104_dispatch_stable_plans.js';
import { migration0105 } from './0105_message_functions.js';
import { migration0106 } from './0106_path_grant_function.js';
import { migration0107 } from './0107_batch_busy_probe.js';
import { migration0108 } from './0108_inbox_dead_by_array.js';
import { migration0109 } from './0109_workspace_lock_claim_function.js';
import { migration0110 } from './0110_path_lease_grant_index.js';
import { migration0111 } from './0111_drop_path_lease_holder_index.js';
import { migration0112 } from './0112_functions_without_jit.js';
import type { MigrationDefinition } from './types.js';

/** The one ordered chain of schema versions. Gaps between versions are fine; order is by version. */
export const MIGRATIONS: readonly MigrationDefinition[] = Object.freeze([
  migration0005,
  migration0006,
  migration0007,
  migration0008,
  migration0052,
  migration0053,
  migration0054,
  migration0055,
  migration0056,
  migration0060,
  migration0070,
  migration0071,
  migration0072,
  migration0080,
  migration0090,
  migration0095,
  migration0096,
  migration0097,
  migration0098,
  migration0099,
  migration0100,
  migration0101,
  migration0102,
  migration0103,
  migration0104,
  migration0105,
  migration0106,
  migration0107,
  migration0108,
  migration0109,
  migration0110,
  migration0111,
  migration0112,
]);

/** The schema version this code expects. */
export const LATEST_VERSION = MIGRATIONS[MIGRATIONS.length - 1]!.version;

export type {
  BackfillBatch,
  BackfillContext,
  BackfillDefinition,
  ConcurrentStep,
  MigrationContext,
  MigrationDefinition,
} from './types.js';
