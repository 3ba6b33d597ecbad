#!/usr/bin/env node
import { closeSync, existsSync, openSync, readFileSync, readSync, statSync } from 'node:fs';
import { realpathSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { runDoctorCommand } from './doctor/cli.js';
import { ensureSchema, openStore } from './store.js';
import { parseDatabaseUrl, redactDatabaseUrl } from './config.js';
import { DatabaseUnavailableError, TaskfenceError, formatVersion } from './errors.js';
import { Migrator, type MigrationEvent, type MigrationStatus, type PlanStep } from './migrator/migrator.js';
import { openPostgresDialect } from './dialects/postgres/postgres-dialect.js';
import { openSqliteDialect } from './dialects/sqlite/sqlite-dialect.js';
import type { MigrationLockHolder, StoreDialect } from './dialects/types.js';

const HELP = `taskfence — migrate and inspect a taskfence database

Usage:
  taskfence migrate [--db URL] [--to V] [--baseline V] [--allow-data-loss]
                    [--lock-wait MS] [--ddl-lock-timeout MS] [--json]
  taskfence status  [--db URL] [--json] [--check]
  taskfence plan    [--db URL] [--to V] [--json]
  taskfence doctor  [--db URL] [--json]        (schema drift and guarantee self-test)
  taskfence prune   [--db URL] --older-than D [--dry-run] [--batch-size N] [--json]
  taskfence --version | --help

  --db URL              sqlite:<path>, sqlite::memory:, postgres://… or postgresql://…
                        (default: $TASKFENCE_DATABASE_URL, else sqlite:./taskfence.db —
                        but migrate refuses the default when CI is set or stdin is not a terminal)
  --older-than D        prune: delete what finished longer ago than D (30d, 12h, 90m, 45s, or ms)
  --dry-run             prune: count what would be deleted, delete nothing
  --to V                migrate (or plan) up or down to version V; 0 reverts everything
  --baseline V          adopt a database that has taskfence tables but no history as version V
                        (its tables are verified first), then migrate on
  --allow-data-loss     let down steps drop tables or columns that hold rows (refused otherwise)
  --lock-wait MS        how long to wait for another migrator's migration lock (default 60000);
                        while waiting, who holds it is printed every few seconds
  --ddl-lock-timeout MS PostgreSQL lock_timeout of migration DDL on busy tables (default 10000; 0 = none)
  --connect-timeout MS  how long connecting may take (default 10000)
  --json                migrate: one JSON object per event (progress included) on stdout;
                        status, plan: one JSON object
  --check               status: exit non-zero unless the database is at the latest version
  --verbose             print stack traces of unexpected errors

Versions are numbers: 5 and 0005 mean the same.
Exit codes: 0 success; 1 failure (one line on stderr); 2 usage error or no explicit database in automation;
status --check: 3 pending migrations, 4 baseline required, 5 an applied migration was edited,
6 the database has migrations this taskfence does not know.`;

/** `status --check` exit codes, most serious first. */
export const CHECK_EXIT = { upToDate: 0, pending: 3, baselineRequired: 4, modified: 5, unknown: 6 } as const;

class UsageError extends Error {}

type Command = 'migrate' | 'status' | 'plan' | 'doctor' | 'prune' | 'help' | 'version';

interface ParsedArgs {
  command: Command;
  /** The --db value, if given. */
  db?: string;
  to?: number;
  baseline?: number;
  lockWaitMs?: number;
  ddlLockTimeoutMs?: number;
  connectTimeoutMs?: number;
  /** prune: how old finished rows must be, in ms. */
  olderThanMs?: number;
  batchSize?: number;
  dryRun: boolean;
  allowDataLoss: boolean;
  json: boolean;
  check: boolean;
  verbose: boolean;
}

const COMMON = ['--db', '--connect-timeout', '--verbose'];
const ALLOWED: Record<'migrate' | 'status' | 'plan' | 'doctor' | 'prune', readonly string[]> = {
  migrate: [
    ...COMMON,
    '--to',
    '--baseline',
    '--lock-wait',
    '--lock-timeout',
    '--ddl-lock-timeout',
    '--allow-data-loss',
    '--json',
  ],
  status: [...COMMON, '--json', '--check'],
  plan: [...COMMON, '--to', '--json'],
  doctor: [...COMMON, '--json'],
  prune: [...COMMON, '--older-than', '--batch-size', '--dry-run', '--json'],
};
const FLAGS = new Set(['--json', '--check', '--verbose', '--allow-data-loss', '--dry-run']);

/** `30d`, `12h`, `90m`, `45s` or a number of milliseconds. */
function parseDuration(flag: string, value: string): number {
  const match = /^(\d+)(ms|s|m|h|d)?$/.exec(value);
  if (!match) throw new UsageError(`${flag} takes a duration like 30d, 12h, 90m, 45s or a number of milliseconds`);
  const unit = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 }[
    (match[2] ?? 'ms') as 'ms' | 's' | 'm' | 'h' | 'd'
  ];
  return Number(match[1]) * unit;
}

