import os from 'node:os';
import Database from 'better-sqlite3';
import pg from 'pg';

/** What the figures were measured on. */
export async function describeMachine(pgUrl: string) {
  const sqlite = new Database(':memory:');
  const sqliteVersion = (sqlite.prepare('select sqlite_version() as v').get() as { v: string }).v;
  sqlite.close();
  const client = new pg.Client({ connectionString: pgUrl });
  await client.connect();
  const pgVersion = (await client.query<{ server_version: string }>('show server_version')).rows[0]!.server_version;
  await client.end();
  return {
    date: new Date().toISOString(),
    cpus: os.cpus().length,
    cpuModel: os.cpus()[0]?.model ?? 'unknown',
    memoryGiB: Math.round(os.totalmem() / 2 ** 30),
    node: process.version,
    sqlite: sqliteVersion,
    postgres: pgVersion,
    platform: `${os.platform()} ${os.release()}`,
  };
}
