import { describe, expect, it } from 'vitest';
import { CompiledQuery } from 'kysely';
import fc from 'fast-check';
import { InvalidDatabaseUrlError, defaultDatabaseUrl, parseDatabaseUrl, redactDatabaseUrl } from '../../src/index.js';
import { normalizeExpression, normalizeType, splitTopLevel } from '../../src/schema/describe.js';
import { inlineParameters } from '../../src/migrator/recording-driver.js';
import { parseArgs } from '../../src/cli.js';

describe('database URLs', () => {
  it('accepts the documented forms', () => {
    expect(parseDatabaseUrl('sqlite:./taskfence.db')).toMatchObject({ dialect: 'sqlite', filename: './taskfence.db' });
    expect(parseDatabaseUrl('sqlite::memory:')).toMatchObject({ dialect: 'sqlite', filename: ':memory:' });
    expect(parseDatabaseUrl('sqlite:///var/data/x.db')).toMatchObject({
      dialect: 'sqlite',
      filename: '/var/data/x.db',
    });
    expect(parseDatabaseUrl('postgres://u:p@db:5432/app')).toMatchObject({ dialect: 'postgres' });
    expect(parseDatabaseUrl('postgresql://db/app')).toMatchObject({ dialect: 'postgres' });
  });

  it('rejects malformed and unsupported URLs with an error naming the URL and the accepted forms', () => {
    for (const bad of [
      '',
      '   ',
      'taskfence.db',
      'mysql://localhost/x',
      'sqlite:',
      'postgres://',
      'sqlite:x.db?mode=ro',
    ]) {
      const error = (() => {
        try {
          parseDatabaseUrl(bad);
        } catch (e) {
          return e;
        }
      })();
      expect(error, bad).toBeInstanceOf(InvalidDatabaseUrlError);
      expect((error as Error).message).toMatch(
        /Use sqlite:<path>, sqlite::memory:, postgres:\/\/… or postgresql:\/\/…/,
      );
    }
  });

  it('defaults to TASKFENCE_DATABASE_URL, else ./taskfence.db', () => {
    expect(defaultDatabaseUrl({})).toBe('sqlite:./taskfence.db');
    expect(defaultDatabaseUrl({ TASKFENCE_DATABASE_URL: 'postgres://h/db' })).toBe('postgres://h/db');
  });

  it('redacts passwords when printing', () => {
    expect(redactDatabaseUrl('postgres://user:secret@host:5432/db')).toBe('postgres://user:***@host:5432/db');
  });
});

describe('schema normalization', () => {
  it('maps both dialects to one set of logical types', () => {
    expect(['INTEGER', 'bigint', 'integer', 'smallint'].map(normalizeType)).toEqual([
      'integer',
      'integer',
      'integer',
      'integer',
    ]);
    expect(['TEXT', 'character varying', 'text'].map(normalizeType)).toEqual(['text', 'text', 'text']);
  });

  it('makes SQLite source text and PostgreSQL deparsed expressions compare equal', () => {
    expect(normalizeExpression(`COALESCE(target_key, ''::text)`)).toBe(normalizeExpression(`coalesce(target_key, '')`));
    expect(normalizeExpression(`(status = 'running'::text)`)).toBe(normalizeExpression(`status = 'running'`));
    expect(normalizeExpression(`'backlog'::text`)).toBe(normalizeExpression(`'backlog'`));
  });

  it('splits index column lists on top-level commas only', () => {
    expect(splitTopLevel(`a, coalesce(b, ''), "c"`)).toEqual(['a', `coalesce(b, '')`, '"c"']);
    expect(splitTopLevel(`coalesce(x, ','), y`)).toEqual([`coalesce(x, ',')`, 'y']);
  });
});

describe('plan rendering', () => {
  it('inlines parameters as literals, leaving placeholders inside strings alone', () => {
    const sqlite = CompiledQuery.raw(`update t set a = ? where b = '?' and c = ?`, ["it's", 3]);
    expect(inlineParameters('sqlite', sqlite)).toBe(`update t set a = 'it''s' where b = '?' and c = 3`);
    const pg = CompiledQuery.raw(`select $1, '$2', $2, $10`, [1, null, ...Array(7).fill(0), 'ten']);
    expect(inlineParameters('postgres', pg)).toBe(`select 1, '$2', NULL, 'ten'`);
  });

  it('round-trips any string literal', () => {
    fc.assert(
      fc.property(fc.string(), (s) => {
        const rendered = inlineParameters('sqlite', CompiledQuery.raw('select ?', [s]));
        expect(rendered).toBe(`select '${s.replace(/'/g, "''")}'`);
      }),
    );
  });
});

describe('CLI arguments', () => {
  it('parses versions written either way', () => {
    expect(parseArgs(['migrate', '--to', '0052', '--db', 'sqlite:x.db'])).toMatchObject({
      command: 'migrate',
      to: 52,
      db: 'sqlite:x.db',
    });
    expect(parseArgs(['migrate', '--baseline=5'])).toMatchObject({ baseline: 5 });
    expect(parseArgs(['status', '--json'])).toMatchObject({ command: 'status', json: true });
    expect(parseArgs([])).toMatchObject({ command: 'help' });
  });

  it('rejects options that do not belong to the command', () => {
    expect(() => parseArgs(['plan', '--baseline', '5'])).toThrow(/not an option of plan/);
    expect(() => parseArgs(['status', '--lock-timeout', '5'])).toThrow(/not an option of status/);
  });
});
