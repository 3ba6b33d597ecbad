import { sql } from 'kysely';
import type { StoreDialect } from '../dialects/types.js';
import type { SchemaDescription } from '../schema/describe.js';
import { check, type DoctorCheck } from './report.js';
import { errorMessage, inRolledBackWrite, oneRunningRunCheck, runProbe, scalar } from './probe-support.js';

const IN_MEMORY = new Set([':memory:', '']);

/**
 * The guarantee probes on SQLite: the connection's pragmas as they are in force, and a second
 * connection on the same file that must be refused the write lock while a write transaction holds it.
 */
export async function sqliteGuaranteeChecks(
  dialect: StoreDialect,
  filename: string,
  live: SchemaDescription,
): Promise<DoctorCheck[]> {
  const inMemory = IN_MEMORY.has(filename) || filename.startsWith('file::memory:');
  return [
    await runProbe('guarantee.wal', () => walCheck(dialect, inMemory)),
    await runProbe('guarantee.busy-timeout', () => busyTimeoutCheck(dialect)),
    await runProbe('guarantee.foreign-keys', () => foreignKeysCheck(dialect)),
    await runProbe('guarantee.durability', () => durabilityCheck(dialect, inMemory)),
    await runProbe('guarantee.begin-immediate', () => beginImmediateCheck(dialect, filename, inMemory)),
    await runProbe('guarantee.one-running-run', () => oneRunningRunCheck(dialect, live)),
  ];
}

export async function sqliteEnvironmentChecks(dialect: StoreDialect): Promise<DoctorCheck[]> {
  return [
    await runProbe('environment.server-version', async () => {
      const version = await scalar(dialect.db, sql<{ v: string }>`select sqlite_version() as v`);
      return check('environment.server-version', 'pass', `SQLite ${version}`);
    }),
  ];
}

/** Readers must not block the writer nor each other: the file must be in WAL mode. */
async function walCheck(dialect: StoreDialect, inMemory: boolean): Promise<DoctorCheck> {
  const mode = await scalar(dialect.db, sql<{ v: string }>`select journal_mode as v from pragma_journal_mode`);
  if (mode === 'wal') return check('guarantee.wal', 'pass', 'journal_mode is WAL');
  if (inMemory)
    return check(
      'guarantee.wal',
      'warn',
      `journal_mode is ${mode}: an in-memory database has no WAL (and only this connection sees it)`,
    );
  return check('guarantee.wal', 'fail', `journal_mode is ${mode}, not WAL: readers and the writer block each other`);
}

const SYNCHRONOUS = ['OFF', 'NORMAL', 'FULL', 'EXTRA'] as const;

/**
 * The durability in force (`PRAGMA synchronous`, the store's `durability` option): FULL (or EXTRA)
 * keeps every returned commit through power loss; NORMAL only through a process crash, so a
 * reboot can undo the last lease grants; OFF not even that.
 */
async function durabilityCheck(dialect: StoreDialect, inMemory: boolean): Promise<DoctorCheck> {
  const id = 'guarantee.durability';
  const level = await scalar(dialect.db, sql<{ v: number }>`select synchronous as v from pragma_synchronous`);
  const name = SYNCHRONOUS[level ?? -1] ?? String(level);
  if (inMemory) return check(id, 'warn', `synchronous is ${name}: an in-memory database does not survive its process`);
  if (name === 'FULL' || name === 'EXTRA')
    return check(id, 'pass', `synchronous is ${name} (durability 'full'): every returned commit survives power loss`);
  if (name === 'NORMAL')
    return check(
      id,
      'warn',
      "synchronous is NORMAL (durability 'normal'): commits survive a process crash, but power loss or an OS crash can undo the last ones, lease grants included (a fencing token could be handed out twice after a reboot)",
    );
  return check(id, 'fail', `synchronous is ${name}: a process or OS crash can lose or corrupt commits`);
}

/** A writer that meets the lock must wait for it (then retry) instead of failing at once. */
async function busyTimeoutCheck(dialect: StoreDialect): Promise<DoctorCheck> {
  const timeout = await scalar(dialect.db, sql<{ v: number }>`select timeout as v from pragma_busy_timeout`);
  if (!timeout || timeout <= 0)
    return check(
      'guarantee.busy-timeout',
      'fail',
      'busy_timeout is 0: a writer meeting the lock fails at once with SQLITE_BUSY',
    );
  return check('guarantee.busy-timeout', 'pass', `busy_timeout is ${timeout} ms`);
}

/** Cascades and references (a dispatch's task, a lease's workspace) are enforced only with foreign_keys on. */
async function foreignKeysCheck(dialect: StoreDialect): Promise<DoctorCheck> {
  const on = await scalar(dialect.db, sql<{ v: number }>`select foreign_keys as v from pragma_foreign_keys`);
  if (on !== 1)
    return check(
      'guarantee.foreign-keys',
      'fail',
      'foreign_keys is OFF on this connection: references and cascades are not enforced',
    );
  return check('guarantee.foreign-keys', 'pass', 'foreign_keys is ON');
}

/**
 * Every write transaction starts with `BEGIN IMMEDIATE`, which takes the file's write lock at
 * once: while the store holds one, a second connection on the file must be refused its own
 * `BEGIN IMMEDIATE` (SQLITE_BUSY with a zero timeout), and must get it once the store's ends.
 */
async function beginImmediateCheck(dialect: StoreDialect, filename: string, inMemory: boolean): Promise<DoctorCheck> {
  if (inMemory) {
    return check(
      'guarantee.begin-immediate',
      'warn',
      'not probed: an in-memory database cannot be opened by a second connection (nor by a second process)',
    );
  }
  // Loaded here, not at the top: a PostgreSQL-only install has no better-sqlite3 (and never gets here).
  const { default: Database } = await import('better-sqlite3');
  const other = new Database(filename, { timeout: 0, fileMustExist: true });
  const tryBegin = (): string => {
    try {
      other.exec('begin immediate');
      other.exec('rollback');
      return 'locked';
    } catch (error) {
      const code = (error as { code?: string }).code ?? '';
      return code.startsWith('SQLITE_BUSY') ? 'busy' : errorMessage(error);
    }
  };
  try {
    let whileHeld = '';
    await inRolledBackWrite(dialect, async () => {
      whileHeld = tryBegin();
    });
    if (whileHeld === 'locked') {
      return check(
        'guarantee.begin-immediate',
        'fail',
        "a second connection took the write lock while a write transaction held it: write transactions don't begin IMMEDIATE",
      );
    }
    if (whileHeld !== 'busy')
      return check('guarantee.begin-immediate', 'fail', `the second connection failed unexpectedly: ${whileHeld}`);
    const afterwards = tryBegin();
    if (afterwards !== 'locked')
      return check(
        'guarantee.begin-immediate',
        'fail',
        `the write lock was not released when the write transaction ended (${afterwards})`,
      );
    return check(
      'guarantee.begin-immediate',
      'pass',
      'a second connection was refused BEGIN IMMEDIATE while a write transaction held the lock',
    );
  } finally {
    other.close();
  }
}
