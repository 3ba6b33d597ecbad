import { runDoctorCommand } from '../doctor/cli.js';
import { openStore } from '../store.js';
import { redactDatabaseUrl } from '../config.js';
import { formatVersion } from '../errors.js';
import { Migrator, type MigrationStatus } from '../migrator/migrator.js';
import { CHECK_EXIT, resolveTarget, schemaFor, type ParsedArgs } from './args.js';
import { openDialect } from './open.js';
import { ProgressRenderer, describeEvent, describeWindow, printPlan } from './output.js';

/** Where the CLI writes, and what it knows about its surroundings. */
export interface Io {
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

/** Runs a parsed command (not help or version); resolves to the exit code. */
export async function run(parsed: ParsedArgs, io: Io): Promise<number> {
  const { out } = io;
  const target = resolveTarget(parsed, io.env, io.interactive);
  if (target.note && !parsed.json) out(`taskfence: ${target.note}`);
  const shown = redactDatabaseUrl(target.url);
  const schema = schemaFor(parsed, target.url);
  if (parsed.command === 'doctor')
    return runDoctorCommand({ db: target.url, json: parsed.json, ...(schema === undefined ? {} : { schema }) }, out);
  if (parsed.command === 'prune') return prune(target.url, schema, shown, parsed, out);
  const dialect = await openDialect(target.url, parsed, (line) => {
    if (!parsed.json) out(`-- ${line}`);
  });
  const migrator = new Migrator(dialect);
  // Where the statements run: the dialect, and the PostgreSQL schema when one is configured.
  const where = { database: shown, dialect: dialect.kind, ...(schema === undefined ? {} : { schema }) };
  try {
    if (parsed.command === 'migrate') return await migrate(migrator, shown, parsed, io);
    if (parsed.command === 'status') return await status(migrator, where, parsed, out);
    const steps = await migrator.plan(parsed.to !== undefined ? { to: parsed.to } : {});
    const { window } = await migrator.status();
    if (parsed.json) {
      out(JSON.stringify({ ...where, destructive: steps.some((s) => s.destructive.length > 0), window, steps }));
      return 0;
    }
    if (schema !== undefined) out(`-- in schema ${schema}: every table below is qualified with it`);
    out(`-- ${describeWindow(window)}`);
    printPlan(steps, out);
    return 0;
  } finally {
    await dialect.close().catch(() => {});
  }
}

/** `taskfence migrate`: events as lines (or JSON lines), then where the database ended up. */
async function migrate(migrator: Migrator, shown: string, parsed: ParsedArgs, io: Io): Promise<number> {
  const { out } = io;
  const progress = new ProgressRenderer(io.write, io.tty);
  const result = await migrator.migrate({
    ...(parsed.to !== undefined ? { to: parsed.to } : {}),
    ...(parsed.baseline !== undefined ? { baseline: parsed.baseline } : {}),
    ...(parsed.lockWaitMs !== undefined ? { migrationLockWaitMs: parsed.lockWaitMs } : {}),
    ...(parsed.ddlLockTimeoutMs !== undefined ? { ddlLockTimeoutMs: parsed.ddlLockTimeoutMs } : {}),
    ...(parsed.batchSize !== undefined ? { batchSize: parsed.batchSize } : {}),
    ...(parsed.pauseMs !== undefined ? { pauseMs: parsed.pauseMs } : {}),
    ...(parsed.batchTimeMs !== undefined ? { batchTimeMs: parsed.batchTimeMs } : {}),
    allowDataLoss: parsed.allowDataLoss,
    force: parsed.force,
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

/** `taskfence status [--check]`: the history against this code's chain; with --check, an exit code for it. */
async function status(
  migrator: Migrator,
  where: { database: string; dialect: string; schema?: string },
  parsed: ParsedArgs,
  out: (line: string) => void,
): Promise<number> {
  const status = await migrator.status();
  const exit = parsed.check ? statusExit(status) : 0;
  if (parsed.json) {
    out(
      JSON.stringify({
        ...where,
        currentVersion: status.currentVersion,
        latestVersion: status.latestVersion,
        baselineRequired: status.baselineRequired,
        upToDate: statusExit(status) === 0,
        applied: status.applied,
        pending: status.pending,
        modified: status.modified,
        unknown: status.unknown,
        backfills: status.backfills,
        steps: status.steps,
        window: status.window,
      }),
    );
    return exit;
  }
  out(`database: ${where.database} (${where.dialect}${where.schema === undefined ? '' : `, schema ${where.schema}`})`);
  out(`version:  ${formatVersion(status.currentVersion)} (latest ${formatVersion(status.latestVersion)})`);
  out(`window:   ${describeWindow(status.window)}`);
  for (const st of status.steps)
    out(
      `  STEPS    ${formatVersion(st.version)} ${st.name}: ${st.done} of ${st.total} concurrent steps done (migrate resumes them)`,
    );
  for (const b of status.backfills)
    out(`  BACKFILL ${formatVersion(b.version)} ${b.name}: ${b.done} rows done, not finished (migrate resumes it)`);
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

/** `taskfence prune --older-than D [--dry-run] [--batch-size N]`: deletes what is finished and old, printing counts per table. */
async function prune(
  url: string,
  schema: string | undefined,
  shown: string,
  parsed: ParsedArgs,
  out: (line: string) => void,
): Promise<number> {
  const store = await openStore({
    url,
    ...(schema === undefined ? {} : { schema }),
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
