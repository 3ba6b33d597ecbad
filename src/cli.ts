#!/usr/bin/env node
/**
 * The `taskfence` command (package.json `bin`: dist/cli.js). Parsing lives in cli/args.ts, opening
 * the database in cli/open.ts, the commands in cli/commands.ts, their output in cli/output.ts.
 */
import { readFileSync, realpathSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { HELP, UsageError, parseArgs, type ParsedArgs } from './cli/args.js';
import { run, type Io } from './cli/commands.js';
import { errorLine } from './cli/output.js';
import { scrubSecrets, secretsIn } from './database-url-redaction.js';
import { runOpsCommand } from './cli/ops.js';

export { CHECK_EXIT, parseArgs } from './cli/args.js';
export { ProgressRenderer, errorLine } from './cli/output.js';

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

/**
 * Every password the command line and environment hold: the `--db` URL's, `TASKFENCE_DATABASE_URL`'s
 * and `PGPASSWORD`. Whatever the CLI prints is scrubbed of them, on top of redacting URLs where they
 * are printed, so a driver message or an unforeseen path cannot echo one.
 */
export function cliSecrets(argv: readonly string[], env: NodeJS.ProcessEnv): string[] {
  const urls: string[] = [];
  argv.forEach((arg, i) => {
    if (arg === '--db' && argv[i + 1] !== undefined) urls.push(argv[i + 1]!);
    if (arg.startsWith('--db=')) urls.push(arg.slice('--db='.length));
  });
  if (env.TASKFENCE_DATABASE_URL) urls.push(env.TASKFENCE_DATABASE_URL);
  const secrets = urls.flatMap(secretsIn);
  if (env.PGPASSWORD && env.PGPASSWORD.length > 1) secrets.push(env.PGPASSWORD);
  return secrets;
}

/** Runs the CLI; resolves to the exit code. */
export async function main(
  argv: readonly string[],
  printOut = (l: string) => console.log(l),
  printErr = (l: string) => console.error(l),
  io: Partial<Pick<Io, 'write' | 'tty' | 'interactive' | 'env'>> = {},
): Promise<number> {
  const secrets = cliSecrets(argv, io.env ?? process.env);
  const out = (line: string) => printOut(scrubSecrets(line, secrets));
  const err = (line: string) => printErr(scrubSecrets(line, secrets));
  const write = io.write ?? ((text: string) => void process.stdout.write(text));
  if (argv[0] === 'inspect' || argv[0] === 'ui') {
    return runOpsCommand(argv, {
      out,
      err,
      write: (text) => write(scrubSecrets(text, secrets)),
      tty: io.tty ?? Boolean(process.stdout.isTTY),
      interactive: io.interactive ?? Boolean(process.stdin.isTTY),
      env: io.env ?? process.env,
    });
  }
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
      write: (text) => write(scrubSecrets(text, secrets)),
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
  const secrets = cliSecrets(process.argv.slice(2), process.env);
  const fatal = (error: unknown) => {
    console.error(scrubSecrets(errorLine(error, verbose), secrets));
    process.exit(1);
  };
  process.on('uncaughtException', fatal);
  process.on('unhandledRejection', fatal);
  main(process.argv.slice(2)).then((code) => process.exit(code), fatal);
}
