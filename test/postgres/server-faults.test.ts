/**
 * Faults a PostgreSQL server configured by a DBA injects, each on a random database of this file's
 * own (ALTER DATABASE, never the server): a read-only database, the idle-in-transaction killer
 * (25P03), the idle-session killer (57P05), and a role that may not read the migration history.
 *
 * Some tests stall this process (`stall`: the event loop blocked, as by a CPU-bound host or a long
 * GC pause) past idle_session_timeout. The server ends every idle pooled connection meanwhile, and
 * the client reads the server's goodbye only after its next statement went out on that
 * connection: the race that pauses of `setTimeout` only hit now and then, every time.
 */
import { afterAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import {
  DatabaseUnavailableError,
  ReadOnlyError,
  type Store,
  type StoreOptions,
  type TaskfenceEvent,
} from '../../src/index.js';
import { postgresFixture } from '../support/dialects.js';

const fx = postgresFixture();
afterAll(() => fx.cleanup());

async function admin<T>(url: string, fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url.replace(/\?.*$/, '') });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

/** A migrated database with `settings` set on it (`ALTER DATABASE … SET`), and a store opened after. */
async function storeWith(settings: Record<string, string>, options: Omit<StoreOptions, 'url'> = {}): Promise<Store> {
  const url = await fx.freshUrl();
  await (await fx.open(url)).migrate();
  await admin(url, async (c) => {
    for (const [name, value] of Object.entries(settings)) {
      await c.query(`alter database ${new URL(url).pathname.slice(1)} set ${name} = '${value}'`);
    }
  });
  return fx.open(url, options);
}

/** Polls until the backend `pid` is gone (the server ended it); not a timed assertion. */
async function waitUntilEnded(url: string, pid: number): Promise<void> {
  await admin(url, async (c) => {
    for (let i = 0; i < 3000; i++) {
      const { rows } = await c.query('select 1 from pg_stat_activity where pid = $1', [pid]);
      if (rows.length === 0) return;
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    throw new Error(`backend ${pid} was never ended`);
  });
}

/** Blocks the event loop for `ms`: no I/O is read meanwhile, so the pool cannot notice a connection's end. */
function stall(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

/**
 * Three calls at once, until all three succeed, so the store's pool (poolSize 3) holds three live
 * idle connections after. A call that took a connection the server ended unnoticed (its goodbye
 * read late on a loaded machine) fails typed; the round is simply repeated.
 */
async function fillPool(store: Store): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    await new Promise((resolve) => setTimeout(resolve, 50));
    const calls = await Promise.allSettled([0, 1, 2].map(() => store.org.getWorkspace('none')));
    const failed = calls.filter((c): c is PromiseRejectedResult => c.status === 'rejected').map((c) => c.reason);
    if (failed.length === 0) return;
    if (attempt === 20 || failed.some((e) => !(e instanceof DatabaseUnavailableError))) throw failed[0];
  }
}

/** The typed error a call gets when idle_session_timeout ended its connection. */
const ENDED_BY_IDLE_SESSION_TIMEOUT = {
  code: 'DATABASE_UNAVAILABLE',
  driverCode: '57P05',
  serverTimeout: 'idle_session_timeout',
  retrySafe: true,
};

const backendPid = async (db: Store['db']) =>
  (await db.selectNoFrom((eb) => eb.fn<number>('pg_backend_pid', []).as('pid')).execute())[0]!.pid;

describe('a read-only database (default_transaction_read_only)', () => {
  it('every write is READ_ONLY naming the server, not in recovery, retry-safe; reads still work', async () => {
    const store = await storeWith({ default_transaction_read_only: 'on' });
    const error = await store.org.createCompany({ id: 'c', name: 'acme' }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ReadOnlyError);
    expect(error).toMatchObject({ code: 'READ_ONLY', driverCode: '25006', retrySafe: true, inRecovery: false });
    expect((error as ReadOnlyError).message).toMatch(/is read-only .*not in recovery.*default_transaction_read_only/);
    expect((error as ReadOnlyError).target).toContain('127.0.0.1');
    expect((await store.migrationStatus()).pending).toEqual([]);
  });
});

