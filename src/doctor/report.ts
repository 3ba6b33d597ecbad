/** Which promise a check is about: the schema, the engine's guarantees, or what sits around them. */
export type DoctorArea = 'drift' | 'guarantee' | 'environment';

/** `warn` never fails the report: it names something an operator should know (a pending migration, an in-memory file). */
export type DoctorStatus = 'pass' | 'fail' | 'warn';

export interface DoctorCheck {
  /** Stable id, `<area>.<name>`, e.g. `guarantee.advisory-lock`. */
  readonly id: string;
  readonly area: DoctorArea;
  readonly status: DoctorStatus;
  /** One sentence: what was probed and what was found. */
  readonly detail: string;
  /** Every individual finding (each drifted table, column, index or foreign key), when there are several. */
  readonly items?: readonly string[];
}

export interface DoctorReport {
  /** True when no check failed (warnings allowed). */
  readonly ok: boolean;
  readonly dialect: 'sqlite' | 'postgres';
  /** The database URL with its password redacted. */
  readonly database: string;
  /** The recorded schema version (0 when nothing is applied). */
  readonly schemaVersion: number;
  readonly checks: readonly DoctorCheck[];
}

export function check(
  id: `${DoctorArea}.${string}`,
  status: DoctorStatus,
  detail: string,
  items?: readonly string[],
): DoctorCheck {
  const area = id.slice(0, id.indexOf('.')) as DoctorArea;
  return items && items.length > 0 ? { id, area, status, detail, items } : { id, area, status, detail };
}

/** The worst of several statuses: fail over warn over pass. */
export function worst(statuses: readonly DoctorStatus[]): DoctorStatus {
  if (statuses.includes('fail')) return 'fail';
  if (statuses.includes('warn')) return 'warn';
  return 'pass';
}
