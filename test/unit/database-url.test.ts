import { describe, expect, it } from 'vitest';
import { InvalidDatabaseUrlError, defaultDatabaseUrl, parseDatabaseUrl, redactDatabaseUrl } from '../../src/index.js';

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
