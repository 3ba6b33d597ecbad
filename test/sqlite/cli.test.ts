import { afterAll, describe, expect, it } from 'vitest';
import { holdWriteLock } from '../support/hold-write-lock.js';
import Database from 'better-sqlite3';
import { chmodSync, existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { defineCliSuite, expectOneLine, runCli } from '../suites/cli.suite.js';
import { sqliteFixture } from '../support/dialects.js';

defineCliSuite(sqliteFixture);

describe('migration lock on SQLite', () => {
  const fx = sqliteFixture();
  afterAll(() => fx.cleanup());

  it('while another writer holds the file, migrate says every few seconds that it waits, then times out with one line', async () => {
    const store = await fx.freshStore({ to: 8 });
    const lock = await holdWriteLock(store, (trx) =>
      trx.insertInto('companies').values({ id: 'held', name: 'held', created_at: 1 }).execute(),
    );
    try {
      const result = await runCli(['migrate', '--db', store.location.url, '--lock-wait', '7000']);
      expect(result.code).toBe(1);
      expectOneLine(result);
      expect(result.err).toMatch(/held the migration lock for more than 7000 ms/);
      const waiting = result.out.split('\n').filter((l) => l.startsWith('waiting'));
      expect(waiting.length).toBeGreaterThanOrEqual(2);
      expect(waiting[0]).toMatch(
        /^waiting \d+ s for the migration lock, held by another migrator \(SQLite: another writer\)$/,
      );
    } finally {
      await lock.release();
    }
  });
});

describe('SQLite file errors speak of the file', () => {
  const dir = mkdtempSync(join(tmpdir(), 'taskfence-cli-file-'));
  chmodSync(dir, 0o755);

  it('a missing directory, a file that is not a database, a missing file for status: one line about the file, nothing created', async () => {
    const missingDir = await runCli(['migrate', '--db', `sqlite:${join(dir, 'nope', 'x.db')}`]);
    expect(missingDir.code).toBe(1);
    expectOneLine(missingDir);
    expect(missingDir.err).toMatch(/the directory .*nope does not exist/);
    expect(missingDir.err).not.toMatch(/server|host|port/);

    const text = join(dir, 'notes.txt');
    writeFileSync(text, 'these are my notes, not a database\n'.repeat(20));
    for (const command of ['migrate', 'status', 'plan']) {
      const result = await runCli([command, '--db', `sqlite:${text}`]);
      expect(result.code).toBe(1);
      expectOneLine(result);
      expect(result.err).toMatch(/is not an SQLite database/);
    }
    expect(readFileSync(text, 'utf8')).toBe('these are my notes, not a database\n'.repeat(20));

    // status and plan describe a missing file as the empty database migrate would start from, without creating it.
    const absent = join(dir, 'absent.db');
    for (const command of ['status', 'plan']) {
      const result = await runCli([command, '--db', `sqlite:${absent}`]);
      expect(result.code).toBe(0);
      expect(result.out).toMatch(/does not exist yet \(migrate creates it\)/);
    }
    expect((await runCli(['status', '--db', `sqlite:${absent}`, '--check'])).code).toBe(3);
    expect(existsSync(absent)).toBe(false);
  });

  it('permissions: an unreadable file, a read-only file, a WAL file in a directory the user cannot write — one line about the file each', async () => {
    // Root ignores file modes: as root, run the CLI as the unprivileged postgres user.
    const asUser = process.getuid?.() === 0 ? 'postgres' : undefined;
    const sub = mkdtempSync(join(dir, 'perm-'));
    chmodSync(sub, 0o755);
    const path = join(sub, 'x.db');
    expect((await runCli(['migrate', '--db', `sqlite:${path}`])).code).toBe(0);
    chmodSync(path, 0o600);
    chmodSync(sub, 0o755);
    const unreadable = await runCli(['status', '--db', `sqlite:${path}`], { asUser });
    expect(unreadable.code).toBe(1);
    expectOneLine(unreadable);
    expect(unreadable.err).toMatch(/cannot open sqlite:.*x\.db: permission denied/);

    chmodSync(path, 0o644);
    for (const command of ['status', 'migrate']) {
      const result = await runCli([command, '--db', `sqlite:${path}`], { asUser });
      expect(result.code, command).toBe(1);
      expectOneLine(result);
      expect(result.err).toMatch(/x\.db/);
      expect(result.err).toMatch(/directory .* is not writable for this user|read-only for this user/);
      expect(result.err).not.toMatch(/server|host, port|unexpected/);
    }
  });

  it('status and plan open the file read-only: a rollback-journal file is left byte for byte as it was (no switch to WAL)', async () => {
    const path = join(dir, 'journal.db');
    const raw = new Database(path);
    raw.exec("create table notes (id integer primary key, body text); insert into notes (body) values ('x');");
    expect(raw.pragma('journal_mode', { simple: true })).toBe('delete');
    raw.close();
    const before = readFileSync(path);
    expect((await runCli(['status', '--db', `sqlite:${path}`])).code).toBe(0);
    expect((await runCli(['plan', '--db', `sqlite:${path}`, '--to', '5'])).code).toBe(0);
    expect(readFileSync(path).equals(before)).toBe(true);
    expect(existsSync(`${path}-wal`)).toBe(false);
  });
});
