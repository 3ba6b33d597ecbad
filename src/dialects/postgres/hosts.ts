/**
 * Several hosts in one PostgreSQL URL, as libpq takes them:
 * `postgres://user@h1:5432,h2:5433/app?target_session_attrs=read-write`.
 *
 * node-postgres connects to one host. Here every new connection of the store's pool (and its
 * LISTEN connection) goes to the host last found acceptable, and checks the session it got, as
 * libpq does: `read-write` wants `transaction_read_only` off, `primary` a server not in recovery,
 * `any` whatever answers. After a connection loss or a read-only error the store forgets that
 * host, and the next connection probes the list again, so after a failover the store finds the
 * new primary by itself (its calls fail typed, retry-safe, while no host accepts).
 */
import pg from 'pg';
import { InvalidDatabaseUrlError } from '../../errors.js';

/** One `host:port` of a host list. */
export interface PostgresHost {
  readonly host: string;
  readonly port: number;
}

/** The `target_session_attrs` a store can use: it writes, so a standby is never acceptable. */
export type TargetSessionAttrs = 'any' | 'read-write' | 'primary';

/** A PostgreSQL URL with its host list taken apart. */
export interface PostgresHostList {
  readonly hosts: readonly PostgresHost[];
  readonly targetSessionAttrs: TargetSessionAttrs;
  /** The URL with only the first host and without `target_session_attrs`: what pg parses for everything else. */
  readonly connectionString: string;
}