function parseVersion(flag: string, value: string | undefined): number {
  if (value === undefined || !/^\d+$/.test(value))
    throw new UsageError(`${flag} takes a version number, like 52 or 0052`);
  return Number(value);
}

function parseMs(flag: string, value: string): number {
  if (!/^\d+$/.test(value)) throw new UsageError(`${flag} takes a number of milliseconds`);
  return Number(value);
}

export function parseArgs(argv: readonly string[]): ParsedArgs {
  const args = [...argv];
  const base = { allowDataLoss: false, json: false, check: false, verbose: false, dryRun: false };
  if (args.includes('--version') || args.includes('-V')) return { command: 'version', ...base };
  if (args.length === 0 || args.includes('--help') || args.includes('-h') || args[0] === 'help')
    return { command: 'help', ...base };
  const command = args.shift()!;
  if (
    command !== 'migrate' &&
    command !== 'status' &&
    command !== 'plan' &&
    command !== 'doctor' &&
    command !== 'prune'
  ) {
    throw new UsageError(`unknown command "${command}"`);
  }
  const parsed: ParsedArgs = { command, ...base };
  while (args.length > 0) {
    const arg = args.shift()!;
    const [flag, inline] =
      arg.startsWith('--') && arg.includes('=')
        ? [arg.slice(0, arg.indexOf('=')), arg.slice(arg.indexOf('=') + 1)]
        : [arg, undefined];
    if (!ALLOWED[command].includes(flag)) throw new UsageError(`"${flag}" is not an option of ${command}`);
    if (FLAGS.has(flag)) {
      if (flag === '--json') parsed.json = true;
      if (flag === '--check') parsed.check = true;
      if (flag === '--verbose') parsed.verbose = true;
      if (flag === '--allow-data-loss') parsed.allowDataLoss = true;
      if (flag === '--dry-run') parsed.dryRun = true;
      continue;
    }
    const value = inline ?? args.shift();
    if (value === undefined) throw new UsageError(`${flag} needs a value`);
    if (flag === '--db') parsed.db = value;
    if (flag === '--to') parsed.to = parseVersion(flag, value);
    if (flag === '--baseline') parsed.baseline = parseVersion(flag, value);
    if (flag === '--lock-wait' || flag === '--lock-timeout') parsed.lockWaitMs = parseMs(flag, value);
    if (flag === '--ddl-lock-timeout') parsed.ddlLockTimeoutMs = parseMs(flag, value);
    if (flag === '--connect-timeout') parsed.connectTimeoutMs = parseMs(flag, value);
    if (flag === '--older-than') parsed.olderThanMs = parseDuration(flag, value);
    if (flag === '--batch-size') parsed.batchSize = parseMs(flag, value);
  }
  if (command === 'prune' && parsed.olderThanMs === undefined)
    throw new UsageError('prune needs --older-than, like --older-than 30d');
  return parsed;
}

/** Where the database URL comes from, and whether using the default is allowed here. */
function resolveTarget(
  parsed: ParsedArgs,
  env: NodeJS.ProcessEnv,
  interactive: boolean,
): { url: string; note?: string } {
  if (parsed.db !== undefined) return { url: parsed.db };
  const fromEnv = env.TASKFENCE_DATABASE_URL?.trim();
  if (fromEnv) return { url: fromEnv };
  const ci = env.CI !== undefined && env.CI !== '' && env.CI !== '0' && env.CI.toLowerCase() !== 'false';
  if ((parsed.command === 'migrate' || parsed.command === 'prune') && (ci || !interactive)) {
    throw new UsageError(
      `no database given: pass --db URL or set TASKFENCE_DATABASE_URL (migrate does not use the default sqlite:./taskfence.db when ${ci ? 'CI is set' : 'standard input is not a terminal'})`,
    );
  }
  return {
    url: 'sqlite:./taskfence.db',
    note: 'no --db and no TASKFENCE_DATABASE_URL: using the default sqlite:./taskfence.db',
  };
}

