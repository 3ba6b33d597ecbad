import type { StoreDialect } from '../dialects/types.js';
import { formatVersion } from '../errors.js';
import type { MigrationDefinition } from '../migrations/types.js';
import { recordMigration } from './checksum.js';

/** The first version the online rules apply to (older migrations shipped before them). */
export const ONLINE_RULES_FROM = 57;

/** One broken rule: which, where, and the statement. */
export interface LintViolation {
  readonly version: number;
  readonly dialect: StoreDialect['kind'];
  readonly rule: LintRule;
  readonly statement: string;
  readonly message: string;
}

/** The online rules (docs/development.md, "Online migrations"), each named like squawk's. */
export type LintRule =
  | 'index-on-existing-table'
  | 'adding-not-nullable-field'
  | 'adding-volatile-default'
  | 'changing-column-type'
  | 'setting-not-null'
  | 'constraint-without-not-valid'
  | 'validate-in-same-step'
  | 'not-valid-never-validated'
  | 'blocking-concurrent-step'
  | 'data-change-in-ddl-step'
  | 'ddl-in-backfill'
  | 'contract-without-window';

const oneLine = (text: string) => text.replace(/\s+/g, ' ').trim();

/**
 * Checks a migration's statements (its `up`, its concurrent steps and its backfill's first batch,
 * as recorded for the checksum, on both dialects) against the online rules: what would lock a table the running
 * release uses for longer than a moment, rewrite it, or break the release still writing to it.
 * Returns the violations, none for a migration that follows them.
 */
