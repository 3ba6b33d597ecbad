import { sql, type Kysely } from 'kysely';
import type { StoreDialect } from '../dialects/types.js';
import type { Database } from '../schema/database.js';
import type { SchemaDescription } from '../schema/describe.js';
import { PROBE_TABLE_PREFIX } from './drift.js';
import { check, type DoctorCheck } from './report.js';
import {
  inRolledBackWrite,
  NoSecondConnectionError,
  onSecondConnection,
  oneRunningRunCheck,
  probeName,
  IN_RECOVERY,
  runProbe,
  scalar,
  schemaNotCreated,
  taskfenceSchema,
} from './probe-support.js';
import { doctorProbeLockKey } from '../protocol.js';
import { replicationCheck } from './replication.js';

export interface PostgresProbeOptions {
  /** How long to wait for the pool's second connection (default 5 000 ms). */
  readonly connectionWaitMs: number;
  /** Warn when the server's clock and this host's differ by more than this (default 1 000 ms). */
  readonly clockSkewWarnMs: number;
}

/** Strings sorted by `COLLATE "C"` must come back in byte order: upper before lower, `-` before `/`, ASCII before UTF-8. */
const COLLATION_SAMPLE = ['a/b', 'B', 'a-b', 'é', 'a', '_', 'Z', 'a0', 'A', 'ä'];

/**
 * The guarantee probes on PostgreSQL. Each runs on the live database, inside a rolled-back
 * transaction or on an object it drops again, with two connections from the store's own pool
 * where a probe needs a second session.
 */
export async function postgresGuaranteeChecks(
  dialect: StoreDialect,
  live: SchemaDescription,
  options: PostgresProbeOptions,
): Promise<DoctorCheck[]> {
  const db = dialect.db;
  return [
    await runProbe('guarantee.advisory-lock', () => advisoryLockCheck(dialect, options)),
    await runProbe('guarantee.read-committed', () => readCommittedCheck(dialect, options)),
    await runProbe('guarantee.transactional-ddl', () => transactionalDdlCheck(dialect)),
    await runProbe('guarantee.bytewise-collation', () => bytewiseCollationCheck(db, live)),
    await runProbe('guarantee.one-running-run', () => oneRunningRunCheck(dialect, live)),
  ];
}

export async function postgresEnvironmentChecks(
  dialect: StoreDialect,
  options: PostgresProbeOptions,
): Promise<DoctorCheck[]> {
  const db = dialect.db;
  return [
    await runProbe('environment.recovery', () => recoveryCheck(db)),
    await runProbe('environment.pooler', () => poolerCheck(db, options)),
    await runProbe('environment.server-version', () => serverVersionCheck(db)),
    await runProbe('environment.clock-skew', () => clockSkewCheck(db, options.clockSkewWarnMs)),
    await runProbe('environment.replication', () => replicationCheck(db)),
  ];
}

/** An advisory lock as `pg_locks` names it: one bigint key (objsubid 1) or two int4 keys (objsubid 2). */
interface AdvisoryLock {
  readonly classid: number;
  readonly objid: number;
  readonly objsubid: number;
}

const lockId = (l: AdvisoryLock) => `${l.classid}:${l.objid}:${l.objsubid}`;

async function advisoryLocksHeld(conn: Kysely<Database>): Promise<AdvisoryLock[]> {
  const { rows } = await sql<AdvisoryLock>`
    select classid::text::bigint as classid, objid::text::bigint as objid, objsubid::int as objsubid
    from pg_locks where locktype = 'advisory' and pid = pg_backend_pid() and granted`.execute(conn);
  return rows.map((r) => ({ classid: Number(r.classid), objid: Number(r.objid), objsubid: Number(r.objsubid) }));
}

/** `pg_try_advisory_xact_lock` on exactly the lock `pg_locks` listed. */
function tryLockSql(lock: AdvisoryLock) {
  return lock.objsubid === 2
    ? sql<{
        v: boolean;
      }>`select pg_try_advisory_xact_lock(${lock.classid}::bigint::int, ${lock.objid}::bigint::int) as v`
    : sql<{
        v: boolean;
      }>`select pg_try_advisory_xact_lock((${lock.classid}::bigint << 32) | ${lock.objid}::bigint) as v`;
}

/**
 * Connection A takes the transaction-scoped lock the repositories take (`dialect.lockKey`, inside
 * `writeTransaction`); `pg_locks` must then list a new advisory lock for A, and connection B's
 * `pg_try_advisory_xact_lock` on exactly that lock must fail. An engine (or a dialect) whose
 * advisory locks are no-ops that report success is caught here. After A ends, B must get the
 * lock: it was scoped to A's transaction.
 */