function packageVersion(): string {
  for (const rel of ['../package.json', '../../package.json']) {
    try {
      const pkg = JSON.parse(readFileSync(new URL(rel, import.meta.url), 'utf8')) as {
        name?: string;
        version?: string;
      };
      if (pkg.name === 'taskfence' && pkg.version) return pkg.version;
    } catch {
      // try the next place
    }
  }
  return 'unknown';
}

/** A one-line refusal about an SQLite file, before the driver is asked (it would speak of servers, or create the file). */
class FileError extends Error {}

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

async function openDialect(url: string, parsed: ParsedArgs, note: (line: string) => void): Promise<StoreDialect> {
  const location = parseDatabaseUrl(url);
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
  // `?schema=`: the install in that schema (migrate creates the schema, as openStore does).
  const schema = location.schema;
  try {
    const dialect = await Promise.race([
      openPostgresDialect(location.connectionString, {
        connectTimeoutMs,
        poolSize: 3,
        ...(schema === undefined ? {} : { schema }),
      }),
      watchdog,
    ]);
    if (schema !== undefined && parsed.command === 'migrate') await ensureSchema(dialect, schema);
    return dialect;
  } finally {
    clearTimeout(timer);
  }
}

function describeHolder(holder: MigrationLockHolder | null): string {
  if (!holder) return 'another migrator (SQLite: another writer)';
  const since = holder.since === null ? '' : `, since ${new Date(holder.since).toISOString()}`;
  return `pid ${holder.pid} (application ${JSON.stringify(holder.application)}${holder.clientAddress ? ` from ${holder.clientAddress}` : ''}${since})`;
}

function describeEvent(event: MigrationEvent): string {
  switch (event.type) {
    case 'baseline':
      return `adopted the database as version ${formatVersion(event.version)} (baseline)`;
    case 'applying':
    case 'reverting':
      return `${event.type} ${formatVersion(event.version)} ${event.name} …`;
    case 'applied':
    case 'reverted':
      return `${event.type} ${formatVersion(event.version)} ${event.name} in ${event.durationMs} ms`;
    case 'skipped':
      return `skipped ${formatVersion(event.version)} ${event.name}: ${event.reason}`;
    case 'progress':
      return `  ${event.message}`;
    case 'waiting':
      return `waiting ${Math.round(event.waitedMs / 1000)} s for the migration lock, held by ${describeHolder(event.holder)}`;
  }
}

/**
 * Progress of long backfills: on a terminal one redrawn line (bar, percent, rows/s, ETA);
 * otherwise a plain line at most every few seconds.
 */
export class ProgressRenderer {
  #started = 0;
  #lastPlain = -Infinity;
  #drawn = false;
  constructor(
    private readonly write: (text: string) => void,
    private readonly tty: boolean,
    private readonly plainEveryMs = 2_000,
    private readonly clock: () => number = Date.now,
  ) {}

  start(): void {
    this.#started = this.clock();
    this.#lastPlain = -Infinity;
  }

