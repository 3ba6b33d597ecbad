/**
 * The online rules for migrations (docs/development.md, "Online migrations"): every migration from
 * 0057 on passes the lint; the lint catches each rule on a migration that breaks it, and on the
 * shipped migrations from before the rules that break them.
 */
import { describe, expect, it } from 'vitest';
import { sql } from 'kysely';
import { MIGRATIONS, type MigrationDefinition } from '../../src/index.js';
import { ONLINE_RULES_FROM, lintChain, lintMigration, type LintRule } from '../../src/migrator/lint.js';

const migration = (up: MigrationDefinition['up'], extra: Partial<MigrationDefinition> = {}): MigrationDefinition => ({
  version: 9001,
  name: 'lint_probe',
  up,
  down: async () => {},
  ...extra,
});

async function rulesOf(m: MigrationDefinition, dialect?: 'postgres' | 'sqlite'): Promise<LintRule[]> {
  return [...new Set((await lintMigration(m)).filter((v) => !dialect || v.dialect === dialect).map((v) => v.rule))];
}

describe('migration lint', () => {
  it(`every migration from ${ONLINE_RULES_FROM} on follows the online rules, on both dialects`, async () => {
    expect(await lintChain(MIGRATIONS)).toEqual([]);
  });

  it('passes what is online-safe: new tables with their indexes, nullable or constant-default columns, NOT VALID constraints, a backfill', async () => {
    const safe = migration(
      async ({ db }) => {
        await db.schema
          .createTable('probe')
          .addColumn('id', 'text', (c) => c.primaryKey())
          .addColumn('task_id', 'text', (c) => c.notNull().references('tasks.id'))
          .execute();
        await db.schema.createIndex('probe_task_idx').on('probe').column('task_id').execute();
        await db.schema.alterTable('tasks').addColumn('note', 'text').execute();
        await db.schema
          .alterTable('tasks')
          .addColumn('weight', 'integer', (c) => c.notNull().defaultTo(0))
          .execute();
        await sql`alter table tasks add constraint tasks_weight_check check (weight >= 0) not valid`.execute(db);
      },
      {
        concurrent: [{ kind: 'validate-constraint', table: 'tasks', constraint: 'tasks_weight_check' }],
        backfill: {
          async batch({ db }) {
            await sql`update tasks set weight = 1 where weight = 0`.execute(db);
            return { cursor: null, visited: 0, changed: 0 };
          },
        },
      },
    );
    expect(await lintMigration(safe)).toEqual([]);
  });

  it('flags each rule', async () => {
    const cases: [LintRule, MigrationDefinition['up'], Partial<MigrationDefinition>?][] = [
      [
        'index-on-existing-table',
        async ({ db }) => void (await db.schema.createIndex('t_i').on('tasks').column('title').execute()),
      ],
      [
        'adding-not-nullable-field',
        async ({ db }) =>
          void (await db.schema
            .alterTable('tasks')
            .addColumn('x', 'integer', (c) => c.notNull())
            .execute()),
      ],
      [
        'adding-volatile-default',
        async ({ db }) =>
          void (await db.schema
            .alterTable('tasks')
            .addColumn('x', 'text', (c) => c.defaultTo(sql`gen_random_uuid()`))
            .execute()),
      ],
      [
        'changing-column-type',
        async ({ db }) =>
          void (await db.schema
            .alterTable('tasks')
            .alterColumn('title', (c) => c.setDataType('varchar(10)'))
            .execute()),
      ],
      [
        'setting-not-null',
        async ({ db }) =>
          void (await db.schema
            .alterTable('tasks')
            .alterColumn('title', (c) => c.setNotNull())
            .execute()),
      ],
      [
        'constraint-without-not-valid',
        async ({ db }) => void (await sql`alter table tasks add constraint c1 check (1 = 1)`.execute(db)),
      ],
      [
        'validate-in-same-step',
        async ({ db }) => {
          await sql`alter table tasks add constraint c1 check (1 = 1) not valid`.execute(db);
          await sql`alter table tasks validate constraint c1`.execute(db);
        },
      ],
      ['data-change-in-ddl-step', async ({ db }) => void (await sql`update tasks set title = 'x'`.execute(db))],
      [
        'contract-without-window',
        async ({ db }) => void (await db.schema.alterTable('tasks').dropColumn('title').execute()),
      ],
      ['contract-without-window', async ({ db }) => void (await db.schema.dropTable('tasks').execute())],
    ];
    for (const [rule, up] of cases) expect(await rulesOf(migration(up), 'postgres'), rule).toContain(rule);
    // A contract step that moves the window is allowed to drop.
    expect(
      await rulesOf(
        migration(async ({ db }) => void (await db.schema.alterTable('tasks').dropColumn('title').execute()), {
          minWriterRelease: '0.2.0',
        }),
      ),
    ).toEqual([]);
    // DDL inside a backfill batch.
    const ddlInBackfill = migration(async () => {}, {
      backfill: {
        async batch({ db }) {
          await sql`alter table tasks add column y text`.execute(db);
          return { cursor: null, visited: 0, changed: 0 };
        },
      },
    });
    expect(await rulesOf(ddlInBackfill)).toEqual(['ddl-in-backfill']);
  });

  it('knows the concurrent steps: a NOT VALID constraint needs a validate step; an index step passes', async () => {
    const addNotValid: MigrationDefinition['up'] = async ({ db }) =>
      void (await sql`alter table tasks add constraint c1 check (1 = 1) not valid`.execute(db));
    expect(await rulesOf(migration(addNotValid), 'postgres')).toEqual(['not-valid-never-validated']);
    expect(
      await lintMigration(
        migration(addNotValid, {
          concurrent: [
            { kind: 'validate-constraint', table: 'tasks', constraint: 'c1' },
            {
              kind: 'create-index',
              index: 't_i',
              table: 'tasks',
              build: (db) => db.schema.createIndex('t_i').on('tasks').column('title'),
            },
          ],
        }),
      ),
    ).toEqual([]);
  });

  it('would have flagged the migrations shipped before the rules (which is why they stop at 0056)', async () => {
    const byVersion = new Map(MIGRATIONS.map((m) => [m.version, m]));
    // 0052 and 0053 moved their index and CHECK validations to concurrent steps: they pass now.
    expect(await rulesOf(byVersion.get(53)!, 'postgres')).toEqual([]);
    expect(await rulesOf(byVersion.get(52)!, 'postgres')).toEqual([]);
    expect(await rulesOf(byVersion.get(56)!, 'postgres')).toEqual(['changing-column-type']);
    expect(await rulesOf(byVersion.get(7)!, 'sqlite')).toContain('data-change-in-ddl-step');
  });
});
