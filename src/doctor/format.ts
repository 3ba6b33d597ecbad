import type { DoctorReport } from './report.js';

const MARK = { pass: 'ok  ', warn: 'WARN', fail: 'FAIL' } as const;

/**
 * The report as a table for a terminal: one row per check (status, check id, detail), each
 * finding of a check indented below it, and a summary line.
 *
 * @example console.log(formatDoctorReport(await store.doctor()));
 */
export function formatDoctorReport(report: DoctorReport): string {
  const width = Math.max(...report.checks.map((c) => c.id.length), 5);
  const lines = [
    `taskfence doctor: ${report.database} (${report.dialect}, schema version ${String(report.schemaVersion).padStart(4, '0')})`,
    '',
    `${'STATUS'.padEnd(6)}  ${'CHECK'.padEnd(width)}  DETAIL`,
  ];
  for (const c of report.checks) {
    lines.push(`${MARK[c.status].padEnd(6)}  ${c.id.padEnd(width)}  ${c.detail}`);
    for (const item of c.items ?? []) lines.push(`${''.padEnd(6)}  ${''.padEnd(width)}    - ${item}`);
  }
  const count = (s: 'pass' | 'warn' | 'fail') => report.checks.filter((c) => c.status === s).length;
  lines.push(
    '',
    `${report.ok ? 'OK' : 'FAILED'}: ${count('pass')} passed, ${count('warn')} warnings, ${count('fail')} failed`,
  );
  return lines.join('\n');
}

/** The report as JSON (stable key order: ok, dialect, database, schemaVersion, checks). */
export function formatDoctorReportJson(report: DoctorReport): string {
  return JSON.stringify(report, null, 2);
}
