/**
 * Faults that need a server of the test's own (never the shared service): a private cluster whose
 * data directory sits on a small tmpfs that a filler file fills up (PostgreSQL 53100, "could not
 * extend file … No space left on device"), and a hot standby of it (in recovery: 25006 on every
 * write). Skipped only where initdb or mount is missing, with a warning; CI has both.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { ReadOnlyError, StorageFullError, openStore, type Store } from '../../src/index.js';
import { privateClustersAvailable, startPrivateCluster, type PrivateCluster } from '../support/private-cluster.js';
import { mountSmallFilesystem, type SmallFilesystem } from '../support/small-fs.js';

const root = mkdtempSync(join(tmpdir(), 'taskfence-pgfull-'));
chmodSync(root, 0o755); // the server runs as postgres and must reach its folders
const fs = mountSmallFilesystem(join(root, 'mnt'), 96 * 1024 * 1024);
const runs = privateClustersAvailable() && typeof fs !== 'string';
if (!runs)
  console.warn(`[taskfence tests] storage-faults.test.ts skipped: ${typeof fs === 'string' ? fs : 'no initdb'}`);

describe.runIf(runs || process.env.CI !== undefined)('a private cluster on a small filesystem', () => {
  const small = fs as SmallFilesystem;
  let primary: PrivateCluster;
  let standby: PrivateCluster | undefined;
  const stores: Store[] = [];

  beforeAll(async () => {
    primary = await startPrivateCluster(join(small.dir, 'data'));
    const admin = new pg.Client({ connectionString: primary.url() });
    await admin.connect();
    await admin.query('create database app');
    await admin.end();
  });
  afterAll(async () => {
    await Promise.allSettled(stores.map((s) => s.close()));
    standby?.stop();
    primary?.stop();
    small.unmount();
    rmSync(root, { recursive: true, force: true });
  });

  async function open(url: string): Promise<Store> {
    const store = await openStore(url);
    stores.push(store);
    return store;
  }

  it('a hot standby refuses every write as READ_ONLY, in recovery, naming the server', async () => {
    const store = await open(primary.url('app'));
    await store.migrate();
    standby = await primary.startStandby(join(root, 'standby'));
    const onStandby = await open(standby.url('app'));
    const error = await onStandby.org.createCompany({ id: 'c', name: 'acme' }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ReadOnlyError);
    expect(error).toMatchObject({ code: 'READ_ONLY', driverCode: '25006', inRecovery: true, retrySafe: true });
    expect((error as Error).message).toMatch(
      new RegExp(`127\\.0\\.0\\.1:${standby.port}.* is read-only .*in recovery`),
    );
    expect((await onStandby.migrationStatus()).pending).toEqual([]);
  });

  it('a full data directory is STORAGE_FULL (53100), retry-safe and nothing written; writes work again once space is freed', async () => {
    const store = await open(primary.url('app'));
    const company = (await store.org.createCompany({ name: 'acme' })).id;
    small.fill();
    let error: unknown;
    let n = 0;
    try {
      for (; n < 5_000; n++) {
        await store.org.createWorkspace({ id: `w-${n}`, companyId: company, name: 'x'.repeat(64 * 1024) });
      }
    } catch (e) {
      error = e;
    } finally {
      small.free();
    }
    expect(error).toBeInstanceOf(StorageFullError);
    expect(error).toMatchObject({ code: 'STORAGE_FULL', driverCode: '53100', retrySafe: true });
    expect((error as Error).message).toMatch(
      /disk under the database at postgres:\/\/postgres@127\.0\.0\.1:\d+\/app is full/,
    );
    expect(await store.org.getWorkspace(`w-${n}`)).toBeNull();
    await store.org.createWorkspace({ id: `w-${n}`, companyId: company, name: 'after' });
    expect((await store.org.getWorkspace(`w-${n}`))?.name).toBe('after');
  });
});