async function advisoryLockCheck(dialect: StoreDialect, options: PostgresProbeOptions): Promise<DoctorCheck> {
  const key = doctorProbeLockKey(probeName());
  let taken: AdvisoryLock[] = [];
  let takenByOther: AdvisoryLock[] = [];
  let holderPid: number | undefined;
  await inRolledBackWrite(dialect, async (trx) => {
    holderPid = await scalar(trx, sql<{ v: number }>`select pg_backend_pid() as v`);
    const before = new Set((await advisoryLocksHeld(trx)).map(lockId));
    await dialect.lockKey(trx, key);
    taken = (await advisoryLocksHeld(trx)).filter((l) => !before.has(lockId(l)));
    if (taken.length === 0) return;
    takenByOther = await onSecondConnection(dialect.db, options.connectionWaitMs, async (b) => {
      const got: AdvisoryLock[] = [];
      for (const lock of taken) if ((await scalar(b, tryLockSql(lock))) !== false) got.push(lock);
      return got;
    });
  });
  if (taken.length === 0) {
    return check(
      'guarantee.advisory-lock',
      'fail',
      "a write transaction's lock took no advisory lock (none appeared in pg_locks): locks are no-ops here, and every serialization built on them is void",
    );
  }
  if (takenByOther.length > 0) {
    return check(
      'guarantee.advisory-lock',
      'fail',
      'a second connection took the advisory lock a write transaction held: locks do not exclude here, and every serialization built on them is void',
    );
  }
  // From another session than A's (the pool may hand A's connection out again, and a session lock
  // would let its own session in).
  const released = await dialect.db.connection().execute(async (c) => {
    const tryAll = async (conn: Kysely<Database>) => {
      for (const lock of taken) if ((await scalar(conn, tryLockSql(lock))) !== true) return false;
      return true;
    };
    const pid = await scalar(c, sql<{ v: number }>`select pg_backend_pid() as v`);
    return pid !== holderPid ? tryAll(c) : onSecondConnection(dialect.db, options.connectionWaitMs, tryAll);
  });
  if (!released) {
    return check(
      'guarantee.advisory-lock',
      'fail',
      'the advisory lock was still held after its transaction ended: it is not transaction-scoped',
    );
  }
  return check(
    'guarantee.advisory-lock',
    'pass',
    'a transaction-scoped advisory lock excluded a second connection and was released at rollback',
  );
}

/**
 * Write transactions must run at READ COMMITTED where each statement sees rows committed after
 * the transaction began (the repositories' conditional updates rely on it). A snapshot taken at
 * the first statement and kept ("READ COMMITTED" implemented as snapshot isolation, or a write
 * path that names no level on a REPEATABLE READ default) fails here: B commits a row into a scratch
 * table between two of A's reads, and A's second read must see it. The scratch table is dropped at
 * the end. The server's `default_transaction_isolation` is reported as information (a warning when
 * it is not READ COMMITTED): only a host transaction joined by `store.withTransaction` runs at it.
 */
async function readCommittedCheck(dialect: StoreDialect, options: PostgresProbeOptions): Promise<DoctorCheck> {
  const db = dialect.db;
  const notCreated = await schemaNotCreated(db, 'guarantee.read-committed');
  if (notCreated) return notCreated;
  const table = sql.table(`${await taskfenceSchema(db)}.${PROBE_TABLE_PREFIX}${probeName()}`);
  const problems: string[] = [];
  await sql`create table ${table} (x integer)`.execute(db);
  try {
    let level: string | undefined;
    let before: number | undefined;
    let after: number | undefined;
    await inRolledBackWrite(dialect, async (trx) => {
      level = await scalar(trx, sql<{ v: string }>`select current_setting('transaction_isolation') as v`);
      before = await scalar(trx, sql<{ v: number }>`select count(*)::int as v from ${table}`);
      await onSecondConnection(db, options.connectionWaitMs, (b) => sql`insert into ${table} values (1)`.execute(b));
      after = await scalar(trx, sql<{ v: number }>`select count(*)::int as v from ${table}`);
    });
    if (level !== 'read committed')
      problems.push(`write transactions run at ${String(level).toUpperCase()}, not READ COMMITTED`);
    if (before !== 0 || after !== 1) {
      problems.push(
        'a statement did not see a row committed after its transaction began: snapshot isolation is posing as READ COMMITTED',
      );
    }
  } finally {
    await sql`drop table if exists ${table}`.execute(db);
  }
  const defaultLevel = await scalar(
    db,
    sql<{ v: string }>`select current_setting('default_transaction_isolation') as v`,
  );
  if (problems.length > 0)
    return check('guarantee.read-committed', 'fail', problems.join('; '), problems.length > 1 ? problems : undefined);
  const proven = 'READ COMMITTED: a statement saw a row another connection committed after its transaction began';
  // Information, not a fault: taskfence's own transactions state their level in their BEGIN. Only
  // a host transaction that names no level runs at the default, and joining one refuses it.
  if (defaultLevel !== 'read committed') {
    return check(
      'guarantee.read-committed',
      'warn',
      `${proven}; default_transaction_isolation is '${defaultLevel}': taskfence's own transactions state READ COMMITTED, ` +
        `but a host transaction passed to store.withTransaction runs at the host's level and is refused ` +
        `(FOREIGN_TRANSACTION) unless it is opened READ COMMITTED`,
    );
  }
  return check('guarantee.read-committed', 'pass', proven);
}