  update(event: Extract<MigrationEvent, { type: 'progress' }>): void {
    const now = this.clock();
    if (event.done === undefined) {
      this.finish();
      this.write(`  ${event.message}\n`);
      return;
    }
    const elapsed = Math.max(1, now - this.#started) / 1000;
    const rate = Math.round(event.done / elapsed);
    const total = event.total;
    const pct = total ? Math.min(100, Math.floor((event.done / total) * 100)) : undefined;
    const eta = total && rate > 0 ? Math.max(0, Math.ceil((total - event.done) / rate)) : undefined;
    const counts = `${event.done}${total !== undefined ? `/${total}` : ''} rows, ${rate} rows/s${eta !== undefined ? `, ETA ${eta} s` : ''}`;
    if (this.tty) {
      const width = 24;
      const filled = pct === undefined ? 0 : Math.round((pct / 100) * width);
      const bar =
        pct === undefined ? '' : `[${'#'.repeat(filled)}${'-'.repeat(width - filled)}] ${String(pct).padStart(3)}% `;
      this.write(`\r\x1b[2K  ${formatVersion(event.version)} ${bar}${counts}`);
      this.#drawn = true;
      return;
    }
    if (now - this.#lastPlain >= this.plainEveryMs) {
      this.#lastPlain = now;
      this.write(`  ${formatVersion(event.version)} backfill: ${pct !== undefined ? `${pct}%, ` : ''}${counts}\n`);
    }
  }

  finish(): void {
    if (this.#drawn) this.write('\n');
    this.#drawn = false;
  }
}

interface Io {
  out: (line: string) => void;
  err: (line: string) => void;
  /** Raw writes for the progress renderer. */
  write: (text: string) => void;
  tty: boolean;
  interactive: boolean;
  env: NodeJS.ProcessEnv;
}

function statusExit(status: MigrationStatus): number {
  if (status.unknown.length > 0) return CHECK_EXIT.unknown;
  if (status.modified.length > 0) return CHECK_EXIT.modified;
  if (status.baselineRequired) return CHECK_EXIT.baselineRequired;
  if (status.pending.length > 0) return CHECK_EXIT.pending;
  return CHECK_EXIT.upToDate;
}

async function run(parsed: ParsedArgs, io: Io): Promise<number> {
  const { out } = io;
  const target = resolveTarget(parsed, io.env, io.interactive);
  if (target.note && !parsed.json) out(`taskfence: ${target.note}`);
  const shown = redactDatabaseUrl(target.url);
  if (parsed.command === 'doctor') return runDoctorCommand({ db: target.url, json: parsed.json }, out);
  if (parsed.command === 'prune') return prune(target.url, shown, parsed, out);
  const dialect = await openDialect(target.url, parsed, (line) => {
    if (!parsed.json) out(`-- ${line}`);
  });
  const migrator = new Migrator(dialect);
  try {
    if (parsed.command === 'migrate') {
      const progress = new ProgressRenderer(io.write, io.tty);
      const result = await migrator.migrate({
        ...(parsed.to !== undefined ? { to: parsed.to } : {}),
        ...(parsed.baseline !== undefined ? { baseline: parsed.baseline } : {}),
        ...(parsed.lockWaitMs !== undefined ? { migrationLockWaitMs: parsed.lockWaitMs } : {}),
        ...(parsed.ddlLockTimeoutMs !== undefined ? { ddlLockTimeoutMs: parsed.ddlLockTimeoutMs } : {}),
        allowDataLoss: parsed.allowDataLoss,
        onEvent: (event) => {
          if (parsed.json) return out(JSON.stringify({ ...event, at: Date.now() }));
          if (event.type === 'applying') progress.start();
          if (event.type === 'progress') return progress.update(event);
          progress.finish();
          out(describeEvent(event));
        },
      });
      const changed = result.applied.length + result.reverted.length;
      if (parsed.json) {
        out(JSON.stringify({ type: 'done', database: shown, ...result }));
        return 0;
      }
      out(
        changed === 0
          ? `${shown} is at version ${formatVersion(result.toVersion)}; nothing to do`
          : `${shown} migrated from ${formatVersion(result.fromVersion)} to ${formatVersion(result.toVersion)}`,
      );
      return 0;
    }
    if (parsed.command === 'status') {
      const status = await migrator.status();
      const exit = parsed.check ? statusExit(status) : 0;
      if (parsed.json) {
        out(
          JSON.stringify({
            database: shown,
            dialect: dialect.kind,
            currentVersion: status.currentVersion,
            latestVersion: status.latestVersion,
            baselineRequired: status.baselineRequired,
            upToDate: statusExit(status) === 0,
            applied: status.applied,
            pending: status.pending,
            modified: status.modified,
            unknown: status.unknown,
          }),
        );
        return exit;
      }
      out(`database: ${shown} (${dialect.kind})`);
      out(`version:  ${formatVersion(status.currentVersion)} (latest ${formatVersion(status.latestVersion)})`);
      if (status.baselineRequired)
        out('baseline required: the database has tables but no taskfence history (see migrate --baseline)');
      for (const a of status.applied)
        out(`  applied  ${formatVersion(a.version)} ${a.name}  ${new Date(a.appliedAt).toISOString()}`);
      for (const p of status.pending) out(`  pending  ${formatVersion(p.version)} ${p.name}`);
      for (const m of status.modified)
        out(`  MODIFIED ${formatVersion(m.version)} ${m.name} (edited after it was applied)`);
      for (const u of status.unknown) out(`  UNKNOWN  ${formatVersion(u.version)} ${u.name} (not in this taskfence)`);
      return exit;
    }
    const steps = await migrator.plan(parsed.to !== undefined ? { to: parsed.to } : {});
    if (parsed.json) {
      out(
        JSON.stringify({
          database: shown,
          dialect: dialect.kind,
          destructive: steps.some((s) => s.destructive.length > 0),
          steps,
        }),
      );
      return 0;
    }
    printPlan(steps, out);
    return 0;
  } finally {
    await dialect.close().catch(() => {});
  }
}

function printPlan(steps: readonly PlanStep[], out: (line: string) => void): void {
  if (steps.length === 0) out('-- nothing to do');
  for (const step of steps) {
    const loss = step.destructive.map(
      (l) =>
        `${l.column ? `column ${l.table}.${l.column}` : `table ${l.table}`} (${l.rows} row${l.rows === 1 ? '' : 's'})`,
    );
    out(
      `-- ${formatVersion(step.version)} ${step.name} (${step.direction})${loss.length > 0 ? ` DESTRUCTIVE: drops ${loss.join(', ')}; needs --allow-data-loss` : ''}`,
    );
    for (const note of step.notes) out(`--   note: ${note}`);
    for (const statement of step.statements) out(`${statement};`);
  }
}

/** One line that says what to do. */
export function errorLine(error: unknown, verbose = false): string {
  if (verbose && error instanceof Error && error.stack) return `taskfence: ${error.stack}`;
  const oneLine = (text: string) => text.replace(/\s*\n\s*/g, ' ').trim();
  if (error instanceof FileError || error instanceof TaskfenceError) return `taskfence: ${oneLine(error.message)}`;
  const code = (error as { code?: unknown } | null)?.code;
  if (code === 'SQLITE_READONLY' || code === 'SQLITE_READONLY_DBMOVED')
    return "taskfence: the SQLite file is read-only here; migrate needs to write it (check its permissions and its directory's)";
  if (code === 'SQLITE_NOTADB') return 'taskfence: the file is not an SQLite database';
  const message = error instanceof Error ? error.message : String(error);
  return `taskfence: unexpected error: ${oneLine(message)} (run with --verbose for details)`;
}

/** `taskfence prune --older-than D [--dry-run] [--batch-size N]`: deletes what is finished and old, printing counts per table. */
async function prune(url: string, shown: string, parsed: ParsedArgs, out: (line: string) => void): Promise<number> {
  const store = await openStore({
    url,
    ...(parsed.connectTimeoutMs !== undefined ? { connectTimeoutMs: parsed.connectTimeoutMs } : {}),
  });
  try {
    const result = await store.maintenance.prune({
      olderThanMs: parsed.olderThanMs!,
      dryRun: parsed.dryRun,
      ...(parsed.batchSize !== undefined ? { batchSize: parsed.batchSize } : {}),
    });
    if (parsed.json) {
      out(JSON.stringify({ database: shown, ...result }));
      return 0;
    }
    const verb = result.dryRun ? 'would delete' : 'deleted';
    for (const [table, n] of Object.entries(result.deleted)) out(`${table.padEnd(18)} ${verb} ${n}`);
    out(`${shown}: ${verb} rows finished before ${new Date(result.cutoff).toISOString()}`);
    return 0;
  } finally {
    await store.close();
  }
}

/** Runs the CLI; resolves to the exit code. */
export async function main(
  argv: readonly string[],
  out = (l: string) => console.log(l),
  err = (l: string) => console.error(l),
  io: Partial<Pick<Io, 'write' | 'tty' | 'interactive' | 'env'>> = {},
): Promise<number> {
  let parsed: ParsedArgs;
  try {
    parsed = parseArgs(argv);
  } catch (error) {
    if (error instanceof UsageError) {
      err(`taskfence: ${error.message}. Run \`taskfence --help\` for usage.`);
      return 2;
    }
    throw error;
  }
  if (parsed.command === 'help') {
    out(HELP);
    return 0;
  }
  if (parsed.command === 'version') {
    out(`taskfence ${packageVersion()}`);
    return 0;
  }
  try {
    return await run(parsed, {
      out,
      err,
      write: io.write ?? ((text) => void process.stdout.write(text)),
      tty: io.tty ?? Boolean(process.stdout.isTTY),
      interactive: io.interactive ?? Boolean(process.stdin.isTTY),
      env: io.env ?? process.env,
    });
  } catch (error) {
    if (error instanceof UsageError) {
      err(`taskfence: ${error.message}`);
      return 2;
    }
    err(errorLine(error, parsed.verbose));
    return 1;
  }
}

const invokedDirectly = (() => {
  try {
    return (
      process.argv[1] !== undefined && realpathSync(process.argv[1]) === realpathSync(fileURLToPath(import.meta.url))
    );
  } catch {
    return false;
  }
})();

if (invokedDirectly) {
  const verbose = process.argv.includes('--verbose');
  // Last line of defence: whatever escapes (an 'error' event, a stray rejection) is one line and exit 1.
  const fatal = (error: unknown) => {
    console.error(errorLine(error, verbose));
    process.exit(1);
  };
  process.on('uncaughtException', fatal);
  process.on('unhandledRejection', fatal);
  main(process.argv.slice(2)).then((code) => process.exit(code), fatal);
}
