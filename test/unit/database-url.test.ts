import { describe, expect, it } from 'vitest';
import { InvalidDatabaseUrlError, defaultDatabaseUrl, parseDatabaseUrl, redactDatabaseUrl } from '../../src/index.js';
import { scrubSecrets, secretsIn } from '../../src/database-url-redaction.js';

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

  // The marker appears in every form a password takes in a URL; none may survive redaction.
  const MARKER = 'Mk7Secret';
  const FORMS: readonly [string, string][] = [
    [`postgres://u:${MARKER}@h:5432/db`, 'postgres://u:***@h:5432/db'],
    [`postgres://u:${MARKER}@part@h:5432/db`, 'postgres://u:***@h:5432/db'],
    [`postgres://u:a@b@${MARKER}@h/db?sslmode=disable`, 'postgres://u:***@h/db?sslmode=disable'],
    [`postgresql://u:${MARKER}/x?y@h/db`, 'postgresql://u:***@h/db'],
    [`postgres://u:${encodeURIComponent(`${MARKER}@/:`)}@h/db`, 'postgres://u:***@h/db'],
    [`postgres://h:5999/tf?user=pw&password=${MARKER}`, 'postgres://h:5999/tf?user=pw&password=***'],
    [`postgres://h/tf?password=${MARKER}@x&schema=s`, 'postgres://h/tf?password=***&schema=s'],
    [`postgres://u:a?b=${MARKER}@127.0.0.1:1/db`, 'postgres://u:***@127.0.0.1:1/db'],
    [`postgres://u:${MARKER}?x=1@h/db`, 'postgres://u:***@h/db'],
    [`postgres://u:${MARKER}?password=x@h/db?password=${MARKER}`, 'postgres://u:***'],
    [`postgres://h:5432/db?password=p@${MARKER}`, 'postgres://h:***'],
    [`postgres://h/tf?Password=${MARKER}`, 'postgres://h/tf?Password=***'],
    [`postgres://h/tf?sslpassword=${MARKER}#frag`, 'postgres://h/tf?sslpassword=***#frag'],
    [`postgres://u:${MARKER}@h1:5432,h2:5433/db`, 'postgres://u:***@h1:5432,h2:5433/db'],
    [`postgres://u:${MARKER}@[::1]:5432/db`, 'postgres://u:***@[::1]:5432/db'],
    [`host=h dbname=db password=${MARKER} user=u`, 'host=h dbname=db password=*** user=u'],
    [`host=h password='${MARKER} x' user=u`, 'host=h password=*** user=u'],
    [`password = ${MARKER}`, 'password = ***'],
  ];

  it.each(FORMS)('redacts every form: %s', (url, expected) => {
    expect(redactDatabaseUrl(url)).toBe(expected);
    expect(redactDatabaseUrl(url)).not.toContain(MARKER);
    expect(secretsIn(url).some((s) => s.includes(MARKER))).toBe(true);
    expect(
      scrubSecrets(`x ${url} ${decodeURIComponent(url.replace(/%(?![0-9A-F]{2})/g, ''))} y`, secretsIn(url)),
    ).not.toContain(MARKER);
  });

  it('leaves URLs without a password as they are', () => {
    for (const url of [
      'postgres://u@h/db',
      'postgres://h/db?user=u',
      'sqlite:./a@b.db',
      'postgres://h/db?schema=a@b',
    ]) {
      expect(redactDatabaseUrl(url)).toBe(url);
    }
  });

  it('an invalid URL is reported without its password', () => {
    for (const url of [`host=h password=${MARKER}`, `mysql://u:${MARKER}@h/db`, `postgres://u:${MARKER}@/db`]) {
      const error = (() => {
        try {
          parseDatabaseUrl(url);
        } catch (e) {
          return e as InvalidDatabaseUrlError;
        }
        throw new Error(`${url} parsed`);
      })();
      expect(error).toBeInstanceOf(InvalidDatabaseUrlError);
      expect(error.message).not.toContain(MARKER);
      expect(error.url).not.toContain(MARKER);
    }
  });
});
