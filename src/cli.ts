#!/usr/bin/env node
import { realpathSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { defaultDatabaseUrl, redactDatabaseUrl } from './config.js';
import {
  BaselineMismatchError,
  BaselineRequiredError,
  DatabaseUnavailableError,
  InvalidDatabaseUrlError,
  MigrationChecksumMismatchError,
  MigrationLockTimeoutError,
  TaskfenceError,
  UnknownMigrationsError,
  formatVersion,
} from './errors.js';
import type { MigrationEvent } from './migrator/migrator.js';
import type { MigrationLockHolder } from './dialects/types.js';
import { openStore, type Store } from './store.js';

const HELP = `taskfence — migrate and inspect a taskfence database

Usage:
  taskfence migrate [--db URL] [--to V] [--baseline V] [--lock-timeout MS]
  taskfence status  [--db URL] [--json]
  taskfence plan    [--db URL] [--to V]
  taskfence --help

  --db URL         sqlite:<path>, sqlite::memory:, postgres://… or postgresql://…
                   (default: $TASKFENCE_DATABASE_URL, else sqlite:./taskfence.db)
  --to V           migrate (or plan) up or down to version V; 0 reverts everything
  --baseline V     adopt a database that has taskfence tables but no history as version V
                   (its tables are verified first), then migrate on
  --lock-timeout   how long to wait for another migrator, in ms (default 60000)
  --json           status as one JSON object: applied, pending, modified, unknown

Versions are numbers: 5 and 0005 mean the same.
Exit codes: 0 success, 1 failure, 2 usage error.`;

class UsageError extends Error {}

interface ParsedArgs {
  command: 'migrate' | 'status' | 'plan' | 'help';
  db: string;
  to?: number;
  baseline?: number;
  lockTimeoutMs?: number;
  json: boolean;
}

const ALLOWED: Record<ParsedArgs['command'], readonly string[]> = {
  migrate: ['--db', '--to', '--baseline', '--lock-timeout'],
  status: ['--db', '--json'],
  plan: ['--db', '--to'],
  help: [],
};

function parseVersion(flag: string, value: string | undefined): number {
  if (value === undefined || !/^\d+$/.test(value)) throw new UsageError(`${flag} takes a version number, like 52 or 0052`);
  return Number(value);
}

export function parseArgs(argv: readonly string[]): ParsedArgs {
  const args = [...argv];
  if (args.length === 0 || args.includes('--help') || args.includes('-h') || args[0] === 'help') {
    return { command: 'help', db: '', json: false };
  }
  const command = args.shift()!;
  if (command !== 'migrate' && command !== 'status' && command !== 'plan') {
    throw new UsageError(`unknown command "${command}"`);
  }
  const parsed: ParsedArgs = { command, db: defaultDatabaseUrl(), json: false };
  while (args.length > 0) {
    const arg = args.shift()!;
    const [flag, inline] = arg.startsWith('--') && arg.includes('=') ? [arg.slice(0, arg.indexOf('=')), arg.slice(arg.indexOf('=') + 1)] : [arg, undefined];
    if (!ALLOWED[command].includes(flag)) throw new UsageError(`"${flag}" is not an option of ${command}`);
    if (flag === '--json') {
      parsed.json = true;
      continue;
    }
    const value = inline ?? args.shift();
    if (value === undefined) throw new UsageError(`${flag} needs a value`);
    if (flag === '--db') parsed.db = value;
    if (flag === '--to') parsed.to = parseVersion(flag, value);
    if (flag === '--baseline') parsed.baseline = parseVersion(flag, value);
    if (flag === '--lock-timeout') {
      if (!/^\d+$/.test(value)) throw new UsageError('--lock-timeout takes a number of milliseconds');
      parsed.lockTimeoutMs = Number(value);
    }
  }
  return parsed;
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

async function run(parsed: ParsedArgs, out: (line: string) => void): Promise<void> {
  const store: Store = await openStore(parsed.db);
  try {
    if (parsed.command === 'migrate') {
      const result = await store.migrate({
        ...(parsed.to !== undefined ? { to: parsed.to } : {}),
        ...(parsed.baseline !== undefined ? { baseline: parsed.baseline } : {}),
        ...(parsed.lockTimeoutMs !== undefined ? { lockTimeoutMs: parsed.lockTimeoutMs } : {}),
        onEvent: (event) => out(describeEvent(event)),
      });
      const changed = result.applied.length + result.reverted.length;
      out(
        changed === 0
          ? `${redactDatabaseUrl(parsed.db)} is at version ${formatVersion(result.toVersion)}; nothing to do`
          : `${redactDatabaseUrl(parsed.db)} migrated from ${formatVersion(result.fromVersion)} to ${formatVersion(result.toVersion)}`,
      );
      return;
    }
    if (parsed.command === 'status') {
      const status = await store.migrationStatus();
      if (parsed.json) {
        out(
          JSON.stringify({
            database: redactDatabaseUrl(parsed.db),
            dialect: store.dialect.kind,
            currentVersion: status.currentVersion,
            latestVersion: status.latestVersion,
            baselineRequired: status.baselineRequired,
            applied: status.applied,
            pending: status.pending,
            modified: status.modified,
            unknown: status.unknown,
          }),
        );
        return;
      }
      out(`database: ${redactDatabaseUrl(parsed.db)} (${store.dialect.kind})`);
      out(`version:  ${formatVersion(status.currentVersion)} (latest ${formatVersion(status.latestVersion)})`);
      if (status.baselineRequired) out('baseline required: the database has taskfence tables but no history (see migrate --baseline)');
      for (const a of status.applied) out(`  applied  ${formatVersion(a.version)} ${a.name}  ${new Date(a.appliedAt).toISOString()}`);
      for (const p of status.pending) out(`  pending  ${formatVersion(p.version)} ${p.name}`);
      for (const m of status.modified) out(`  MODIFIED ${formatVersion(m.version)} ${m.name} (edited after it was applied)`);
      for (const u of status.unknown) out(`  UNKNOWN  ${formatVersion(u.version)} ${u.name} (not in this taskfence)`);
      return;
    }
    const steps = await store.plan(parsed.to !== undefined ? { to: parsed.to } : {});
    if (steps.length === 0) out('-- nothing to do');
    for (const step of steps) {
      out(`-- ${formatVersion(step.version)} ${step.name} (${step.direction})`);
      for (const statement of step.statements) out(`${statement};`);
    }
  } finally {
    await store.close();
  }
}

/** One line that says what to do, for the errors an operator can fix. */
function errorLine(error: unknown): string {
  if (error instanceof InvalidDatabaseUrlError) return `taskfence: ${error.message}`;
  if (error instanceof DatabaseUnavailableError) return `taskfence: ${error.message}`;
  if (error instanceof MigrationLockTimeoutError) return `taskfence: ${error.message}`;
  if (error instanceof MigrationChecksumMismatchError) return `taskfence: ${error.message}`;
  if (error instanceof BaselineRequiredError || error instanceof BaselineMismatchError) return `taskfence: ${error.message}`;
  if (error instanceof UnknownMigrationsError || error instanceof TaskfenceError) return `taskfence: ${error.message}`;
  return `taskfence: unexpected error: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}`;
}

/** Runs the CLI; resolves to the exit code. */
export async function main(argv: readonly string[], out = (l: string) => console.log(l), err = (l: string) => console.error(l)): Promise<number> {
  let parsed: ParsedArgs;
  try {
    parsed = parseArgs(argv);
  } catch (error) {
    if (error instanceof UsageError) {
      err(`taskfence: ${error.message}\nRun \`taskfence --help\` for usage.`);
      return 2;
    }
    throw error;
  }
  if (parsed.command === 'help') {
    out(HELP);
    return 0;
  }
  try {
    await run(parsed, out);
    return 0;
  } catch (error) {
    err(errorLine(error));
    return 1;
  }
}

const invokedDirectly = (() => {
  try {
    return process.argv[1] !== undefined && realpathSync(process.argv[1]) === realpathSync(fileURLToPath(import.meta.url));
  } catch {
    return false;
  }
})();

if (invokedDirectly) {
  main(process.argv.slice(2)).then(
    (code) => process.exit(code),
    (error) => {
      console.error(errorLine(error));
      process.exit(1);
    },
  );
}