export async function lintMigration(m: MigrationDefinition): Promise<LintViolation[]> {
  const violations: LintViolation[] = [];
  for (const dialect of ['postgres', 'sqlite'] as const) {
    const up = (await recordMigration(m, 'up', dialect)).map((q) => oneLine(q.sql));
    const backfill = m.backfill ? (await recordMigration(m, 'backfill', dialect)).map((q) => oneLine(q.sql)) : [];
    const concurrent = (await recordMigration(m, 'concurrent', dialect)).map((q) => oneLine(q.sql));
    const flag = (rule: LintRule, statement: string, message: string) =>
      violations.push({
        version: m.version,
        dialect,
        rule,
        statement,
        message: `${formatVersion(m.version)} ${m.name}: ${message}`,
      });
    // Tables this step creates: anything may be done to them, nobody else uses them yet.
    const created = new Set<string>();
    for (const s of up) {
      const table = /^create table (?:if not exists )?("?[\w.]+"?)/i.exec(s)?.[1];
      if (table) created.add(bare(table));
    }
    const existing = (table: string | undefined) => table !== undefined && !created.has(bare(table));
    const notValid = new Set<string>();
    for (const s of up) {
      const index = /^create (?:unique )?index (?!concurrently)(?:if not exists )?"?[\w.]+"? on ("?[\w.]+"?)/i.exec(s);
      if (index && existing(index[1]))
        flag(
          'index-on-existing-table',
          s,
          `CREATE INDEX on ${bare(index[1]!)}, which exists: it blocks writes while the index builds; declare it in \`concurrent\` (a create-index step)`,
        );
      const altered = /^alter table ("?[\w.]+"?)/i.exec(s)?.[1];
      if (!existing(altered)) continue;
      const addColumn = /\badd column\b(.*)$/i.exec(s)?.[1];
      if (addColumn !== undefined) {
        if (/\bnot null\b/i.test(addColumn) && !/\bdefault\b/i.test(addColumn))
          flag(
            'adding-not-nullable-field',
            s,
            'ADD COLUMN … NOT NULL without a default fails on rows that exist, or rewrites the table',
          );
        if (/\bdefault\s+[a-z_][\w.]*\s*\(/i.test(addColumn))
          flag(
            'adding-volatile-default',
            s,
            'a default computed by a function rewrites every row; use a constant default and backfill',
          );
        // SQLite has no ADD CONSTRAINT: its CHECK goes on the column (readers are never blocked there).
        if (dialect === 'postgres' && (/\bcheck\s*\(/i.test(addColumn) || /\breferences\b/i.test(addColumn)))
          flag(
            'constraint-without-not-valid',
            s,
            'a CHECK or REFERENCES on an added column is validated over every row under the table lock; add it NOT VALID, validate later',
          );
      }
      if (/\balter column\b.*\b(?:type|set data type)\b/i.test(s))
        flag(
          'changing-column-type',
          s,
          'changing a column type rewrites the table under an exclusive lock; add a new column and backfill it',
        );
      if (/\bset not null\b/i.test(s))
        flag(
          'setting-not-null',
          s,
          'SET NOT NULL scans the table under an exclusive lock; add a CHECK (… IS NOT NULL) NOT VALID, validate it in a later step',
        );
      const constraint = /\badd constraint ("?\w+"?)\s+(check|foreign key)\b/i.exec(s);
      if (constraint && !/\bnot valid\b/i.test(s))
        flag(
          'constraint-without-not-valid',
          s,
          'ADD CONSTRAINT validates every row under the table lock; add it NOT VALID',
        );
      if (constraint && /\bnot valid\b/i.test(s)) notValid.add(bare(constraint[1]!));
      const validate = /\bvalidate constraint ("?\w+"?)/i.exec(s)?.[1];
      if (validate && notValid.has(bare(validate)))
        flag(
          'validate-in-same-step',
          s,
          'VALIDATE in the step that added the constraint NOT VALID holds the lock the NOT VALID avoided; validate it in a `concurrent` step',
        );
      if (/\b(?:drop column|rename)\b/i.test(s) && m.minWriterRelease === undefined)
        flag(
          'contract-without-window',
          s,
          'dropping or renaming what the running release uses breaks it; contract in a later migration with minWriterRelease set',
        );
    }
    for (const s of up) {
      if (/^(?:update|delete|insert)\b/i.test(s) && !/^insert into "?taskfence_/i.test(s))
        flag(
          'data-change-in-ddl-step',
          s,
          'rows changed in the DDL transaction are locked with the table for its whole length; move it to `backfill`',
        );
      const dropped = /^drop table (?:if exists )?("?[\w.]+"?)/i.exec(s)?.[1];
      if (existing(dropped) && m.minWriterRelease === undefined)
        flag(
          'contract-without-window',
          s,
          'dropping a table the running release uses breaks it; contract in a later migration with minWriterRelease set',
        );
    }
    // A constraint added NOT VALID is enforced only for new rows until a step validates it.
    const validated = new Set(
      (m.concurrent ?? []).flatMap((step) => (step.kind === 'validate-constraint' ? [step.constraint] : [])),
    );
    for (const constraint of notValid) {
      if (!validated.has(constraint))
        flag(
          'not-valid-never-validated',
          up.find((s) => new RegExp(`add constraint "?${constraint}"?`, 'i').test(s)) ?? '',
          `constraint ${constraint} is added NOT VALID and never validated: add a validate-constraint step in \`concurrent\``,
        );
    }
    // A concurrent step runs outside any transaction: on PostgreSQL it must take no lock that
    // blocks writes (CREATE INDEX CONCURRENTLY, VALIDATE CONSTRAINT); SQLite's run in short transactions.
    for (const s of concurrent) {
      if (
        dialect === 'postgres' &&
        !/^create (?:unique )?index concurrently\b/i.test(s) &&
        !/^alter table "?[\w.]+"? validate constraint\b/i.test(s)
      )
        flag(
          'blocking-concurrent-step',
          s,
          'a concurrent step must be CREATE INDEX CONCURRENTLY or VALIDATE CONSTRAINT: anything else locks the table',
        );
    }
    for (const s of backfill) {
      if (/^(?:create|alter|drop)\b/i.test(s))
        flag('ddl-in-backfill', s, 'a backfill batch changes rows only; its DDL belongs in `up`');
    }
  }
  return violations;
}

/** `"schema"."name"` or `name` → `name`. */
function bare(name: string): string {
  return name.replace(/"/g, '').split('.').at(-1)!;
}

/**
 * Lints every migration from `ONLINE_RULES_FROM` on. A rule a migration declares in
 * `onlineExceptions` (with its reason) is not a violation of that migration; a declared
 * exception without a reason, or for a rule the migration does not break, is one.
 */
export async function lintChain(migrations: readonly MigrationDefinition[]): Promise<LintViolation[]> {
  const out: LintViolation[] = [];
  for (const m of migrations) {
    if (m.version < ONLINE_RULES_FROM) continue;
    const found = await lintMigration(m);
    const excepted = new Set((m.onlineExceptions ?? []).filter((e) => e.reason.trim() !== '').map((e) => e.rule));
    out.push(...found.filter((v) => !excepted.has(v.rule)));
    for (const e of m.onlineExceptions ?? []) {
      if (e.reason.trim() === '' || !found.some((v) => v.rule === e.rule))
        out.push({
          version: m.version,
          dialect: 'postgres',
          rule: e.rule as LintRule,
          statement: '',
          message: `${formatVersion(m.version)} ${m.name}: the declared exception to ${e.rule} has no reason or is not needed`,
        });
    }
  }
  return out;
}
