import { TaskfenceError, formatVersion } from '../errors.js';
import type { MigrationLockHolder } from '../dialects/types.js';
import type { CompatibilityWindow, MigrationEvent, PlanStep } from '../migrator/migrator.js';
import { FileError } from './open.js';

function describeHolder(holder: MigrationLockHolder | null): string {
  if (!holder) return 'another migrator (SQLite: another writer)';
  const since = holder.since === null ? '' : `, since ${new Date(holder.since).toISOString()}`;
  return `pid ${holder.pid} (application ${JSON.stringify(holder.application)}${holder.clientAddress ? ` from ${holder.clientAddress}` : ''}${since})`;
}

/** One line for a migration event (the non-JSON output of `migrate`). */
export function describeEvent(event: MigrationEvent): string {
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
    case 'lock-retry':
      return `${formatVersion(event.version)} ${event.name}: a table lock is held by another session (attempt ${event.attempt}, ${event.waitedMs} ms so far); retrying in ${event.delayMs} ms`;
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

/** The compatibility window in one line (`plan` and `status`). */
export function describeWindow(window: CompatibilityWindow): string {
  const writers =
    window.oldestWriterRelease === null
      ? 'every taskfence release that knows this schema may write'
      : `taskfence ${window.oldestWriterRelease} or newer may write (set by ${formatVersion(window.setByVersion ?? 0)}); older releases are refused at openStore`;
  return `compatibility window: ${writers}${window.newestAppliedByRelease === null ? '' : `; last migrated by taskfence ${window.newestAppliedByRelease}`}`;
}

/** `taskfence plan` as SQL: a comment per step (direction, data loss, notes), then its statements. */
export function printPlan(steps: readonly PlanStep[], out: (line: string) => void): void {
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
    if (step.concurrent.length > 0) {
      out(
        `-- ${formatVersion(step.version)} concurrent steps, after the DDL above commits (each outside a transaction):`,
      );
      for (const statement of step.concurrent) out(`${statement};`);
    }
    if (step.backfill.length > 0) {
      out(
        `-- ${formatVersion(step.version)} backfill, after the DDL above commits (first batch; one transaction per batch):`,
      );
      for (const statement of step.backfill) out(`${statement};`);
    }
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
