import { spawnSync } from 'node:child_process';
import { closeSync, mkdirSync, openSync, rmSync, writeSync } from 'node:fs';
import { join } from 'node:path';

/**
 * A small filesystem of the test's own: a tmpfs of `bytes` mounted at `dir` (root only). Disks
 * fill up for real there: SQLite sees `SQLITE_FULL`, PostgreSQL 53100, exactly as on a full volume.
 * Also a file made read-only for every process, root included (`mountReadOnly`).
 */
export interface SmallFilesystem {
  readonly dir: string;
  /** Writes a filler file until the filesystem is full (ENOSPC); returns its path. */
  fill(): string;
  /** Deletes the filler: the space is back. */
  free(): void;
  unmount(): void;
}

/**
 * Mounts a tmpfs; returns the reason as a string when this process may not mount (not root, no
 * CAP_SYS_ADMIN), for a test that has a fallback. A test without one uses `requireSmallFilesystem`.
 */
export function mountSmallFilesystem(dir: string, bytes: number): SmallFilesystem | string {
  mkdirSync(dir, { recursive: true });
  const mounted = spawnSync('mount', ['-t', 'tmpfs', '-o', `size=${bytes},mode=0777`, 'tmpfs', dir], {
    encoding: 'utf8',
  });
  if (mounted.status !== 0) return `mount -t tmpfs failed: ${(mounted.stderr || mounted.stdout || '').trim()}`;
  const filler = join(dir, 'filler');
  return {
    dir,
    fill: () => {
      const fd = openSync(filler, 'a');
      const chunk = Buffer.alloc(64 * 1024, 1);
      try {
        for (;;) {
          try {
            writeSync(fd, chunk);
          } catch (error) {
            if ((error as { code?: string }).code !== 'ENOSPC') throw error;
            // The last partial chunk: fill the remaining bytes one page at a time.
            const page = Buffer.alloc(4096, 1);
            for (;;) {
              try {
                writeSync(fd, page);
              } catch {
                return filler;
              }
            }
          }
        }
      } finally {
        closeSync(fd);
      }
    },
    free: () => rmSync(filler, { force: true }),
    unmount: () => {
      spawnSync('umount', ['-l', dir]);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/**
 * The mounted filesystem, or a thrown error saying why there is none: for a test that has no
 * fallback and so must fail, never skip or pass silently, where it cannot mount.
 */
export function requireSmallFilesystem(fs: SmallFilesystem | string, test: string): SmallFilesystem {
  if (typeof fs !== 'string') return fs;
  throw new Error(
    `${test} needs a small filesystem of its own and could not mount one (${fs}). ` +
      'Run the tests as root or with CAP_SYS_ADMIN, as CI does.',
  );
}

/**
 * Makes `file` read-only for every process, root included, by bind-mounting it read-only over
 * itself (chmod 0444 does not stop root, and the tests run as root). Opening it for writing then
 * fails with EROFS while its directory stays writable, so SQLite opens it read-only and can still
 * create its -wal and -shm files: exactly what a user who may read the file but not write it
 * gets. Returns the undo. Throws, naming the reason, when this process may not mount.
 */
export function mountReadOnly(file: string): () => void {
  const run = (args: string[]) => {
    const result = spawnSync('mount', args, { encoding: 'utf8' });
    if (result.status !== 0) {
      throw new Error(
        `mount ${args.join(' ')} failed (${(result.stderr || result.stdout || String(result.error ?? '')).trim()}): ` +
          'making a file read-only for root needs a read-only bind mount. Run the tests as root or with CAP_SYS_ADMIN, as CI does.',
      );
    }
  };
  run(['--bind', file, file]);
  try {
    run(['-o', 'remount,bind,ro', file]);
  } catch (error) {
    spawnSync('umount', [file]);
    throw error;
  }
  return () => {
    spawnSync('umount', ['-l', file]);
  };
}
