import { closeSync, existsSync, openSync, readSync, statSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { parseDatabaseUrl, redactDatabaseUrl } from '../config.js';
import { DatabaseUnavailableError } from '../errors.js';
import { openPostgresDialect } from '../dialects/postgres/postgres-dialect.js';
import { openSqliteDialect } from '../dialects/sqlite/sqlite-dialect.js';
import type { StoreDialect } from '../dialects/types.js';
import { schemaFor, type ParsedArgs } from './args.js';

/** A one-line refusal about an SQLite file, before the driver is asked (it would speak of servers, or create the file). */
export class FileError extends Error {}

/** Checks an SQLite file before opening it; 'missing' when it does not exist yet (migrate creates it). */
function checkSqliteFile(filename: string): 'missing' | 'ok' {
  if (filename === ':memory:' || filename === '') return 'ok';
  const path = resolve(filename);
  const dir = dirname(path);
  if (!existsSync(dir)) throw new FileError(`cannot open sqlite:${filename}: the directory ${dir} does not exist`);
  if (!existsSync(path)) return 'missing';
  if (statSync(path).isDirectory())
    throw new FileError(`cannot open sqlite:${filename}: ${path} is a directory, not a database file`);
  let fd: number;
  try {
    fd = openSync(path, 'r');
  } catch (error) {
    const code = (error as { code?: string }).code;
    throw new FileError(
      `cannot open sqlite:${filename}: ${code === 'EACCES' || code === 'EPERM' ? 'permission denied (check the file and its directory)' : (error as Error).message}`,
    );
  }
  try {
    const header = Buffer.alloc(16);
    const n = readSync(fd, header, 0, 16, 0);
    if (n > 0 && header.toString('latin1', 0, Math.min(n, 16)) !== 'SQLite format 3\0') {
      throw new FileError(`sqlite:${filename} is not an SQLite database (the file ${path} has some other content)`);
    }
  } finally {
    closeSync(fd);
  }
  return 'ok';
}

/** An SQLite open failure as a sentence about the file, or undefined when it is not one. */
function sqliteFileError(filename: string, error: unknown): FileError | undefined {
  const codeOf = (e: unknown) => (e as { code?: unknown } | null)?.code;
  const code = [codeOf(error), codeOf((error as { cause?: unknown } | null)?.cause)].find(
    (c): c is string => typeof c === 'string' && c.startsWith('SQLITE_'),
  );
  if (!code) return undefined;
  const path = resolve(filename);
  if (code === 'SQLITE_READONLY_DIRECTORY') {
    return new FileError(
      `cannot use sqlite:${filename}: it is in WAL mode and the directory ${dirname(path)} is not writable for this user, so SQLite cannot create ${path}-shm; run as a user who can write that directory`,
    );
  }
  if (code.startsWith('SQLITE_READONLY'))
    return new FileError(
      `sqlite:${filename} is read-only for this user; migrate needs to write it (check the permissions of ${path} and of its directory)`,
    );
  if (code.startsWith('SQLITE_CANTOPEN'))
    return new FileError(`cannot open sqlite:${filename}: check the permissions of ${path} and of its directory`);
  if (code === 'SQLITE_NOTADB') return new FileError(`sqlite:${filename} is not an SQLite database`);
  return undefined;
}

/**
 * Opens the database the CLI's `migrate`, `status` and `plan` work on: SQLite read-only for the
 * commands that change nothing (an in-memory empty database when the file does not exist yet);
 * PostgreSQL in the schema `--schema` or `?schema=` names, with a watchdog on connecting.
 */
export async function openDialect(
  url: string,
  parsed: ParsedArgs,
  note: (line: string) => void,
): Promise<StoreDialect> {
  const location = parseDatabaseUrl(url);
  const schema = schemaFor(parsed, url);
  const connectTimeoutMs = parsed.connectTimeoutMs ?? 10_000;
  if (location.dialect === 'sqlite') {
    const inspecting = parsed.command !== 'migrate';
    const state = checkSqliteFile(location.filename);
    if (inspecting && state === 'missing') {
      // status and plan change nothing, so they do not create the file: they describe the empty database migrate would start from.
      note(`the file ${location.filename} does not exist yet (migrate creates it); showing an empty database`);
      return openSqliteDialect(':memory:');
    }
    try {
      return await openSqliteDialect(
        location.filename,
        inspecting && location.filename !== ':memory:' ? { readOnly: true } : {},
      );
    } catch (error) {
      throw sqliteFileError(location.filename, error) ?? error;
    }
  }
  // A watchdog on top of the driver's own connect timeout: a host that accepts TCP and never
  // answers must end in one line, never a hang.
  let timer: NodeJS.Timeout | undefined;
  const watchdog = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () =>
        reject(
          new DatabaseUnavailableError(redactDatabaseUrl(url), new Error(`no answer within ${connectTimeoutMs} ms`)),
        ),
      connectTimeoutMs + 2_000,
    );
    timer.unref();
  });
  try {
    return await Promise.race([
      openPostgresDialect(location.connectionString, {
        connectTimeoutMs,
        poolSize: 3,
        ...(schema === undefined ? {} : { schema }),
      }),
      watchdog,
    ]);
  } finally {
    clearTimeout(timer);
  }
}
