/**
 * A store on a host list finds the writable host, and finds it again after the host it used
 * stops accepting writes or goes away, without being re-created. Two real servers: a primary
 * and a streaming standby (servers.ts).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql } from 'kysely';
import { DatabaseUnavailableError, openStore, TaskfenceError, type Store } from '../../src/index.js';
import { PrimaryAndStandby } from './servers.js';

let pair: PrimaryAndStandby;
let store: Store;
let n = 0;

async function serverPort(s: Store): Promise<number> {
  const { rows } = await sql<{ port: number }>`select inet_server_port() as port`.execute(s.db);
  return Number(rows[0]!.port);
}

const createCompany = (s: Store) => s.org.createCompany({ id: `c-${++n}`, name: `company ${n}` });

async function failure(fn: () => Promise<unknown>): Promise<unknown> {
  try {
    await fn();
  } catch (error) {
    return error;
  }
  throw new Error('expected the call to fail');
}

beforeAll(async () => {
  pair = await PrimaryAndStandby.start('taskfence');
  // The standby first: a store that took the first host that answers would land on it.
  const url =
    `postgres://postgres@127.0.0.1:${pair.standby.port},127.0.0.1:${pair.primary.port}/taskfence` +
    '?target_session_attrs=read-write';
  store = await openStore({ url, writeDeadlineMs: 3_000, connectTimeoutMs: 2_000 });
  await store.migrate();
});

afterAll(async () => {
  await store?.close();
  pair?.stop();
});

describe('a store on a host list (target_session_attrs=read-write)', () => {
  it('connects to the writable host, whichever place it has in the list', async () => {
    expect(await serverPort(store)).toBe(pair.primary.port);
    await createCompany(store);
  });

  it('after the host turns read-only, looks for the writable one again and works there', async () => {
    // The standby is promoted while the old primary still runs, and the old one stops accepting
    // writes (as a demoted primary does): the store's pooled connections all lead to it.
    pair.standby.promote();
    await pair.primary.sql('alter system set default_transaction_read_only = on');
    await pair.primary.sql('select pg_reload_conf()');
    const error = await failure(() => createCompany(store));
    // A raw 25006 until the READ_ONLY error of the engine-errors work lands; then READ_ONLY.
    const code = (error as { code?: string }).code;
    const driverCode = (error as { driverCode?: string }).driverCode;
    expect(code === '25006' || driverCode === '25006', String(error)).toBe(true);
    await createCompany(store);
    expect(await serverPort(store)).toBe(pair.standby.port);
  });

  it('while no host accepts writes, fails typed and retry-safe, naming each host; then works again', async () => {
    pair.standby.crash();
    const error = await failure(() => createCompany(store));
    expect(error).toBeInstanceOf(DatabaseUnavailableError);
    const unavailable = error as DatabaseUnavailableError;
    expect(unavailable.retrySafe).toBe(true);
    expect(unavailable.message).toContain(`127.0.0.1:${pair.primary.port}: read-only`);
    expect(unavailable.message).toContain(`127.0.0.1:${pair.standby.port}: ECONNREFUSED`);
    // Reads fail the same way: the store never hands out a session target_session_attrs refuses.
    expect(await failure(() => serverPort(store))).toBeInstanceOf(TaskfenceError);

    await pair.primary.sql('alter system reset default_transaction_read_only');
    await pair.primary.sql('select pg_reload_conf()');
    await createCompany(store);
    expect(await serverPort(store)).toBe(pair.primary.port);
  });
});