/** DDL must roll back with its transaction (migrations rely on it): a table created in a rolled-back transaction must not exist afterwards. */
async function transactionalDdlCheck(dialect: StoreDialect): Promise<DoctorCheck> {
  const notCreated = await schemaNotCreated(dialect.db, 'guarantee.transactional-ddl');
  if (notCreated) return notCreated;
  const schema = await taskfenceSchema(dialect.db);
  const name = `${PROBE_TABLE_PREFIX}${probeName()}`;
  const table = sql.table(`${schema}.${name}`);
  const lookup = sql<{
    v: string | null;
  }>`select to_regclass(quote_ident(${schema}) || '.' || quote_ident(${name}))::text as v`;
  let visibleInside: string | null | undefined;
  try {
    await inRolledBackWrite(dialect, async (trx) => {
      await sql`create table ${table} (x integer)`.execute(trx);
      visibleInside = await scalar(trx, lookup);
    });
    const after = await scalar(dialect.db, lookup);
    if (!visibleInside)
      return check('guarantee.transactional-ddl', 'fail', 'a table created in a transaction was not visible inside it');
    if (after)
      return check(
        'guarantee.transactional-ddl',
        'fail',
        'a table created in a rolled-back transaction still exists: DDL is not transactional',
      );
    return check(
      'guarantee.transactional-ddl',
      'pass',
      'a table created in a rolled-back transaction was gone afterwards',
    );
  } finally {
    await sql`drop table if exists ${table}`.execute(dialect.db);
  }
}

function byteOrder(values: readonly string[]): string[] {
  return [...values].sort((a, b) => Buffer.compare(Buffer.from(a, 'utf8'), Buffer.from(b, 'utf8')));
}

/**
 * Path-lease keys are compared byte by byte (`COLLATE "C"`): the conflict check finds descendants
 * by one key range. `ORDER BY … COLLATE "C"` must sort sample strings in UTF-8 byte order, and
 * `path_leases.lease_key` must be declared with that collation.
 */
async function bytewiseCollationCheck(db: Kysely<Database>, live: SchemaDescription): Promise<DoctorCheck> {
  const values = sql.join(COLLATION_SAMPLE.map((v) => sql`(${v}::text)`));
  const { rows } = await sql<{ s: string }>`select s from (values ${values}) as v(s) order by s collate "C"`.execute(
    db,
  );
  const got = rows.map((r) => r.s);
  const want = byteOrder(COLLATION_SAMPLE);
  if (got.join('\u0000') !== want.join('\u0000')) {
    return check(
      'guarantee.bytewise-collation',
      'fail',
      `COLLATE "C" does not order bytewise: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`,
    );
  }
  if (!live.tables.path_leases)
    return check('guarantee.bytewise-collation', 'pass', 'COLLATE "C" orders bytewise (no path_leases table yet)');
  const collation = await scalar(
    db,
    sql<{ v: string | null }>`select collation_name as v from information_schema.columns
      where table_schema = ${await taskfenceSchema(db)} and table_name = 'path_leases' and column_name = 'lease_key'`,
  );
  if (collation !== 'C' && collation !== 'POSIX') {
    return check(
      'guarantee.bytewise-collation',
      'fail',
      `path_leases.lease_key has collation ${collation ?? 'default'}, not "C": lease conflict ranges would miss descendants`,
    );
  }
  return check('guarantee.bytewise-collation', 'pass', 'COLLATE "C" orders bytewise and path_leases.lease_key uses it');
}

/**
 * A transaction-mode pooler (PgBouncer, Supavisor, RDS Proxy …) hands each transaction whichever
 * server connection is free: session state does not stay with a client. Probed on one checked-out
 * client A and a second one B: after A's `SET`, A's later statements must keep its backend and the
 * setting, and B, another client, must run on another backend and not see A's setting (a pooler
 * that reuses the last server connection gives B A's backend). taskfence's guarantees rest on no
 * session state (SPEC §8), so a pooler is reported as a warning: what else runs on these
 * connections must not rely on session state either.
 */
