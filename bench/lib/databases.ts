import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import pg from 'pg';

/** Fresh databases for the benchmarks: SQLite files in one temp folder, PostgreSQL databases on `adminUrl`. */
export class BenchDatabases {
  readonly dir = mkdtempSync(join(tmpdir(), 'taskfence-bench-'));
  readonly #created: string[] = [];
  #n = 0;
  constructor(readonly adminUrl: string) {}

  sqliteFile(): string {
    return join(this.dir, `bench-${++this.#n}.sqlite`);
  }

  async postgresUrl(template?: string): Promise<string> {
    const name = `tfbench_${randomBytes(5).toString('hex')}`;
    await this.admin(`create database ${name}${template ? ` template ${template}` : ''}`);
    this.#created.push(name);
    const url = new URL(this.adminUrl);
    url.pathname = `/${name}`;
    return url.toString();
  }

  async admin(statement: string): Promise<void> {
    const client = new pg.Client({ connectionString: this.adminUrl });
    await client.connect();
    try {
      await client.query(statement);
    } finally {
      await client.end();
    }
  }

  async dropAll(): Promise<void> {
    for (const name of this.#created.splice(0)) await this.admin(`drop database if exists ${name} with (force)`);
  }
}

export function databaseName(url: string): string {
  return new URL(url).pathname.slice(1);
}
