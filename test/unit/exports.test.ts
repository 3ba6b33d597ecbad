/**
 * The package's runtime surface, pinned: every name `src/index.ts` exports at run time, and the
 * same for the built `dist/index.js`. A name added or removed by accident (an `export *`, a
 * helper made public) fails here; a deliberate change updates `PUBLIC_EXPORTS` and the README.
 */
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { beforeAll, describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const DIST = fileURLToPath(new URL('../../dist/index.js', import.meta.url));

/** The runtime exports of the package root, sorted. */
const PUBLIC_EXPORTS = [
  'AlreadyExistsError',
  'BaselineMismatchError',
  'BaselineRequiredError',
  'CleanupAlreadyCompletedError',
  'CleanupBarrierError',
  'CleanupClaimLostError',
  'CleanupInProgressError',
  'CommitOutcomeUnknownError',
  'CoordinatorHandleTakenError',
  'CoordinatorRunConflictError',
  'CoordinatorRunNotRunningError',
  'DEFAULT_CLEANUP_CLAIM_TTL_MS',
  'DEFAULT_DELIVERY_LIMIT',
  'DEFAULT_DISPATCH_LEASE_TTL_MS',
  'DEFAULT_DISPATCH_TTL_MS',
  'DEFAULT_PATH_LEASE_TTL_MS',
  'DEFAULT_SEMAPHORE_TTL_MS',
  'DEFAULT_TASK_LEASE_TTL_MS',
  'DEFAULT_VISIBILITY_MS',
  'DEFAULT_WORKSPACE_LOCK_TTL_MS',
  'DISPATCH_FAILURE_LIMIT',
  'DISPATCH_TRANSITIONS',
  'DataLossError',
  'DatabaseFaultError',
  'DatabaseUnavailableError',
  'DispatchAlreadyActiveError',
  'DispatchLeaseLostError',
  'DispatchNotActiveError',
  'DispatchRunMismatchError',
  'DriverNotInstalledError',
  'FILESYSTEM_ROLE_PATTERN',
  'ForeignTransactionError',
  'GateAlreadyResolvedError',
  'GateNotResolvedError',
  'GateOpenError',
  'IDEMPOTENCY_WINDOW_MS',
  'INITIAL_TASK_STATUSES',
  'IN_FLIGHT_STATUSES',
  'IdempotencyKeyConflictError',
  'InvalidArgumentError',
  'InvalidDatabaseUrlError',
  'InvalidWritePathError',
  'LATEST_VERSION',
  'LEASE_EXPIRED',
  'LeaseLostError',
  'LeaseWaitTimeoutError',
  'LockTimeoutError',
  'MAX_DELIVERY_LIMIT',
  'MAX_DEPENDENCIES',
  'MAX_DURATION_MS',
  'MAX_ID_LENGTH',
  'MAX_MESSAGE_BATCH',
  'MAX_PAYLOAD_LENGTH',
  'MAX_PENDING_CLEANUPS_LIMIT',
  'MAX_RENEW_BATCH',
  'MAX_SEMAPHORE_LIMIT',
  'MAX_TASK_BATCH',
  'MAX_TEXT_LENGTH',
  'MAX_WRITE_PATHS',
  'MAX_WRITE_PATH_BYTES',
  'MIGRATIONS',
  'MigrationChecksumMismatchError',
  'MigrationFailedError',
  'MigrationHistoryDamagedError',
  'MigrationLockTimeoutError',
  'Migrator',
  'NotFoundError',
  'OwnershipChangedError',
  'PATH_CONFLICT_REPORT_LIMIT',
  'ParentChangedError',
  'PathClaimRefusedError',
  'PathLeaseLostError',
  'PathLeaseTimeoutError',
  'PermissionDeniedError',
  'ReadOnlyError',
  'ReleaseOutsideWindowError',
  'ReleaseStillRunningError',
  'ResolutionAlreadyConsumedError',
  'SEMAPHORE_HOLDER_REPORT_LIMIT',
  'SchemaOutOfDateError',
  'SemaphoreLeaseLostError',
  'SemaphoreTimeoutError',
  'StaleOwnershipError',
  'StaleTaskLeaseError',
  'StaleWorkspaceLockError',
  'StatementTimeoutError',
  'StorageFullError',
  'TASKFENCE_CHANNELS',
  'TASKFENCE_RELEASE',
  'TASK_STATUSES',
  'TASK_TRANSITIONS',
  'TaskDependencyRefusedError',
  'TaskNotDispatchableError',
  'TaskTransitionRefusedError',
  'TaskfenceError',
  'TerminalBusyError',
  'TransactionAbortedError',
  'TransactionEndedError',
  'TransactionReentryError',
  'UnknownMigrationsError',
  'UnknownRecipientError',
  'UnknownVersionError',
  'UnresolvedTargetError',
  'WHOLE_WORKSPACE_KEY',
  'WORKTREE_TARGET_PREFIX',
  'WorkspaceConfigurationError',
  'WorkspaceUnresolvedError',
  'WriteTimeoutError',
  'coordinatorRunLease',
  'decideLockMode',
  'defaultDatabaseUrl',
  'describeSchema',
  'formatDoctorReport',
  'formatDoctorReportJson',
  'keysOverlap',
  'leaseKeys',
  'normalizeWritePath',
  'openStore',
  'parseDatabaseUrl',
  'redactDatabaseUrl',
  'resolveOrchestrationTargetKey',
  'resolveOrchestrationTargetKeyAsync',
  'roleImpliesFilesystem',
  'runDoctor',
  'writeSetsConflict',
];

const runtimeNames = (module: object) => Object.keys(module).sort();

describe('public API', () => {
  beforeAll(() => {
    if (existsSync(DIST)) return;
    try {
      execFileSync(
        process.execPath,
        [createRequire(import.meta.url).resolve('typescript/bin/tsc'), '-p', 'tsconfig.build.json'],
        {
          cwd: ROOT,
          stdio: 'pipe',
        },
      );
    } catch (error) {
      const output = (error as { stdout?: Buffer; stderr?: Buffer }).stdout?.toString() ?? '';
      throw new Error(
        `dist/index.js is missing and \`tsc -p tsconfig.build.json\` failed; run \`npm run build\`:\n${output}`,
      );
    }
    if (!existsSync(DIST)) throw new Error('dist/index.js is still missing after `tsc -p tsconfig.build.json`');
  });

  it('src/index.ts exports exactly the public names at run time', async () => {
    expect(runtimeNames(await import('../../src/index.js'))).toEqual(PUBLIC_EXPORTS);
  });

  it('the built dist/index.js exports the same names (a stale dist fails: run `npm run build`)', async () => {
    expect(runtimeNames((await import(pathToFileURL(DIST).href)) as object)).toEqual(PUBLIC_EXPORTS);
  });

  it('the list is sorted and has no duplicates', () => {
    expect([...new Set(PUBLIC_EXPORTS)].sort()).toEqual(PUBLIC_EXPORTS);
  });

  it('the error families the README names group exactly the exported classes it lists', async () => {
    const root = (await import('../../src/index.js')) as unknown as Record<string, unknown>;
    const membersOf = (base: string) =>
      Object.entries(root)
        .filter(([, value]) => typeof value === 'function' && value.prototype instanceof (root[base] as never))
        .map(([name]) => name)
        .sort();
    expect(membersOf('DatabaseFaultError')).toEqual([
      'CommitOutcomeUnknownError',
      'DatabaseUnavailableError',
      'LockTimeoutError',
      'PermissionDeniedError',
      'ReadOnlyError',
      'StatementTimeoutError',
      'StorageFullError',
    ]);
    expect(membersOf('LeaseWaitTimeoutError')).toEqual(['PathLeaseTimeoutError', 'SemaphoreTimeoutError']);
  });
});
