import { openStore, type Store } from '../store.js';
import { formatDoctorReport, formatDoctorReportJson } from './format.js';
import { errorMessage } from './probe-support.js';

/** Exit codes of `taskfence doctor`. */
export const DOCTOR_EXIT = Object.freeze({ ok: 0, failed: 1 });

/**
 * `taskfence doctor [--db URL] [--schema NAME] [--json]`: opens the store, runs every check, prints the table (or
 * the JSON report), closes. Returns 0 when every check passed or only warned, 1 when any failed or
 * the database could not be examined at all.
 *
 * @example process.exitCode = await runDoctorCommand({ db: url, json: false }, console.log);
 */
export async function runDoctorCommand(
  options: { db: string; json: boolean; schema?: string },
  out: (line: string) => void,
): Promise<number> {
  let store: Store | undefined;
  try {
    store = await openStore({ url: options.db, ...(options.schema === undefined ? {} : { schema: options.schema }) });
    const report = await store.doctor();
    out(options.json ? formatDoctorReportJson(report) : formatDoctorReport(report));
    return report.ok ? DOCTOR_EXIT.ok : DOCTOR_EXIT.failed;
  } catch (error) {
    const message = errorMessage(error);
    const code = (error as { code?: unknown } | null)?.code;
    out(
      options.json
        ? JSON.stringify({ ok: false, error: { ...(typeof code === 'string' ? { code } : {}), message } }, null, 2)
        : `taskfence doctor: could not examine the database: ${message}`,
    );
    return DOCTOR_EXIT.failed;
  } finally {
    await store?.close().catch(() => {});
  }
}
