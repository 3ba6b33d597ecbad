import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { openStore, type Store, type StoreOptions } from '../../src/index.js';

/**
 * What a shared suite needs from a dialect: fresh empty databases, each its own (an SQLite file
 * in a temp folder; a PostgreSQL database created for it), and cleanup at the end of the file.
 */
export interface DialectFixture {
  readonly kind: 'sqlite' | 'postgres';
  /** A URL of a new, empty database. */
  freshUrl(): Promise<string>;
  /** A fresh database, opened and migrated to the latest version (or `to`). */
  freshStore(options?: Omit<StoreOptions, 'url'> & { to?: number }): Promise<Store>;
  /** Opens another store on an existing URL; closed at cleanup. */
  open(url: string, options?: Omit<StoreOptions, 'url'>): Promise<Store>;
  /** Closes every store this fixture opened and drops its databases. */
  cleanup(): Promise<void>;
}

abstract class BaseFixture implements DialectFixture {
  abstract readonly kind: 'sqlite' | 'postgres';
  protected readonly stores: Store[] = [];
  abstract freshUrl(): Promise<string>;
  async freshStore(options: Omit<StoreOptions, 'url'> & { to?: number } = {}): Promise<Store> {
    const { to, ...storeOptions } = options;
    const store = await openStore({ ...storeOptions, url: await this.freshUrl() });
    this.stores.push(store);
    await store.migrate(to === undefined ? {} : { to });
    return store;
  }
  /** Opens another store on an existing URL; closed at cleanup. */
  async open(url: string, options: Omit<StoreOptions, 'url'> = {}): Promise<Store> {
    const store = await openStore({ ...options, url });
    this.stores.push(store);
    return store;
  }
  async cleanup(): Promise<void> {
    await Promise.allSettled(this.stores.map((s) => s.close()));
    this.stores.length = 0;
  }
}

export class SqliteFixture extends BaseFixture {
  readonly kind = 'sqlite' as const;
  readonly dir = mkdtempSync(join(tmpdir(), 'taskfence-sqlite-'));
  #n = 0;
  async freshUrl(): Promise<string> {
    return `sqlite:${join(this.dir, `db-${++this.#n}.sqlite`)}`;
  }
  override async cleanup(): Promise<void> {
    await super.cleanup();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** What a PostgreSQL fixture's databases are configured with, as a DBA might configure them. */
export interface PostgresFixtureOptions {
  /**
   * `ALTER DATABASE <the fixture's own database> SET default_transaction_isolation = …` right
   * after creating it (never on the server or another database), so every session of the test,
   * and of its contender processes, starts with that default.
   */
  readonly defaultIsolation?: 'read committed' | 'repeatable read' | 'serializable';
}

export class PostgresFixture extends BaseFixture {
  readonly kind = 'postgres' as const;
  readonly #adminUrl: string;
  readonly #created: string[] = [];
  readonly #options: PostgresFixtureOptions;
  constructor(adminUrl: string, options: PostgresFixtureOptions = {}) {
    super();
    this.#adminUrl = adminUrl;
    this.#options = options;
  }
  async #admin<T>(fn: (client: pg.Client) => Promise<T>): Promise<T> {
    const client = new pg.Client({ connectionString: this.#adminUrl });
    await client.connect();
    try {
      return await fn(client);
    } finally {
      await client.end();
    }
  }
  async freshUrl(): Promise<string> {
    return this.#createDatabase(null);
  }

  /**
   * A fresh database at the latest version, cloned from a database this fixture migrated once
   * (`CREATE DATABASE … TEMPLATE`): migrating a new PostgreSQL database to the latest version
   * takes about a second, and the suites make hundreds. The clone is then opened and migrated
   * like any other, which finds nothing to do. A store in another schema, or migrated to an
   * earlier version, is made the long way, as are the migration suites' own databases
   * (`freshUrl`).
   */
  override async freshStore(options: Omit<StoreOptions, 'url'> & { to?: number } = {}): Promise<Store> {
    const { to, ...storeOptions } = options;
    if (to !== undefined || storeOptions.schema !== undefined) return super.freshStore(options);
    const template = await (this.#template ??= this.#migratedTemplate());
    const store = await openStore({ ...storeOptions, url: await this.#createDatabase(template) });
    this.stores.push(store);
    await store.migrate();
    return store;
  }
  #template: Promise<string> | null = null;

  async #migratedTemplate(): Promise<string> {
    const url = await this.#createDatabase(null);
    const store = await openStore({ url });
    try {
      await store.migrate();
    } finally {
      await store.close();
    }
    const name = new URL(url).pathname.slice(1);
    // A database with a session open cannot be a template. Through a pooler (the PgBouncer pass)
    // the pooler keeps its server connection to the template after the store closes, so end it.
    await this.#admin((c) =>
      c.query('select pg_terminate_backend(pid) from pg_stat_activity where datname = $1 and pid <> pg_backend_pid()', [
        name,
      ]),
    );
    return name;
  }

  /** A new database (empty, or a copy of `template`) with the fixture's settings; its URL. */
  async #createDatabase(template: string | null): Promise<string> {
    const name = `tf_${randomBytes(6).toString('hex')}`;
    await this.#admin(async (c) => {
      await c.query(`create database ${name}${template === null ? '' : ` template ${template}`}`);
      // Settings of a database are not copied with it.
      if (this.#options.defaultIsolation !== undefined) {
        await c.query(`alter database ${name} set default_transaction_isolation = '${this.#options.defaultIsolation}'`);
      }
    });
    this.#created.push(name);
    const url = new URL(this.#adminUrl);
    url.pathname = `/${name}`;
    const schema = process.env.TEST_PG_SCHEMA;
    if (schema) {
      // The whole suite in a non-public schema, beside a host's own public.tasks that must not matter.
      url.searchParams.set('schema', schema);
      if (template === null) {
        const db = new pg.Client({ connectionString: new URL(`/${name}`, this.#adminUrl).toString() });
        await db.connect();
        try {
          await db.query('create table public.tasks (id text primary key, host_column text)');
        } finally {
          await db.end();
        }
      }
    }
    return url.toString();
  }
  override async cleanup(): Promise<void> {
    await super.cleanup();
    this.#template = null;
    const names = this.#created.splice(0);
    await this.#admin(async (c) => {
      for (const name of names) await c.query(`drop database if exists ${name} with (force)`);
    });
  }
}
