/**
 * The operator commands: `taskfence inspect` (who holds what, once) and `taskfence ui` (the same,
 * live, in a browser). Both only read unless `ui --allow-actions` is given. Their arguments are
 * parsed here, apart from cli/args.ts, and they open the database through cli/open.ts like
 * `status` does (SQLite read-only).
 */
import { redactDatabaseUrl } from '../config.js';
import { explainTask, inspectStore } from '../inspect/index.js';
import { formatExplanation, formatSnapshot } from '../inspect/format.js';
import { UsageError, parseDuration, type ParsedArgs } from './args.js';
import type { Io } from './commands.js';
import { openDialect } from './open.js';
import { errorLine } from './output.js';

export const OPS_HELP = `Usage:
  taskfence inspect [task <id>] [--db URL] [--json] [--stale-after D] [--limit N]
  taskfence ui      [--db URL] [--port N] [--host H] [--allow-actions] [--stale-after D]

  inspect               runs (heartbeat age, stale), active dispatches per terminal, workspace
                        locks and task leases (holder, token, time left), path leases per
                        workspace as a tree, semaphores (live slots), inboxes (pending, in
                        flight, redelivered, dead), ownership (generation, cleanup), the ready
                        queue (ready, blocked by a dependency or a gate); read-only (SQLite
                        opened read-only). --json: one object with the keys runs, dispatches,
                        locks, paths, semaphores, inbox, ownership, readyQueue
  inspect task <id>     why that task is where it is: dependencies, run, gates, dispatches, leases
  ui                    the same views live in a browser at http://127.0.0.1:PORT (default 4747),
                        read-only; --allow-actions adds operator actions that need the token it
                        prints at start, each recorded in the audit trail
  --stale-after D       a running run without a heartbeat for D is stale (default 60s)
  --limit N             at most N rows per list (default 200)

Exit codes: 0 success; 1 failure (one line on stderr: unreachable database, schema behind,
no such task); 2 usage error.`;

/** The parsed command line of `inspect` or `ui`. */
export interface OpsArgs {
  readonly command: 'inspect' | 'ui';
  /** `inspect task <id>`. */
  readonly taskId?: string;
  readonly db?: string;
  readonly schema?: string;
  readonly json: boolean;
  readonly staleAfterMs?: number;
  readonly limit?: number;
  readonly port?: number;
  readonly host?: string;
  readonly allowActions: boolean;
  readonly connectTimeoutMs?: number;
  readonly verbose: boolean;
  readonly help: boolean;
}

const OPTIONS = {
  inspect: ['--db', '--schema', '--json', '--stale-after', '--limit', '--connect-timeout', '--verbose'],
  ui: [
    '--db',
    '--schema',
    '--port',
    '--host',
    '--allow-actions',
    '--stale-after',
    '--limit',
    '--connect-timeout',
    '--verbose',
  ],
} as const;
const FLAGS = new Set(['--json', '--allow-actions', '--verbose']);

function wholeNumber(flag: string, value: string, max: number): number {
  if (!/^\d+$/.test(value) || Number(value) > max) throw new UsageError(`${flag} takes a whole number up to ${max}`);
  return Number(value);
}

/** Parses `inspect …` or `ui …` (argv without `node` and the script); throws `UsageError`. */
export function parseOpsArgs(argv: readonly string[]): OpsArgs {
  const args = [...argv];
  const command = args.shift();
  if (command !== 'inspect' && command !== 'ui') throw new UsageError(`unknown command "${command}"`);
  const parsed: { -readonly [K in keyof OpsArgs]: OpsArgs[K] } = {
    command,
    json: false,
    allowActions: false,
    verbose: false,
    help: false,
  };
  if (command === 'inspect' && args[0] === 'task') {
    args.shift();
    const id = args.shift();
    if (id === undefined || id.startsWith('--')) throw new UsageError('inspect task needs a task id');
    parsed.taskId = id;
  }
  while (args.length > 0) {
    const arg = args.shift()!;
    if (arg === '--help' || arg === '-h') {
      parsed.help = true;
      continue;
    }
    const [flag, inline] =
      arg.startsWith('--') && arg.includes('=')
        ? [arg.slice(0, arg.indexOf('=')), arg.slice(arg.indexOf('=') + 1)]
        : [arg, undefined];
    if (!(OPTIONS[command] as readonly string[]).includes(flag))
      throw new UsageError(
        flag.startsWith('-') ? `"${flag}" is not an option of ${command}` : `unexpected argument "${flag}"`,
      );
    if (FLAGS.has(flag)) {
      if (flag === '--json') parsed.json = true;
      if (flag === '--allow-actions') parsed.allowActions = true;
      if (flag === '--verbose') parsed.verbose = true;
      continue;
    }
    const value = inline ?? args.shift();
    if (value === undefined) throw new UsageError(`${flag} needs a value`);
    if (flag === '--db') parsed.db = value;
    if (flag === '--schema') parsed.schema = value;
    if (flag === '--stale-after') parsed.staleAfterMs = parseDuration(flag, value);
    if (flag === '--limit') parsed.limit = wholeNumber(flag, value, 10_000);
    if (flag === '--port') parsed.port = wholeNumber(flag, value, 65_535);
    if (flag === '--host') parsed.host = value;
    if (flag === '--connect-timeout') parsed.connectTimeoutMs = wholeNumber(flag, value, 3_600_000);
  }
  if (parsed.staleAfterMs === 0) throw new UsageError('--stale-after must be more than 0');
  if (parsed.limit === 0) throw new UsageError('--limit must be at least 1');
  return parsed;
}