const AUTHORITY = /^(postgres(?:ql)?:\/\/(?:[^@/?#]*@)?)([^/?#]*)(.*)$/is;
const ACCEPTED: ReadonlySet<string> = new Set(['any', 'read-write', 'primary']);
const DEFAULT_PORT = 5432;

/** The `host:port,host:port` part of a `postgres://` URL, or undefined when the URL has no authority. */
function authorityOf(url: string): { before: string; hosts: string; after: string } | undefined {
  const m = AUTHORITY.exec(url);
  return m ? { before: m[1]!, hosts: m[2]!, after: m[3]! } : undefined;
}

/**
 * The URL as one host, for parsers that take one (WHATWG URL, pg), and a function that puts the
 * whole list back into a URL rebuilt from it. URLs without a list come back unchanged.
 */
export function withFirstHost(url: string): { url: string; restore(rebuilt: string): string } {
  const parts = authorityOf(url);
  if (!parts || !parts.hosts.includes(',')) return { url, restore: (rebuilt) => rebuilt };
  const first = parts.hosts.split(',')[0]!;
  return {
    url: parts.before + first + parts.after,
    restore: (rebuilt) => {
      const again = authorityOf(rebuilt);
      return again ? again.before + parts.hosts + again.after : rebuilt;
    },
  };
}

/**
 * Takes a PostgreSQL URL's host list and `target_session_attrs` apart. Undefined for a URL with
 * one host and no `target_session_attrs`: pg connects to it as it always did.
 *
 * @example
 * parsePostgresHostList('postgres://app@db1:5432,db2:5433/app?target_session_attrs=read-write')
 * // { hosts: [{ host: 'db1', port: 5432 }, { host: 'db2', port: 5433 }], targetSessionAttrs: 'read-write', … }
 */
export function parsePostgresHostList(url: string): PostgresHostList | undefined {
  const parts = authorityOf(url.trim());
  if (!parts) return undefined;
  const query = new URLSearchParams(/\?([^#]*)/.exec(parts.after)?.[1] ?? '');
  const attrs = query.getAll('target_session_attrs');
  if (!parts.hosts.includes(',') && attrs.length === 0) return undefined;
  if (attrs.length > 1) throw new InvalidDatabaseUrlError(url, 'give target_session_attrs once');
  const targetSessionAttrs = attrs[0] ?? 'any';
  if (!ACCEPTED.has(targetSessionAttrs)) {
    throw new InvalidDatabaseUrlError(
      url,
      `target_session_attrs=${targetSessionAttrs} is not for a store, which writes: use read-write, primary or any`,
    );
  }
  if (query.has('host') || query.has('port')) {
    throw new InvalidDatabaseUrlError(url, 'give a host list in the URL (h1:p1,h2:p2), not as host or port parameters');
  }
  const hosts = parts.hosts.split(',').map((entry) => parseHost(url, entry));
  query.delete('target_session_attrs');
  const rest = query.toString();
  const path = parts.after.replace(/\?.*$/s, '');
  return {
    hosts,
    targetSessionAttrs: targetSessionAttrs as TargetSessionAttrs,
    connectionString: `${parts.before}${parts.hosts.split(',')[0]!}${path}${rest === '' ? '' : `?${rest}`}`,
  };
}

function parseHost(url: string, entry: string): PostgresHost {
  const m = /^(\[[0-9a-fA-F:.]+\]|[^:[\]]+)(?::(\d{1,5}))?$/.exec(entry);
  if (!m) throw new InvalidDatabaseUrlError(url, `"${entry}" in the host list is not host or host:port`);
  const port = m[2] === undefined ? DEFAULT_PORT : Number(m[2]);
  if (port < 1 || port > 65_535) throw new InvalidDatabaseUrlError(url, `port ${port} is out of range`);
  return { host: decodeURIComponent(m[1]!.replace(/^\[(.+)\]$/, '$1')), port };
}

/** `host:port`, IPv6 addresses in brackets. */
export function formatHost(h: PostgresHost): string {
  return `${h.host.includes(':') ? `[${h.host}]` : h.host}:${h.port}`;
}

/** Reads what `target_session_attrs` judges, in one round trip. */
const SESSION_SQL =
  "select pg_is_in_recovery() as in_recovery, current_setting('transaction_read_only') = 'on' as read_only";

/** Why a session is not acceptable for `attrs`, or undefined when it is. */
async function refusal(client: pg.Client, attrs: TargetSessionAttrs): Promise<string | undefined> {
  if (attrs === 'any') return undefined;
  const { rows } = await client.query<{ in_recovery: boolean; read_only: boolean }>(SESSION_SQL);
  const row = rows[0]!;
  if (attrs === 'primary' && row.in_recovery) return 'a standby (in recovery)';
  if (attrs === 'read-write' && row.read_only) return row.in_recovery ? 'a standby (read-only)' : 'read-only';
  return undefined;
}

/** No host of the list accepted a session: the message names each host and its answer. */
export class NoAcceptableHostError extends Error {
  constructor(
    readonly attrs: TargetSessionAttrs,
    readonly answers: readonly string[],
  ) {
    super(`no host accepted a ${attrs} session (${answers.join('; ')})`);
    this.name = 'NoAcceptableHostError';
  }
}

/**
 * Which host of a list the store's connections go to. The host is found by probing every host at
 * once (the first acceptable answer wins, so a dead host costs no connect timeout), kept until
 * `suspect()`, and every session is checked again on connect.
 */
export class HostRouter {
  #current: PostgresHost | undefined;
  #finding: Promise<PostgresHost> | undefined;
  #clientClass: typeof pg.Client | undefined;
  /** Counts the times a host was found, for tests and events. */
  switches = 0;

  constructor(
    readonly list: PostgresHostList,
    /** pg's configuration of the first host: every probe and connection uses it with its own host and port. */
    private readonly config: pg.ClientConfig,
  ) {}

  /** The host connections go to now, if one is known. */
  get current(): PostgresHost | undefined {
    return this.#current;
  }

  /** Forgets the current host: the next connection probes the list again. */
  suspect(): void {
    this.#current = undefined;
  }

  /** Whether a client is connected to the current host (a client of a forgotten host is not reused). */
  serves(client: { host: string; port: number }): boolean {
    const current = this.#current;
    return current !== undefined && current.host === client.host && Number(current.port) === Number(client.port);
  }

  /** The current host, probing the list first when none is known. */
  host(): Promise<PostgresHost> {
    if (this.#current) return Promise.resolve(this.#current);
    this.#finding ??= this.#find().finally(() => (this.#finding = undefined));
    return this.#finding;
  }

  /** Checks a session of `host`: forgets the host and throws when it is not acceptable. */
  async check(client: pg.Client, host: PostgresHost): Promise<void> {
    const why = await refusal(client, this.list.targetSessionAttrs);
    if (why === undefined) return;
    if (this.#current === host) this.#current = undefined;
    throw new NoAcceptableHostError(this.list.targetSessionAttrs, [`${formatHost(host)}: ${why}`]);
  }

  async #find(): Promise<PostgresHost> {
    const answers: string[] = this.list.hosts.map((h) => `${formatHost(h)}: no answer`);
    const found = await new Promise<PostgresHost | undefined>((resolve) => {
      let pending = this.list.hosts.length;
      this.list.hosts.forEach((host, i) => {
        void this.#probe(host).then((why) => {
          answers[i] = `${formatHost(host)}: ${why ?? 'accepted'}`;
          if (why === undefined) resolve(host);
          if (--pending === 0) resolve(undefined);
        });
      });
    });
    if (!found) throw new NoAcceptableHostError(this.list.targetSessionAttrs, answers);
    this.#current = found;
    this.switches++;
    return found;
  }

  /** Undefined when `host` accepts a session, else why not. */
  async #probe(host: PostgresHost): Promise<string | undefined> {
    const client = new pg.Client(this.config);
    // pg takes host and port from the connection string over the config's: set them on the client.
    routeTo(client, host);
    client.on('error', () => {});
    try {
      await client.connect();
      return await refusal(client, this.list.targetSessionAttrs);
    } catch (error) {
      return (error as { code?: string }).code ?? (error instanceof Error ? error.message : String(error));
    } finally {
      await client.end().catch(() => {});
    }
  }

  /**
   * A `pg.Client` class whose `connect()` goes to the current host and checks the session: pass
   * it as the pool's `Client` (and use it for the LISTEN connection).
   */
  clientClass(): typeof pg.Client {
    return (this.#clientClass ??= routedClientClass(this));
  }
}

/** Points a client that has not connected yet at `host` (pg connects to its `host` and `port` fields). */
function routeTo(client: pg.Client, host: PostgresHost): void {
  const fields = client as unknown as { host: string; port: number };
  fields.host = host.host;
  fields.port = host.port;
}

/** See `HostRouter.clientClass`. */
function routedClientClass(router: HostRouter): typeof pg.Client {
  return class RoutedClient extends pg.Client {
    override connect(): Promise<pg.Client>;
    override connect(callback: (err: Error | null, client?: pg.Client) => void): void;
    override connect(callback?: (err: Error | null, client?: pg.Client) => void): Promise<pg.Client> | void {
      const connecting = this.#connectRouted().then(() => this as pg.Client);
      if (!callback) return connecting;
      connecting.then(
        (client) => callback(null, client),
        (error: Error) => callback(error),
      );
    }

    async #connectRouted(): Promise<void> {
      const host = await router.host();
      routeTo(this, host);
      try {
        await super.connect();
      } catch (error) {
        router.suspect();
        throw error;
      }
      try {
        await router.check(this, host);
      } catch (error) {
        await this.end().catch(() => {});
        throw error;
      }
    }
  };
}
