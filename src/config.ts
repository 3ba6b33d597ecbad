import { InvalidDatabaseUrlError } from './errors.js';
import { parsePostgresHostList, withFirstHost } from './dialects/postgres/hosts.js';

/** Where a store's data lives, parsed from a database URL. */
export type DatabaseLocation =
  | { readonly dialect: 'sqlite'; readonly filename: string; readonly url: string }
  | {
      readonly dialect: 'postgres';
      /** The URL handed to pg: without taskfence's own `schema` parameter. */
      readonly connectionString: string;
      readonly url: string;
      /** From `?schema=`: the PostgreSQL schema taskfence's tables live in. */
      readonly schema?: string;
    };

/** The URL used when none is given: `TASKFENCE_DATABASE_URL`, else an SQLite file in the working directory. */
export function defaultDatabaseUrl(env: NodeJS.ProcessEnv = process.env): string {
  const fromEnv = env.TASKFENCE_DATABASE_URL;
  return fromEnv && fromEnv.trim() !== '' ? fromEnv.trim() : 'sqlite:./taskfence.db';
}

/**
 * Parses `sqlite:<path>`, `sqlite::memory:`, `sqlite://<path>`, `postgres://…` or `postgresql://…`.
 * A PostgreSQL URL may list several hosts, as libpq does:
 * `postgres://app@db1:5432,db2:5432/app?target_session_attrs=read-write` (see `parsePostgresHostList`).
 *
 * @example parseDatabaseUrl('sqlite:./data/app.db') // { dialect: 'sqlite', filename: './data/app.db', … }
 */
export function parseDatabaseUrl(url: string): DatabaseLocation {
  if (typeof url !== 'string' || url.trim() === '') {
    throw new InvalidDatabaseUrlError(String(url), 'the URL is empty');
  }
  const trimmed = url.trim();
  const scheme = /^([a-zA-Z][a-zA-Z0-9+.-]*):/.exec(trimmed)?.[1]?.toLowerCase();
  if (scheme === undefined) {
    throw new InvalidDatabaseUrlError(url, 'it has no scheme');
  }
  if (scheme === 'sqlite') {
    let rest = trimmed.slice('sqlite:'.length);
    if (rest.startsWith('//')) rest = rest.slice(2);
    if (rest === '') throw new InvalidDatabaseUrlError(url, 'the SQLite path is empty');
    if (rest.includes('\0')) throw new InvalidDatabaseUrlError(url, 'the SQLite path contains a NUL byte');
    if (rest.includes('?')) throw new InvalidDatabaseUrlError(url, 'SQLite URLs take no query parameters');
    return { dialect: 'sqlite', filename: rest, url: trimmed };
  }
  if (scheme === 'postgres' || scheme === 'postgresql') {
    // A host list (h1:p1,h2:p2, as libpq takes it) is checked here and parsed as its first host.
    parsePostgresHostList(trimmed);
    const oneHost = withFirstHost(trimmed);
    let parsed: URL;
    try {
      parsed = new URL(oneHost.url);
    } catch {
      throw new InvalidDatabaseUrlError(url, 'it is not a well-formed URL');
    }
    if (parsed.hostname === '' && !parsed.searchParams.has('host')) {
      throw new InvalidDatabaseUrlError(url, 'it names no host');
    }
    const schemas = parsed.searchParams.getAll('schema');
    if (schemas.length === 0) return { dialect: 'postgres', connectionString: trimmed, url: trimmed };
    if (schemas.length > 1 || schemas[0] === '')
      throw new InvalidDatabaseUrlError(url, 'give the schema parameter once, with a value');
    // pg would pass an unknown parameter on to the server as a setting: strip it.
    parsed.searchParams.delete('schema');
    return {
      dialect: 'postgres',
      connectionString: oneHost.restore(parsed.toString()),
      url: trimmed,
      schema: schemas[0]!,
    };
  }
  throw new InvalidDatabaseUrlError(url, `the scheme "${scheme}:" is not supported`);
}

/** A URL safe to print: the password replaced by `***`. */
export function redactDatabaseUrl(url: string): string {
  return url.replace(/(\/\/[^:/@]+:)[^@/]*@/, '$1***@');
}
