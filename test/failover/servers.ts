/**
 * Plain private PostgreSQL 15 servers for the host-list tests: a primary from `initdb`, a
 * streaming standby cloned from it with `pg_basebackup -R`, each in a temporary directory on a
 * port of its own, driven with `pg_ctl` (stop -m immediate, promote). Never the machine's service.
 */
import { execFileSync } from 'node:child_process';
import { appendFileSync, chownSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { PG_BIN, freePort } from './cluster.js';

const root = process.getuid?.() === 0;

/** Runs a PostgreSQL binary, as the postgres user when this process is root. */
function run(binary: string, args: string[]): string {
  const [cmd, argv] = root
    ? ['runuser', ['-u', 'postgres', '--', join(PG_BIN, binary), ...args]]
    : [join(PG_BIN, binary), args];
  return execFileSync(cmd, argv, { stdio: ['ignore', 'pipe', 'pipe'] }).toString();
}

export class PrivateServer {
  constructor(
    readonly dataDir: string,
    readonly port: number,
  ) {}

  start(): void {
    run('pg_ctl', ['-D', this.dataDir, '-l', `${this.dataDir}.log`, '-w', '-t', '60', 'start']);
  }

  /** Stops the server at once, like a crash (`pg_ctl stop -m immediate`). */
  crash(): void {
    run('pg_ctl', ['-D', this.dataDir, '-m', 'immediate', '-w', 'stop']);
  }

  promote(): void {
    run('pg_ctl', ['-D', this.dataDir, '-w', 'promote']);
  }

  stopQuietly(): void {
    try {
      run('pg_ctl', ['-D', this.dataDir, '-m', 'immediate', '-w', 'stop']);
    } catch {
      // not running
    }
  }

  /** Runs one statement as the superuser (ALTER SYSTEM on this private server only). */
  async sql(text: string, database = 'postgres'): Promise<pg.QueryResult> {
    const client = new pg.Client({ host: '127.0.0.1', port: this.port, user: 'postgres', database });
    client.on('error', () => {});
    await client.connect();
    try {
      return await client.query(text);
    } finally {
      await client.end().catch(() => {});
    }
  }
}

/** A primary and a standby streaming from it, in one temporary directory. */
export class PrimaryAndStandby {
  private constructor(
    readonly dir: string,
    readonly primary: PrivateServer,
    readonly standby: PrivateServer,
  ) {}

  static async start(database: string): Promise<PrimaryAndStandby> {
    const dir = mkdtempSync(join(tmpdir(), 'taskfence-hosts-'));
    if (root) {
      chownSync(
        dir,
        Number(execFileSync('id', ['-u', 'postgres']).toString()),
        Number(execFileSync('id', ['-g', 'postgres']).toString()),
      );
    }
    const primary = new PrivateServer(join(dir, 'primary'), await freePort());
    const standby = new PrivateServer(join(dir, 'standby'), await freePort());
    const pair = new PrimaryAndStandby(dir, primary, standby);
    try {
      run('initdb', ['-D', primary.dataDir, '-U', 'postgres', '--auth=trust', '-E', 'UTF8', '--no-sync']);
      // In postgresql.conf, so a restart keeps them; the standby's clone gets its own port after.
      appendFileSync(
        join(primary.dataDir, 'postgresql.conf'),
        `\nport = ${primary.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '${dir}'\n` +
          'wal_level = replica\nmax_wal_senders = 5\nhot_standby = on\nfsync = off\n',
      );
      primary.start();
      await primary.sql(`create database ${database}`);
      run('pg_basebackup', [
        '-h',
        '127.0.0.1',
        '-p',
        String(primary.port),
        '-U',
        'postgres',
        '-D',
        standby.dataDir,
        '-R',
        '-X',
        'stream',
        '--no-sync',
        '--checkpoint=fast',
      ]);
      appendFileSync(join(standby.dataDir, 'postgresql.conf'), `\nport = ${standby.port}\n`);
      standby.start();
    } catch (error) {
      pair.stop();
      throw error;
    }
    return pair;
  }

  stop(): void {
    this.standby.stopQuietly();
    this.primary.stopQuietly();
    rmSync(this.dir, { recursive: true, force: true });
  }
}
