import { parseDatabaseUrl } from '../config.js';

export const HELP = `taskfence — migrate and inspect a taskfence database

Usage:
  taskfence migrate [--db URL] [--to V] [--baseline V] [--allow-data-loss] [--force]
                    [--lock-wait MS] [--ddl-lock-timeout MS] [--batch-size N] [--pause-ms MS] [--json]
  taskfence status  [--db URL] [--json] [--check]
  taskfence plan    [--db URL] [--to V] [--json]
  taskfence doctor  [--db URL] [--json]        (schema drift and guarantee self-test)
  taskfence prune   [--db URL] --older-than D [--dry-run] [--batch-size N] [--json]
  taskfence inspect [task <id>] [--db URL] [--json]   (who holds what; taskfence inspect --help)
  taskfence ui      [--db URL] [--port N] [--allow-actions]   (the same, live, in a browser)
  taskfence --version | --help

  --db URL              sqlite:<path>, sqlite::memory:, postgres://… or postgresql://…
                        (default: $TASKFENCE_DATABASE_URL, else sqlite:./taskfence.db —
                        but migrate refuses the default when CI is set or stdin is not a terminal)
  --schema NAME         PostgreSQL, every command: the schema taskfence's tables live in, like
                        ?schema=NAME in the URL (default: the connection's current schema)
  --older-than D        prune: delete what finished longer ago than D (30d, 12h, 90m, 45s, or ms)
  --dry-run             prune: count what would be deleted, delete nothing
  --to V                migrate (or plan) up or down to version V; 0 reverts everything
  --baseline V          adopt a database that has taskfence tables but no history as version V
                        (its tables are verified first), then migrate on
  --allow-data-loss     let down steps drop tables or columns that hold rows (refused otherwise)
  --lock-wait MS        how long to wait for another migrator's migration lock (default 60000);
                        while waiting, who holds it is printed every few seconds
  --ddl-lock-timeout MS PostgreSQL: how long migration DDL keeps retrying for a busy table's lock, each
                        attempt under a 100 ms lock_timeout so the application never queues behind it
                        (default 10000; 0 = one attempt that waits as long as it takes)
  --batch-size N        migrate: rows per backfill batch, each its own transaction (alone: every
                        batch; default: at most 5000, sized by --batch-time-ms); prune: rows per
                        delete batch
  --batch-time-ms MS    migrate: what each backfill batch should take; its size follows the last
                        batch's time (default 100 without --batch-size; 0 = fixed --batch-size)
  --pause-ms MS         migrate: pause between backfill batches, to throttle them (default: 0 on
                        PostgreSQL; on SQLite as long as the batch took, so waiting writers get in)
  --force               migrate --to: go down even though open stores of a running release need a
                        higher version (refused otherwise)
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

/** A command line that cannot run as given: exit 2 with one line. */
export class UsageError extends Error {}

export type Command = 'migrate' | 'status' | 'plan' | 'doctor' | 'prune' | 'inspect' | 'ui' | 'help' | 'version';

export interface ParsedArgs {
  command: Command;
  /** The --db value, if given. */
  db?: string;
  to?: number;
  baseline?: number;
  lockWaitMs?: number;
  ddlLockTimeoutMs?: number;
  connectTimeoutMs?: number;
  /** --schema: the PostgreSQL schema taskfence's tables live in. */
  schema?: string;
  /** prune: how old finished rows must be, in ms. */
  olderThanMs?: number;
  /** migrate: rows per backfill batch; prune: rows per delete batch. */
  batchSize?: number;
  /** migrate: pause between backfill batches, in ms. */
  pauseMs?: number;
  batchTimeMs?: number;
  /** migrate: go down even though a running release needs a higher version. */
  force: boolean;
  dryRun: boolean;
  allowDataLoss: boolean;
  json: boolean;
  check: boolean;
  verbose: boolean;
}

const COMMON = ['--db', '--schema', '--connect-timeout', '--verbose'];
const ALLOWED: Record<'migrate' | 'status' | 'plan' | 'doctor' | 'prune', readonly string[]> = {
  migrate: [
    ...COMMON,
    '--to',
    '--baseline',
    '--lock-wait',
    '--lock-timeout',
    '--ddl-lock-timeout',
    '--batch-size',
    '--pause-ms',
    '--batch-time-ms',
    '--allow-data-loss',
    '--force',
    '--json',
  ],
  status: [...COMMON, '--json', '--check'],
  plan: [...COMMON, '--to', '--json'],
  doctor: [...COMMON, '--json'],
  prune: [...COMMON, '--older-than', '--batch-size', '--dry-run', '--json'],
};
const FLAGS = new Set(['--json', '--check', '--verbose', '--allow-data-loss', '--dry-run', '--force']);

/** `30d`, `12h`, `90m`, `45s` or a number of milliseconds. */
export function parseDuration(flag: string, value: string): number {
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

/** Parses the command line (without `node` and the script); throws `UsageError` on anything it does not take. */
export function parseArgs(argv: readonly string[]): ParsedArgs {
  const args = [...argv];
  const base = { allowDataLoss: false, json: false, check: false, verbose: false, dryRun: false, force: false };
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
      if (flag === '--force') parsed.force = true;
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
    if (flag === '--schema') parsed.schema = value;
    if (flag === '--older-than') parsed.olderThanMs = parseDuration(flag, value);
    if (flag === '--batch-size') {
      parsed.batchSize = parseMs(flag, value);
      if (parsed.batchSize < 1) throw new UsageError('--batch-size takes a number of rows, 1 or more');
    }
    if (flag === '--pause-ms') parsed.pauseMs = parseMs(flag, value);
    if (flag === '--batch-time-ms') parsed.batchTimeMs = parseMs(flag, value);
  }
  if (command === 'prune' && parsed.olderThanMs === undefined)
    throw new UsageError('prune needs --older-than, like --older-than 30d');
  return parsed;
}

/** Where the database URL comes from, and whether using the default is allowed here. */
export function resolveTarget(
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

/**
 * The PostgreSQL schema a command works in: `--schema`, else the URL's `?schema=`. Refuses
 * `--schema` on SQLite and a `--schema` that contradicts the URL (`UsageError`).
 */
export function schemaFor(parsed: ParsedArgs, url: string): string | undefined {
  const location = parseDatabaseUrl(url);
  if (location.dialect === 'sqlite') {
    if (parsed.schema !== undefined)
      throw new UsageError('--schema is a PostgreSQL option; an SQLite file has one schema');
    return undefined;
  }
  if (parsed.schema !== undefined && location.schema !== undefined && parsed.schema !== location.schema)
    throw new UsageError(
      `--schema says ${JSON.stringify(parsed.schema)} but the URL says ${JSON.stringify(location.schema)}`,
    );
  return parsed.schema ?? location.schema;
}
