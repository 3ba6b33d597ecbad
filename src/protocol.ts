/**
 * The strings two taskfence processes must agree on to work together, in one place: the
 * advisory-lock keys and the wake-up topics. Both are part of the deployed protocol: two
 * processes of different versions serialize only if they build the same key, and wake each other
 * only if they announce and listen on the same topic, so the values below never change. This file
 * imports nothing, so every layer can build from it: the dialects (the migration key, the
 * channel), the repositories, the doctor and the benchmarks.
 *
 * Lock keys. A key is a string; `StoreDialect.lockKey` turns it into a transaction-scoped lock
 * (PostgreSQL: `pg_advisory_xact_lock(hashtextextended(<schema>:<key>, 0))`, prefixed with the
 * configured schema when there is one (`schemaLockKey`); SQLite: a no-op, because `BEGIN
 * IMMEDIATE` already serializes every writer). New keys take the `taskfence:` prefix; the older
 * `ownership:` and `paths:` namespaces keep theirs.
 *
 * Lock order. A transaction takes keys in the order of this list, never back up it:
 *
 *   1. resource:<name>            host `tx.lockResources`, before any other taskfence call
 *                                 in the transaction (sorted, duplicates dropped)
 *   2. run-target:<target>        starting / stopping a run; creating a task (its target's run)
 *   3. ownership:barrier:<task>   the cleanup barrier: admission, detachment, transfers to a
 *                                 task, creating a resource or a subtask for it (sorted by id)
 *   4. ownership:snapshot:<id>    claim / renew / complete / fail / release of a cleanup snapshot
 *   5. ownership:group:<id>, then ownership:environment:<id>
 *                                 every writer of that resource row (environments by id)
 *   6. dispatch-terminal:<handle>, then dispatch-task:<task>
 *                                 exit reports of one terminal; dispatches of one task
 *   7. paths:<workspace>          path-lease conflict check and insert of one workspace, and
 *                                 claiming its workspace lock (the whole-workspace key)
 *   8. taskfence:semaphore:<name> counting and granting the slots of one semaphore
 *
 * Why this is deadlock-free: every transaction that holds two keys took them in list order, and
 * keys of one level are taken in sorted order (or one at a time), so no two transactions can
 * each wait for a key the other holds. The one place that takes a level-3 key after another
 * level-3 key out of sorted order is `detachSubtask`: it holds the task's and parent's barriers
 * (sorted) and then takes the group steward's, which it only learns after reading the group. A
 * cycle there (two detachments whose tasks and stewards cross) is broken by PostgreSQL's deadlock
 * detector, and a deadlock is a retryable error: the losing transaction is rolled back and run
 * again as a whole within the write deadline (`writeTransaction`), so the caller sees no error.
 *
 * Outside the list, never held together with any key above:
 *   - migrate:<schema>  the migration lock (one per schema; the migrator's own transaction),
 *   - doctor:<probe>    `taskfence doctor`'s advisory-lock probe (a rolled-back transaction).
 */

/** The prefix of every key taskfence introduced after 0.1; the older namespaces keep theirs. */
export const LOCK_KEY_PREFIX = 'taskfence:';

/** 1. A host resource name (`tx.lockResources`). */
export const resourceLockKey = (name: string): string => `${LOCK_KEY_PREFIX}resource:${name}`;

/**
 * 2. The orchestration target's run slot (`null` targets share the empty key): run start and task
 * creation take it, so a task created while a run starts is either stamped with that run or
 * adopted by it.
 */
export const runTargetLockKey = (targetKey: string | null): string => `${LOCK_KEY_PREFIX}run-target:${targetKey ?? ''}`;

/** 3. A task's cleanup barrier. */
export const barrierLockKey = (taskId: string): string => `ownership:barrier:${taskId}`;

/** 4. A cleanup snapshot. */
export const snapshotLockKey = (snapshotId: string): string => `ownership:snapshot:${snapshotId}`;

/** 5. An owned resource row: a task environment or a workspace group. */
export const ownedResourceLockKey = (kind: 'environment' | 'group', id: string): string => `ownership:${kind}:${id}`;

/** 6a. The exit reports of one worker terminal. */
export const dispatchTerminalLockKey = (terminalHandle: string): string =>
  `${LOCK_KEY_PREFIX}dispatch-terminal:${terminalHandle}`;

/** 6b. The dispatches of one task. */
export const dispatchTaskLockKey = (taskId: string): string => `${LOCK_KEY_PREFIX}dispatch-task:${taskId}`;

/** 7. The path leases of one workspace. */
export const pathsLockKey = (workspaceId: string): string => `paths:${workspaceId}`;

/** 8. The slots of one counting semaphore. */
export const semaphoreLockKey = (name: string): string => `${LOCK_KEY_PREFIX}semaphore:${name}`;

/**
 * The migration lock's key text; the PostgreSQL dialect hashes `MIGRATION_LOCK_PREFIX || schema`
 * (the current schema when none is configured), so two schemas in one database migrate independently.
 */
export const MIGRATION_LOCK_PREFIX = `${LOCK_KEY_PREFIX}migrate:`;

/** The migration lock's key for a named schema. */
export const migrationLockKey = (schema: string): string => `${MIGRATION_LOCK_PREFIX}${schema}`;

/** The key `taskfence doctor` probes advisory locks with. */
export const doctorProbeLockKey = (probe: string): string => `${LOCK_KEY_PREFIX}doctor:${probe}`;

/**
 * The key PostgreSQL hashes for `key` in an install confined to `schema` (none: the key as is),
 * so two installs in one database never contend.
 */
export const schemaLockKey = (schema: string | undefined, key: string): string =>
  schema === undefined ? key : `${schema}:${key}`;

/*
 * Wake-up topics. A writer announces a topic when its transaction commits, and waiters on it
 * re-check at once (`Wakeups`, src/dialects/wakeups.ts). PostgreSQL carries them as the payload
 * of one NOTIFY channel, prefixed with the configured schema (`schemaTopic`).
 */

/** The one PostgreSQL NOTIFY channel every wake-up travels on. */
export const WAKE_CHANNEL = 'taskfence_wake';

/** The wake-up topic of a workspace's path leases: announced when leases in it are released. */
export const pathsTopic = (workspaceId: string): string => `paths:${workspaceId}`;

/** The wake-up topic of a semaphore: announced when one of its slots is released. */
export const semaphoreTopic = (name: string): string => `semaphore:${name}`;

/** The wake-up topic of an inbox: announced when a message to it commits. */
export const inboxTopic = (handle: string): string => `inbox:${handle}`;

/** The NOTIFY payload of `topic` in an install confined to `schema` (none: the topic as is). */
export const schemaTopic = (schema: string | undefined, topic: string): string =>
  schema === undefined ? topic : `${schema}/${topic}`;
