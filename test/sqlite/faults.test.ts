import { fork, type ChildProcess } from 'node:child_process';
import { afterAll, describe, expect, it } from 'vitest';
import { TaskfenceError } from '../../src/index.js';
import { sqliteFixture } from '../support/dialects.js';
import { compiledPath } from '../support/compiled.js';

/*
 * The SQLite fault tier (SPEC §8): a writer process killed mid-transaction leaves nothing
 * half-written and frees the file at once; a write lock held by another process past the
 * caller's deadline is the typed WRITE_TIMEOUT, with nothing written.
 */

const CHILD = new URL('../support/hang-in-write.ts', import.meta.url).href;

const fx = sqliteFixture();
afterAll(() => fx.cleanup());

async function startHolder(url: string): Promise<{ child: ChildProcess; died: Promise<NodeJS.Signals | null> }> {
  const child = fork(compiledPath(CHILD), [], { execArgv: [], env: { ...process.env, FAULT_URL: url } });
  const died = new Promise<NodeJS.Signals | null>((resolve) => child.on('exit', (_code, signal) => resolve(signal)));
  await new Promise<void>((resolve, reject) => {
    child.on('message', (m: { type: string }) => m.type === 'holding' && resolve());
    void died.then(() => reject(new Error('the holder exited before holding the write lock')));
  });
  return { child, died };
}

describe('SQLite faults', () => {
  it('a writer SIGKILLed mid-transaction leaves nothing half-written, and the next write succeeds', async () => {
    const url = await fx.freshUrl();
    const store = await fx.open(url, { writeDeadlineMs: 300, busyTimeoutMs: 50 });
    await store.migrate();
    const { child, died } = await startHolder(url);
    // The child really holds the write lock with its rows written...
    expect(await store.org.createCompany({ name: 'too early' }).catch((e: { code?: string }) => e.code)).toBe(
      'WRITE_TIMEOUT',
    );
    child.kill('SIGKILL');
    expect(await died).toBe('SIGKILL');

    expect(await store.db.selectFrom('companies').select('id').where('id', '=', 'half').execute()).toEqual([]);
    expect(await store.db.selectFrom('workspaces').select('id').where('id', '=', 'half-ws').execute()).toEqual([]);
    const company = await store.org.createCompany({ id: 'after', name: 'After the crash' });
    expect(company.id).toBe('after');
  });

  it('a write lock held by another process past the deadline is WRITE_TIMEOUT, and nothing is written', async () => {
    const url = await fx.freshUrl();
    const migrator = await fx.open(url);
    await migrator.migrate();
    const store = await fx.open(url, { writeDeadlineMs: 400, busyTimeoutMs: 50 });
    const { child, died } = await startHolder(url);
    try {
      const error = await store.org.createCompany({ id: 'blocked', name: 'Blocked' }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(TaskfenceError);
      expect(error).toMatchObject({ code: 'WRITE_TIMEOUT', deadlineMs: 400 });
    } finally {
      child.kill('SIGKILL');
      await died;
    }
    expect(await store.db.selectFrom('companies').select('id').execute()).toEqual([]);
    expect((await store.org.createCompany({ id: 'blocked', name: 'Blocked' })).id).toBe('blocked');
  });
});
