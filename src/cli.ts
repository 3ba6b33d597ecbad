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

/** Runs the CLI; resolves to the exit code. */
export async function main(
  argv: readonly string[],
  out = (l: string) => console.log(l),
  err = (l: string) => console.error(l),
  io: Partial<Pick<Io, 'write' | 'tty' | 'interactive' | 'env'>> = {},
): Promise<number> {
  if (argv[0] === 'inspect' || argv[0] === 'ui') {
    const write = io.write ?? ((text: string) => void process.stdout.write(text));
    return runOpsCommand(argv, {
      out,
      err,
      write,
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
