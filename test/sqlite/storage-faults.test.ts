/**
 * SQLite on a full disk, for real: the database lives on a small tmpfs of the test's own, which a
 * filler file fills up. Every write then fails inside SQLite with SQLITE_FULL, as on a full volume.
 * If this process may not mount (not root, no CAP_SYS_ADMIN: a developer laptop), the store test
 * falls back to `PRAGMA max_page_count`, which makes SQLite raise the same SQLITE_FULL from the
 * same code path (the pager refusing a new page) without a filesystem, and says so on the console;
 * the CLI test has no fallback (a file that does not exist yet cannot be capped) and fails, saying
 * why. CI runs as root and mounts.
 *
 * And SQLite on a file this process may not write: the migrated file bind-mounted read-only over
 * itself (root ignores chmod), its directory still writable.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { ReadOnlyError, StorageFullError, openStore, type Store } from '../../src/index.js';
import {
  mountReadOnly,
  mountSmallFilesystem,
  requireSmallFilesystem,
  type SmallFilesystem,
} from '../support/small-fs.js';
import { runCli } from '../suites/cli.suite.js';

const NAME = 'x'.repeat(64 * 1024);

describe('SQLite on a full disk', () => {
  const root = mkdtempSync(join(tmpdir(), 'taskfence-full-'));
  let fs: SmallFilesystem | string;
  let store: Store;
  let file: string;

  beforeAll(async () => {
    fs = mountSmallFilesystem(join(root, 'mnt'), 4 * 1024 * 1024);
    if (typeof fs === 'string') console.warn(`[taskfence tests] ${fs}: using PRAGMA max_page_count instead`);
    file = join(typeof fs === 'string' ? root : fs.dir, 'app.db');
    store = await openStore(`sqlite:${file}`);
    await store.migrate();
  });
  afterAll(async () => {
    await store?.close();
    if (typeof fs !== 'string') fs.unmount();
    rmSync(root, { recursive: true, force: true });
  });

  /** Fills the disk (or caps the file), then writes until SQLite refuses. */
  async function writeUntilFull(): Promise<{ error: unknown; written: number }> {
    if (typeof fs === 'string') {
      const { rows } = await sql<{ page_count: number }>`pragma page_count`.execute(store.db);
      await sql.raw(`pragma max_page_count = ${rows[0]!.page_count + 4}`).execute(store.db);
    } else {
      fs.fill();
    }
    for (let i = 0; i < 2_000; i++) {
      try {
        await store.org.createCompany({ id: `full-${i}`, name: NAME });
      } catch (error) {
        return { error, written: i };
      }
    }
    throw new Error('2 000 writes of 64 KiB fit on the full disk');
  }

  it('a write is STORAGE_FULL naming the file, retry-safe, and changed nothing; writes work again once space is freed', async () => {
    const { error, written } = await writeUntilFull();
    expect(error).toBeInstanceOf(StorageFullError);
    const full = error as StorageFullError;
    expect(full).toMatchObject({
      code: 'STORAGE_FULL',
      retrySafe: true,
      driverCode: 'SQLITE_FULL',
      target: `sqlite:${file}`,
    });
    expect(full.message).toContain(file);
    expect(full.message).toMatch(/is full .*Free space on the volume/);
    expect(full.message).not.toMatch(/Check the file path/);
    // The refused create left nothing behind, and reads still work on the full disk.
    const company = (id: string) => store.db.selectFrom('companies').select('name').where('id', '=', id).execute();
    expect(await company(`full-${written}`)).toEqual([]);
    if (typeof fs === 'string') await sql.raw('pragma max_page_count = 1073741823').execute(store.db);
    else fs.free();
    await store.org.createCompany({ id: `full-${written}`, name: 'after' });
    expect(await company(`full-${written}`)).toEqual([{ name: 'after' }]);
  });

  it('the CLI says the disk is full, not "check the file path", when migrate cannot write a new file', async () => {
    // A real full filesystem only: a file that does not exist yet cannot be capped in advance.
    const small = requireSmallFilesystem(fs, 'The CLI disk-full test');
    small.fill();
    try {
      const result = await runCli(['migrate', '--db', `sqlite:${join(small.dir, 'fresh.db')}`]);
      expect(result.code).not.toBe(0);
      expect(result.err).toMatch(/disk under the database .* is full/);
      expect(result.err).not.toMatch(/Check the file path/);
    } finally {
      small.free();
    }
  });
});

describe('SQLite on a file this process may not write', () => {
  const root = mkdtempSync(join(tmpdir(), 'taskfence-readonly-'));
  const file = join(root, 'app.db');
  let undo: (() => void) | undefined;
  let store: Store | undefined;

  beforeAll(async () => {
    const writer = await openStore(`sqlite:${file}`);
    await writer.migrate();
    await writer.org.createCompany({ id: 'before', name: 'acme' });
    await writer.close();
    // Read-only for root too; the directory stays writable, so SQLite can still make -wal and -shm.
    undo = mountReadOnly(file);
    store = await openStore(`sqlite:${file}`);
  });
  afterAll(async () => {
    await store?.close();
    undo?.();
    rmSync(root, { recursive: true, force: true });
  });

  it('every write is READ_ONLY naming the file, retry-safe, never the raw SQLITE_READONLY; reads still work', async () => {
    const s = store!;
    const error = await s.org.createCompany({ id: 'after', name: 'acme' }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ReadOnlyError);
    expect(error).toMatchObject({
      code: 'READ_ONLY',
      driverCode: 'SQLITE_READONLY',
      retrySafe: true,
      inRecovery: null,
      target: `sqlite:${file}`,
    });
    const message = (error as ReadOnlyError).message;
    expect(message).toContain(`sqlite:${file} is read-only`);
    expect(message).toMatch(/Check the permissions of the file, its -wal and -shm files, and its directory/);
    expect(message).not.toMatch(/Check the file path/);
    // A host transaction's write and a lease claim are refused the same way.
    const inTransaction = await s
      .transaction((tx) => tx.org.createWorkspace({ id: 'w1', companyId: 'before', name: 'repo' }))
      .catch((e: unknown) => e);
    expect(inTransaction).toBeInstanceOf(ReadOnlyError);
    const claim = await s.semaphores
      .acquire('builds', { holder: 'h', limit: 1, ttlMs: 60_000 })
      .catch((e: unknown) => e);
    expect(claim).toBeInstanceOf(ReadOnlyError);
    // Nothing was written, and reads work on the read-only file.
    expect(await s.db.selectFrom('companies').select('id').execute()).toEqual([{ id: 'before' }]);
    expect(await s.org.getWorkspace('w1')).toBeNull();
    expect((await s.migrationStatus()).pending).toEqual([]);
  });
});