async function poolerCheck(db: Kysely<Database>, options: PostgresProbeOptions): Promise<DoctorCheck> {
  const nonce = probeName();
  const read = async (conn: Kysely<Database>) =>
    (
      await sql<{ pid: number; setting: string | null }>`
        select pg_backend_pid() as pid, current_setting('taskfence.doctor_probe', true) as setting`.execute(conn)
    ).rows[0]!;
  return db.connection().execute(async (a) => {
    await sql`select set_config('taskfence.doctor_probe', ${nonce}, false)`.execute(a);
    const first = await read(a);
    let other: { pid: number; setting: string | null } | undefined;
    try {
      other = await onSecondConnection(db, options.connectionWaitMs, read);
    } catch (error) {
      if (!(error instanceof NoSecondConnectionError)) throw error;
    }
    const later = [await read(a), await read(a)];
    // Through a pooler this may land on another server connection; the placeholder setting is harmless there.
    await sql`select set_config('taskfence.doctor_probe', '', false)`.execute(a);
    const seen = [first, ...later];
    const pids = [...new Set(seen.map((s) => s.pid))];
    const signs: string[] = [];
    if (pids.length > 1) signs.push(`one client's statements ran on backends ${pids.join(', ')}`);
    if (seen.some((s) => s.setting !== nonce)) signs.push("a session setting was gone by the client's next statement");
    if (other && other.pid === first.pid)
      signs.push(`a second client ran on the first one's backend (pid ${other.pid})`);
    if (other && other.setting === nonce) signs.push("a second client saw the first one's session setting");
    if (signs.length > 0) {
      return check(
        'environment.pooler',
        'warn',
        `a transaction-mode pooler sits in the path (${signs.join('; ')}): taskfence relies on no session state, and nothing else on these connections may; wake-ups poll every wakeFallbackMs unless listenUrl names a direct connection`,
      );
    }
    const scope = other ? `a second client ran on backend ${other.pid}` : 'no second client to compare with';
    return check(
      'environment.pooler',
      'pass',
      `no pooler seen: session state stays with its client (backend ${first.pid}; ${scope})`,
    );
  });
}

async function serverVersionCheck(db: Kysely<Database>): Promise<DoctorCheck> {
  const row = (
    await sql<{
      version: string;
      num: string;
    }>`select version() as version, current_setting('server_version_num') as num`.execute(db)
  ).rows[0];
  const version = row?.version ?? 'unknown';
  const num = Number(row?.num ?? 0);
  const short = version.split(' on ')[0] ?? version;
  if (/cockroach|yugabyte|-YB-/i.test(version)) {
    return check(
      'environment.server-version',
      'warn',
      `${short}: a PostgreSQL-compatible engine; trust it only as far as the guarantee checks above pass`,
    );
  }
  if (num < 130000)
    return check(
      'environment.server-version',
      'warn',
      `${short}: older than PostgreSQL 13, which taskfence is not tested on`,
    );
  return check('environment.server-version', 'pass', short);
}

/**
 * Leases and heartbeats are judged on the server's clock (SPEC §8), so skew does not break them;
 * it does make host-side timestamps (logs, a store given its own `clock`) disagree with the database's.
 */
async function clockSkewCheck(db: Kysely<Database>, warnMs: number): Promise<DoctorCheck> {
  const sent = Date.now();
  const server = await scalar(
    db,
    sql<{ v: number }>`select (extract(epoch from clock_timestamp()) * 1000)::float8 as v`,
  );
  const received = Date.now();
  const skew = Math.round(Number(server) - (sent + received) / 2);
  const uncertainty = Math.ceil((received - sent) / 2);
  const text = `server clock ${skew >= 0 ? 'ahead of' : 'behind'} this host by ${Math.abs(skew)} ms (±${uncertainty} ms)`;
  if (Math.abs(skew) - uncertainty > warnMs)
    return check('environment.clock-skew', 'warn', `${text}; above ${warnMs} ms`);
  return check('environment.clock-skew', 'pass', text);
}

/**
 * Whether the server takes writes: a hot standby (in recovery) or `default_transaction_read_only`
 * fails every taskfence write with READ_ONLY, whatever the other probes say.
 */
async function recoveryCheck(db: Kysely<Database>): Promise<DoctorCheck> {
  const id = 'environment.recovery';
  const row = (
    await sql<{
      recovery: boolean;
      read_only: string;
    }>`select pg_is_in_recovery() as recovery, current_setting('default_transaction_read_only') as read_only`.execute(
      db,
    )
  ).rows[0];
  if (row?.recovery) return check(id, 'warn', `in recovery: ${IN_RECOVERY}`);
  if (row?.read_only === 'on')
    return check(id, 'warn', 'default_transaction_read_only is on: writes will fail with READ_ONLY');
  return check(id, 'pass', 'not in recovery, and transactions default to read-write');
}