describe('the idle-in-transaction killer (idle_in_transaction_session_timeout, 25P03)', () => {
  it('a host transaction that paused past it is retried on a new connection, like any connection loss', async () => {
    const events: TaskfenceEvent[] = [];
    const store = await storeWith({ idle_in_transaction_session_timeout: '300ms' }, { onEvent: (e) => events.push(e) });
    let attempts = 0;
    const result = await store.transaction(async (tx) => {
      attempts++;
      await tx.org.createCompany({ id: 'c1', name: 'acme' });
      // The host pauses inside its transaction (the first attempt only) until the server ends it.
      if (attempts === 1) await waitUntilEnded(store.location.url, await backendPid(tx.db));
      await tx.org.createWorkspace({ id: 'w1', companyId: 'c1', name: 'repo' });
      return attempts;
    });
    expect(result).toBe(2);
    expect(events.some((e) => e.type === 'transaction.retry' && e.kind === 'connection_lost')).toBe(true);
    expect((await store.org.getWorkspace('w1'))?.companyId).toBe('c1');
  });

  it('past the deadline it is DATABASE_UNAVAILABLE naming idle_in_transaction_session_timeout, and nothing was written', async () => {
    const store = await storeWith({ idle_in_transaction_session_timeout: '200ms' });
    const error = await store
      .transaction(
        async (tx) => {
          await tx.org.createCompany({ id: 'c2', name: 'acme' });
          await waitUntilEnded(store.location.url, await backendPid(tx.db));
          await tx.org.createWorkspace({ id: 'w2', companyId: 'c2', name: 'repo' });
        },
        { deadlineMs: 1 },
      )
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(DatabaseUnavailableError);
    expect(error).toMatchObject({
      code: 'DATABASE_UNAVAILABLE',
      retrySafe: true,
      driverCode: '25P03',
      serverTimeout: 'idle_in_transaction_session_timeout',
    });
    expect((error as Error).message).toMatch(
      /ended the session after its idle_in_transaction_session_timeout \(SQLSTATE 25P03/,
    );
    expect(await store.db.selectFrom('companies').select('id').where('id', '=', 'c2').execute()).toEqual([]);
  });
});

describe('the idle-session killer (idle_session_timeout, 57P05)', () => {
  it('120 calls with pauses around the timeout: each succeeds or fails typed naming the timeout, never SCHEMA_OUT_OF_DATE', async () => {
    const events: TaskfenceEvent[] = [];
    const store = await storeWith({ idle_session_timeout: '150ms' }, { onEvent: (e) => events.push(e), poolSize: 3 });
    const company = (await store.org.createCompany({ name: 'acme' })).id;
    const failures: unknown[] = [];
    for (let i = 0; i < 120; i++) {
      // Pauses from 100 to 200 ms: some pooled connections are ended just as a call takes them.
      await new Promise((resolve) => setTimeout(resolve, 100 + ((i * 37) % 100)));
      await store.org.createWorkspace({ companyId: company, name: `ws-${i}` }).catch((e: unknown) => failures.push(e));
    }
    for (const failure of failures) {
      expect(failure).toBeInstanceOf(DatabaseUnavailableError);
      expect(failure).toMatchObject(ENDED_BY_IDLE_SESSION_TIMEOUT);
    }
    expect(failures.filter((f) => (f as { code?: string }).code === 'SCHEMA_OUT_OF_DATE')).toEqual([]);
    // The killer really ran: idle pooled connections were ended under the store.
    expect(events.filter((e) => e.type === 'connection.lost').length).toBeGreaterThan(0);
    expect(failures.length).toBeLessThan(120);
  });

  it('stalled past the timeout: the next read is DATABASE_UNAVAILABLE naming idle_session_timeout; a write is retried', async () => {
    const events: TaskfenceEvent[] = [];
    const store = await storeWith({ idle_session_timeout: '150ms' }, { onEvent: (e) => events.push(e), poolSize: 3 });
    const company = (await store.org.createCompany({ name: 'acme' })).id;
    await fillPool(store);
    stall(600);
    // A read outside a transaction is not retried: it fails at once, naming the server's setting.
    const error = await store.org.getWorkspace('none').catch((e: unknown) => e);
    expect(error).toBeInstanceOf(DatabaseUnavailableError);
    expect(error).toMatchObject(ENDED_BY_IDLE_SESSION_TIMEOUT);
    expect((error as Error).message).toMatch(
      /ended the session after its idle_session_timeout \(SQLSTATE 57P05, an idle connection was closed\); nothing was changed/,
    );
    // A write transaction that lost its connection before COMMIT is retried on a new one.
    await fillPool(store);
    stall(600);
    const seen = events.length;
    const workspace = await store.org.createWorkspace({ companyId: company, name: 'after the stall' });
    expect((await store.org.getWorkspace(workspace.id))?.name).toBe('after the stall');
    expect(events.slice(seen).some((e) => e.type === 'transaction.retry' && e.kind === 'connection_lost')).toBe(true);
  });
});

describe('the lazy schema check never guesses', () => {
  it('a role that may not read the history gets its own error back, not "schema version 0000"', async () => {
    const url = await fx.freshUrl();
    await (await fx.open(url)).migrate();
    const role = `tf_limited_${Math.random().toString(36).slice(2, 8)}`;
    await admin(url, async (c) => {
      await c.query(`create role ${role} login`);
      await c.query(`grant usage on schema public to ${role}`);
    });
    try {
      const limited = new URL(url);
      limited.username = role;
      const store = await fx.open(limited.toString());
      const error = await store.org.createCompany({ name: 'acme' }).catch((e: unknown) => e);
      expect(error).toMatchObject({ code: 'PERMISSION_DENIED', driverCode: '42501' }); // on table companies
      expect(error).not.toMatchObject({ code: 'SCHEMA_OUT_OF_DATE' });
      // A typed error skips the schema check. The host's own error does not: the check reads the
      // version, the role may not read the history (42501), and the call's own error comes back.
      const hostError = new Error("the host's own bug");
      const input = {
        get name(): string {
          throw hostError;
        },
      };
      expect(await store.org.createCompany(input).catch((e: unknown) => e)).toBe(hostError);
      await store.close();
    } finally {
      await admin(url, async (c) => {
        await c.query(`drop owned by ${role}`);
        await c.query(`drop role ${role}`);
      });
    }
  });

  it('under idle_session_timeout the version is read on a fresh connection: never "schema version 0000", every failure typed or the call\'s own', async () => {
    const store = await storeWith({ idle_session_timeout: '150ms' }, { poolSize: 3 });
    const company = (await store.org.createCompany({ name: 'acme' })).id;
    const hostErrors: Error[] = [];
    const failures: unknown[] = [];
    for (let i = 0; i < 24; i++) {
      // Every pooled connection is idle and then ended by the server, unnoticed, before each call.
      await fillPool(store);
      stall(400);
      let call: Promise<unknown>;
      if (i % 3 === 0) call = store.org.getWorkspace('none');
      else if (i % 3 === 1) call = store.org.createWorkspace({ companyId: company, name: `ws-${i}` });
      else {
        // The host's own error, raised before any statement: the schema check runs (it is not a
        // TaskfenceError) and must read the version elsewhere than on the dead pooled connections.
        const hostError = new Error(`the host's own bug ${i}`);
        hostErrors.push(hostError);
        const input = {
          get name(): string {
            throw hostError;
          },
        };
        call = store.org.createCompany(input);
      }
      await call.catch((e: unknown) => failures.push(e));
    }
    expect(failures.filter((f) => (f as { code?: string }).code === 'SCHEMA_OUT_OF_DATE')).toEqual([]);
    // The host gets its own error back, each time, unchanged.
    expect(failures.filter((f) => hostErrors.includes(f as Error))).toEqual(hostErrors);
    const typed = failures.filter((f) => !hostErrors.includes(f as Error));
    for (const failure of typed) {
      expect(failure).toBeInstanceOf(DatabaseUnavailableError);
      expect(failure).toMatchObject(ENDED_BY_IDLE_SESSION_TIMEOUT);
    }
    // The reads after a stall found their connection ended: the killer ran under every call.
    expect(typed.length).toBeGreaterThan(0);
  });
});
