/**
 * Generates docs/schema.md from the migration chain: a Mermaid erDiagram of the latest schema and
 * a table list (purpose, the migration that introduced each table, the ones that changed it since).
 * The schemas come from `describeSchema` of a scratch in-memory SQLite database replayed version
 * by version (the same reference `doctor` compares against), so the output depends only on the
 * chain and the purposes below: deterministic.
 *
 *   npm run docs:schema              write docs/schema.md
 *   npm run docs:schema -- --check   exit 1 if docs/schema.md is stale
 *   --out <file>                     another file than docs/schema.md (tests)
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { MIGRATIONS } from '../src/migrations/index.js';
import type { MigrationDefinition } from '../src/migrations/types.js';
import { referenceSchemas } from '../src/doctor/reference.js';
import { openSqliteDialect } from '../src/dialects/sqlite/sqlite-dialect.js';
import { Migrator } from '../src/migrator/migrator.js';
import { sql } from 'kysely';
import type { SchemaDescription, TableDescription } from '../src/schema/describe.js';

const DEFAULT_OUTPUT = fileURLToPath(new URL('../docs/schema.md', import.meta.url));

/** What each table is for (hand-written; a table missing here is listed with a placeholder and a warning). */
const PURPOSES: Record<string, string> = {
  companies: 'Tenants: every workspace, agent, project and task belongs to one.',
  workspaces: "A company's working directories (repositories) that tasks run in.",
  agents: 'Agents of a company, with a role and optionally a home workspace.',
  projects: 'Groups of tasks with an optional primary workspace.',
  tasks:
    'Units of work: status, assignee, run scoping (`coordinator_run_id`, `target_key`), workspace mode, declared write paths.',
  task_dependencies:
    'Dependency edges: `task_id` becomes ready only when every `depends_on_id` is done (same run and target, no cycles).',
  task_leases: 'Who works on a task right now: holder, fencing token, expiry.',
  workspace_locks: 'Exclusive workspace lock claims with fencing tokens and expiry (SPEC §4).',
  coordinator_runs: 'Coordinator runs; a partial unique index allows one running run per target (SPEC §3).',
  dispatch_contexts: "A task dispatched to an agent's terminal, scoped to a run.",
  decision_gates: 'Questions that block a task until resolved, scoped to a run.',
  messages: 'Messages between handles, with delivery status.',
  task_environments:
    'An isolated environment owned by one task, with an ownership generation and cleanup claim (SPEC §6).',
  workspace_groups: 'A shared workspace with a steward task, ownership generation and cleanup claim (SPEC §6).',
  workspace_group_members: 'Tasks that share a workspace group, with their role (one steward per group).',
  task_cleanup_admissions: 'The cleanup barrier: admissions recorded per task before teardown (SPEC §6).',
  cleanup_snapshots:
    'Durable cleanup inventory (resource, owner task, generation) so teardown resumes after a restart.',
  path_leases: 'Path-scoped write leases; `lease_key` compares bytewise (SPEC §5).',
  path_lease_tokens: 'The latest path-lease fencing token granted in each workspace (0095); never reset.',
  path_lease_claims: 'The current `claimTask` grant of each task (0095): a later claim supersedes it.',
  semaphores: 'Counting semaphores: the latest fencing token granted per name (issue 21).',
  semaphore_holders: 'One row per granted semaphore slot; it counts against the limit while unexpired.',
  idempotency_keys:
    'Idempotency keys: per operation, the input fingerprint and the first outcome, written with the effect (issue 23).',
  audit_events: "The audit trail: one row per recorded act (operator actions), written in the act's transaction.",
  taskfence_migrations: 'Migration history: version, name, checksum, applied_at, duration_ms.',
  taskfence_migration_state:
    'Beside the history, per applied version: the compatibility window (oldest release that may write, release that applied it) and the backfill cursor.',
  taskfence_migration_steps:
    "Beside the history: each applied version's concurrent steps done (indexes built concurrently, constraints validated), so a crash resumes at the next.",
  taskfence_releases:
    'Open stores by release and the schema version each needs (`migrate --to` refuses to go below it).',
};

interface TableHistory {
  readonly introducedBy: MigrationDefinition;
  readonly changedBy: readonly MigrationDefinition[];
}

function histories(
  schemas: Map<number, SchemaDescription>,
  migrations: readonly MigrationDefinition[],
): Map<string, TableHistory> {
  const out = new Map<string, { introducedBy: MigrationDefinition; changedBy: MigrationDefinition[] }>();
  let previous: SchemaDescription = { tables: {} };
  for (const m of migrations) {
    const current = schemas.get(m.version)!;
    for (const [name, table] of Object.entries(current.tables)) {
      const before = previous.tables[name];
      const entry = out.get(name);
      if (!before || !entry) out.set(name, { introducedBy: m, changedBy: [] });
      else if (JSON.stringify(before) !== JSON.stringify(table)) entry.changedBy.push(m);
    }
    previous = current;
  }
  return out;
}

const version = (m: MigrationDefinition) => `${String(m.version).padStart(4, '0')} ${m.name}`;
const mermaidType = (type: string) => type.replace(/^other:/, '').replace(/[^A-Za-z0-9_]/g, '_');

