import { describe, expect, it } from 'vitest';
import { InvalidDatabaseUrlError, parseDatabaseUrl, redactDatabaseUrl } from '../../src/index.js';
import { parsePostgresHostList, withFirstHost } from '../../src/dialects/postgres/hosts.js';

function errorOf(fn: () => unknown): unknown {
  try {
    fn();
  } catch (e) {
    return e;
  }
  return undefined;
}

describe('PostgreSQL host lists (as libpq takes them)', () => {
  it('takes several hosts and target_session_attrs apart, default port 5432', () => {
    const list = parsePostgresHostList(
      'postgres://app:secret@db1:5433,db2,[::1]:6000/app?target_session_attrs=read-write&sslmode=disable',
    );
    expect(list).toEqual({
      hosts: [
        { host: 'db1', port: 5433 },
        { host: 'db2', port: 5432 },
        { host: '::1', port: 6000 },
      ],
      targetSessionAttrs: 'read-write',
      connectionString: 'postgres://app:secret@db1:5433/app?sslmode=disable',
    });
  });

  it('defaults target_session_attrs to any, as libpq does, and accepts primary', () => {
    expect(parsePostgresHostList('postgres://h1,h2/db')?.targetSessionAttrs).toBe('any');
    expect(parsePostgresHostList('postgresql://h1:1,h2:2/db?target_session_attrs=primary')).toMatchObject({
      targetSessionAttrs: 'primary',
      connectionString: 'postgresql://h1:1/db',
    });
  });

  it('leaves a one-host URL alone, unless it asks for target_session_attrs', () => {
    expect(parsePostgresHostList('postgres://u@db:5432/app')).toBeUndefined();
    expect(parsePostgresHostList('postgres://u@db:5432/app?target_session_attrs=read-write')).toMatchObject({
      hosts: [{ host: 'db', port: 5432 }],
      connectionString: 'postgres://u@db:5432/app',
    });
  });

  it('refuses session kinds a store cannot write through, and malformed lists, before any connection', () => {
    for (const bad of [
      'postgres://h1,h2/db?target_session_attrs=standby',
      'postgres://h1,h2/db?target_session_attrs=read-only',
      'postgres://h1,h2/db?target_session_attrs=prefer-standby',
      'postgres://h1,h2/db?target_session_attrs=any&target_session_attrs=primary',
      'postgres://h1,,h2/db',
      'postgres://h1:99999,h2/db',
      'postgres://h1:x,h2/db',
      'postgres://h1,h2/db?port=5432',
    ]) {
      expect(
        errorOf(() => parseDatabaseUrl(bad)),
        bad,
      ).toBeInstanceOf(InvalidDatabaseUrlError);
    }
  });

  it('parses as a database URL that keeps its host list and its schema parameter apart', () => {
    const location = parseDatabaseUrl('postgres://u:pw@h1:5432,h2:5433/app?target_session_attrs=read-write&schema=tf');
    expect(location).toMatchObject({
      dialect: 'postgres',
      schema: 'tf',
      connectionString: 'postgres://u:pw@h1:5432,h2:5433/app?target_session_attrs=read-write',
    });
  });

  it('redacts the password of a host list like any URL', () => {
    expect(redactDatabaseUrl('postgres://u:s3cret@h1:5432,h2:5433/app?target_session_attrs=read-write')).toBe(
      'postgres://u:***@h1:5432,h2:5433/app?target_session_attrs=read-write',
    );
    expect(redactDatabaseUrl('postgres://h1:5432,h2:5433/app')).toBe('postgres://h1:5432,h2:5433/app');
  });

  it('gives parsers of one host the first host, and puts the list back', () => {
    const one = withFirstHost('postgres://u@h1:1,h2:2/db?x=1');
    expect(one.url).toBe('postgres://u@h1:1/db?x=1');
    expect(one.restore('postgres://u@h1:1/db')).toBe('postgres://u@h1:1,h2:2/db');
  });
});