/** The database URL: `--db`, else `TASKFENCE_DATABASE_URL`, else the default file (said so, unless --json). */
export function opsTarget(args: OpsArgs, env: NodeJS.ProcessEnv): { url: string; note?: string } {
  if (args.db !== undefined) return { url: args.db };
  const fromEnv = env.TASKFENCE_DATABASE_URL?.trim();
  if (fromEnv) return { url: fromEnv };
  return {
    url: 'sqlite:./taskfence.db',
    note: 'no --db and no TASKFENCE_DATABASE_URL: using the default sqlite:./taskfence.db',
  };
}

/** What cli/open.ts and schemaFor read from a command line. */
export function asParsedArgs(args: OpsArgs): ParsedArgs {
  return {
    command: args.command,
    force: false,
    ...(args.db === undefined ? {} : { db: args.db }),
    ...(args.schema === undefined ? {} : { schema: args.schema }),
    ...(args.connectTimeoutMs === undefined ? {} : { connectTimeoutMs: args.connectTimeoutMs }),
    dryRun: false,
    allowDataLoss: false,
    json: args.json,
    check: false,
    verbose: args.verbose,
  };
}

/** The terminal's width, else `$COLUMNS`, else 100. */
function outputWidth(io: Io): number {
  const columns = io.tty ? process.stdout.columns : Number(io.env.COLUMNS);
  return Number.isSafeInteger(columns) && columns >= 40 ? columns : 100;
}

/** `taskfence inspect [task <id>]`: one snapshot (or one task's explanation), as text or one JSON object. */
export async function runInspect(args: OpsArgs, io: Io): Promise<number> {
  const target = opsTarget(args, io.env);
  if (target.note && !args.json) io.out(`taskfence: ${target.note}`);
  const dialect = await openDialect(target.url, asParsedArgs(args), (line) => {
    if (!args.json) io.out(`taskfence: ${line}`);
  });
  const options = {
    ...(args.staleAfterMs === undefined ? {} : { staleAfterMs: args.staleAfterMs }),
    ...(args.limit === undefined ? {} : { limit: args.limit }),
  };
  try {
    const width = outputWidth(io);
    if (args.taskId !== undefined) {
      const explanation = await explainTask({ dialect }, args.taskId, options);
      if (args.json) io.out(JSON.stringify(explanation));
      else for (const line of formatExplanation(explanation, width)) io.out(line);
      return 0;
    }
    const snapshot = await inspectStore({ dialect }, options);
    if (args.json) io.out(JSON.stringify(snapshot));
    else
      for (const line of formatSnapshot(snapshot, `taskfence inspect ${redactDatabaseUrl(target.url)}`, width))
        io.out(line);
    return 0;
  } finally {
    await dialect.close().catch(() => {});
  }
}

/** Runs `inspect …` or `ui …`; resolves to the exit code (2 on usage errors, 1 with one line on failures). */
export async function runOpsCommand(argv: readonly string[], io: Io): Promise<number> {
  let args: OpsArgs;
  try {
    args = parseOpsArgs(argv);
  } catch (error) {
    if (error instanceof UsageError) {
      io.err(`taskfence: ${error.message}. Run \`taskfence inspect --help\` for usage.`);
      return 2;
    }
    throw error;
  }
  if (args.help) {
    io.out(OPS_HELP);
    return 0;
  }
  try {
    if (args.command === 'inspect') return await runInspect(args, io);
    const { runUiCommand } = await import('../ui/command.js');
    return await runUiCommand(args, io);
  } catch (error) {
    if (error instanceof UsageError) {
      io.err(`taskfence: ${error.message}`);
      return 2;
    }
    io.err(errorLine(error, args.verbose));
    return 1;
  }
}