function entity(name: string, table: TableDescription): string[] {
  const fkColumns = new Set(table.foreignKeys.flatMap((fk) => fk.columns));
  const lines = [`  ${name} {`];
  // Primary-key columns first, in key order; then the rest by name.
  const columns = [...table.primaryKey, ...Object.keys(table.columns).filter((c) => !table.primaryKey.includes(c))];
  for (const column of columns) {
    const c = table.columns[column]!;
    const keys = [table.primaryKey.includes(column) ? 'PK' : '', fkColumns.has(column) ? 'FK' : '']
      .filter(Boolean)
      .join(', ');
    lines.push(`    ${mermaidType(c.type)} ${column}${keys ? ` ${keys}` : ''}${c.nullable ? ' "nullable"' : ''}`);
  }
  lines.push('  }');
  return lines;
}

function relationships(name: string, table: TableDescription): string[] {
  return table.foreignKeys.map((fk) => {
    const optional = fk.columns.some((c) => table.columns[c]?.nullable);
    return `  ${fk.referencedTable} ${optional ? '|o' : '||'}--o{ ${name} : "${fk.columns.join(', ')}"`;
  });
}

/**
 * Index definitions as written (`describeSchema` normalizes expressions for comparison, dropping
 * their parentheses): the column list and predicate of each index's stored SQLite source.
 */
async function indexSources(
  migrations: readonly MigrationDefinition[],
): Promise<Map<string, { columns: string; where: string }>> {
  const dialect = await openSqliteDialect(':memory:');
  try {
    await new Migrator(dialect, migrations).migrate({ now: 0 });
    const { rows } = await sql<{ name: string; sql: string }>`
      select name, sql from sqlite_master where type = 'index' and sql is not null`.execute(dialect.db);
    const out = new Map<string, { columns: string; where: string }>();
    for (const row of rows) {
      const text = row.sql.replace(/"/g, '').replace(/\s+/g, ' ');
      const start = text.indexOf('(', text.search(/ on /i));
      let depth = 0;
      let end = start;
      for (; end < text.length; end++) {
        if (text[end] === '(') depth++;
        if (text[end] === ')' && --depth === 0) break;
      }
      const where = /\bwhere\b(.*)$/i.exec(text.slice(end + 1))?.[1]?.trim() ?? '';
      out.set(row.name, { columns: text.slice(start + 1, end).trim(), where });
    }
    return out;
  } finally {
    await dialect.close();
  }
}

export async function renderSchemaDoc(
  migrations: readonly MigrationDefinition[] = MIGRATIONS,
): Promise<{ text: string; unexplained: string[] }> {
  const schemas = await referenceSchemas(migrations);
  const latest = migrations.at(-1)!;
  const schema = schemas.get(latest.version)!;
  const history = histories(schemas, migrations);
  const sources = await indexSources(migrations);
  const names = Object.keys(schema.tables).sort();
  const unexplained = names.filter((n) => !PURPOSES[n]);
  const lines = [
    '# Schema',
    '',
    '<!-- Generated by `npm run docs:schema` from the migration chain; do not edit. CI runs `npm run docs:schema -- --check`. -->',
    '',
    `The schema at version ${version(latest)}: ${names.length} tables, the same on SQLite and PostgreSQL`,
    'up to the type mapping in the README (logical types below, as `describeSchema` reports them).',
    '`taskfence doctor` compares a live database against this schema at its recorded version.',
    '',
    '```mermaid',
    'erDiagram',
    ...names.flatMap((n) => entity(n, schema.tables[n]!)),
    ...names.flatMap((n) => relationships(n, schema.tables[n]!)),
    '```',
    '',
    '## Tables',
    '',
    '| table | purpose | introduced by | changed by |',
    '|---|---|---|---|',
    ...names.map((n) => {
      const h = history.get(n)!;
      const changed = h.changedBy.map(version).join(', ') || '—';
      return `| \`${n}\` | ${PURPOSES[n] ?? '(purpose not yet described)'} | ${version(h.introducedBy)} | ${changed} |`;
    }),
    '',
    '## Indexes',
    '',
    '| table | index | columns | unique | where |',
    '|---|---|---|---|---|',
    ...names.flatMap((n) =>
      Object.entries(schema.tables[n]!.indexes).map(([index, i]) => {
        const source = sources.get(index);
        const columns = source?.columns ?? i.columns.join(', ');
        const where = source ? source.where : (i.where ?? '');
        return `| \`${n}\` | \`${index}\` | \`${columns}\` | ${i.unique ? 'yes' : ''} | ${where === '' ? '' : `\`${where}\``} |`;
      }),
    ),
    '',
  ];
  return { text: lines.join('\n'), unexplained };
}

async function main(): Promise<number> {
  const check = process.argv.includes('--check');
  const outIndex = process.argv.indexOf('--out');
  const output = outIndex >= 0 && process.argv[outIndex + 1] ? process.argv[outIndex + 1]! : DEFAULT_OUTPUT;
  const { text, unexplained } = await renderSchemaDoc();
  for (const name of unexplained) console.error(`docs:schema: table ${name} has no purpose in scripts/docs-schema.ts`);
  if (check) {
    let current = '';
    try {
      current = readFileSync(output, 'utf8');
    } catch {
      // missing counts as stale
    }
    if (current !== text) {
      console.error(
        `${output === DEFAULT_OUTPUT ? 'docs/schema.md' : output} is stale: run \`npm run docs:schema\` and commit the result.`,
      );
      return 1;
    }
    console.log('docs/schema.md is up to date.');
    return 0;
  }
  writeFileSync(output, text);
  console.log(`wrote ${output === DEFAULT_OUTPUT ? 'docs/schema.md' : output} (${text.split('\n').length} lines)`);
  return 0;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  process.exitCode = await main();
}
