import type { MigrationStatus } from '../migrator/migrator.js';
import { formatVersion } from '../errors.js';
import type {
  ForeignKeyDescription,
  IndexDescription,
  SchemaDescription,
  TableDescription,
} from '../schema/describe.js';
import { check, type DoctorCheck } from './report.js';

/** Tables the guarantee probes create for a moment (and drop); a crashed probe can leave one behind. */
export const PROBE_TABLE_PREFIX = 'taskfence_doctor_';

export interface SchemaDifference {
  /** `fail` for taskfence's own tables; `warn` for tables taskfence does not know (a host's, a probe's leftover). */
  readonly severity: 'fail' | 'warn';
  readonly text: string;
}

/**
 * Every difference between the schema the recorded version should have (`expected`) and the live
 * one (`actual`): missing, extra and changed tables, columns, primary keys, foreign keys and
 * indexes. Tables no version of the chain creates (`chainTables`) are another application's and
 * only warned about.
 */
export function diffSchemas(
  expected: SchemaDescription,
  actual: SchemaDescription,
  chainTables: ReadonlySet<string>,
): SchemaDifference[] {
  const out: SchemaDifference[] = [];
  const fail = (text: string) => out.push({ severity: 'fail', text });
  for (const [name, table] of Object.entries(expected.tables)) {
    const live = actual.tables[name];
    if (!live) fail(`missing table ${name}`);
    else diffTable(name, table, live, fail);
  }
  for (const name of Object.keys(actual.tables)) {
    if (name in expected.tables) continue;
    if (name.startsWith(PROBE_TABLE_PREFIX))
      out.push({ severity: 'warn', text: `extra table ${name}: a doctor probe's leftover, safe to drop` });
    else if (chainTables.has(name))
      fail(`extra table ${name}: the chain creates it at another version than the recorded one`);
    else out.push({ severity: 'warn', text: `extra table ${name}: not taskfence's (ignored)` });
  }
  return out;
}

function diffTable(
  name: string,
  expected: TableDescription,
  actual: TableDescription,
  fail: (text: string) => void,
): void {
  for (const [column, want] of Object.entries(expected.columns)) {
    const got = actual.columns[column];
    if (!got) {
      fail(`missing column ${name}.${column}`);
      continue;
    }
    const changes: string[] = [];
    if (got.type !== want.type) changes.push(`type ${want.type} → ${got.type}`);
    if (got.nullable !== want.nullable) changes.push(want.nullable ? 'nullable → not null' : 'not null → nullable');
    if (got.default !== want.default) changes.push(`default ${want.default ?? 'none'} → ${got.default ?? 'none'}`);
    if (changes.length > 0) fail(`changed column ${name}.${column}: ${changes.join(', ')}`);
  }
  for (const column of Object.keys(actual.columns)) {
    if (!(column in expected.columns)) fail(`extra column ${name}.${column}`);
  }
  if (expected.primaryKey.join(',') !== actual.primaryKey.join(',')) {
    fail(`changed primary key of ${name}: (${expected.primaryKey.join(', ')}) → (${actual.primaryKey.join(', ')})`);
  }
  const fkKey = (fk: ForeignKeyDescription) => `${name}(${fk.columns.join(', ')}) → ${fk.referencedTable}`;
  const fkFull = (fk: ForeignKeyDescription) => `(${fk.referencedColumns.join(', ')}) on delete ${fk.onDelete}`;
  const liveFks = new Map(actual.foreignKeys.map((fk) => [fkKey(fk), fk]));
  const wantFks = new Map(expected.foreignKeys.map((fk) => [fkKey(fk), fk]));
  for (const [key, want] of wantFks) {
    const got = liveFks.get(key);
    if (!got) fail(`missing foreign key ${key}${fkFull(want)}`);
    else if (fkFull(got) !== fkFull(want)) fail(`changed foreign key ${key}: ${fkFull(want)} → ${fkFull(got)}`);
  }
  for (const [key, got] of liveFks) if (!wantFks.has(key)) fail(`extra foreign key ${key}${fkFull(got)}`);
  for (const [index, want] of Object.entries(expected.indexes)) {
    const got = actual.indexes[index];
    if (!got) fail(`missing index ${index} on ${name}${describeIndex(want)}`);
    else if (describeIndex(got) !== describeIndex(want))
      fail(`changed index ${index} on ${name}:${describeIndex(want)} →${describeIndex(got)}`);
  }
  for (const [index, got] of Object.entries(actual.indexes)) {
    if (!(index in expected.indexes)) fail(`extra index ${index} on ${name}${describeIndex(got)}`);
  }
}

function describeIndex(index: IndexDescription): string {
  return `${index.unique ? ' unique' : ''} (${index.columns.join(', ')})${index.where === null ? '' : ` where ${index.where}`}`;
}

/** `drift.history`: the recorded history against this code's chain. */
export function historyCheck(status: MigrationStatus): DoctorCheck {
  const at = `recorded version ${formatVersion(status.currentVersion)}, latest ${formatVersion(status.latestVersion)}`;
  if (status.baselineRequired) {
    return check(
      'drift.history',
      'fail',
      `taskfence tables without migration history: adopt the database with \`migrate --baseline <version>\` first`,
    );
  }
  if (status.unknown.length > 0) {
    return check(
      'drift.history',
      'fail',
      `${at}; the history holds migrations this code does not know (a newer taskfence migrated it)`,
      status.unknown.map((u) => `unknown migration ${formatVersion(u.version)} ${u.name}`),
    );
  }
  const items = [
    ...status.modified.map(
      (m) =>
        `modified migration ${formatVersion(m.version)} ${m.name}: checksum ${m.recordedChecksum} recorded, ${m.currentChecksum} now`,
    ),
    ...status.pending.map((p) => `pending migration ${formatVersion(p.version)} ${p.name}`),
  ];
  if (status.applied.length === 0)
    return check('drift.history', 'warn', 'no migration applied yet: run `taskfence migrate`', items);
  if (items.length > 0)
    return check(
      'drift.history',
      'warn',
      `${at}; ${status.pending.length} pending, ${status.modified.length} modified`,
      items,
    );
  return check('drift.history', 'pass', `${at}; no pending, modified or unknown migrations`);
}
