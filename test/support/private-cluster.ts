import { execFileSync, spawnSync } from 'node:child_process';
import { chmodSync, chownSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const BIN = process.env.TEST_PG_BIN ?? '/usr/lib/postgresql/15/bin';

/**
 * A PostgreSQL cluster of the test's own (`initdb` into `dataDir`, its own port), for faults that
 * kill or reconfigure a server: never the shared service. As root it runs as the `postgres` user
 * (PostgreSQL refuses root). `stop()` stops it with `-m immediate`; the caller removes its folders.
 */
export interface PrivateCluster {
  readonly port: number;
  readonly dataDir: string;
  /** `postgres://postgres@127.0.0.1:<port>/<database>`. */
  url(database?: string): string;
  /** A hot standby of this cluster (pg_basebackup -R into `dataDir`), started and in recovery. */
  startStandby(dataDir: string): Promise<PrivateCluster>;
  stop(): void;
}

/** Whether `initdb` is there to make private clusters (else the test file says so and fails in CI). */
export function privateClustersAvailable(): boolean {
  return spawnSync(join(BIN, 'initdb'), ['--version'], { stdio: 'ignore' }).status === 0;
}

const asRoot = process.getuid?.() === 0;
const postgresIds = (): { uid: number; gid: number } => ({
  uid: Number(execFileSync('id', ['-u', 'postgres']).toString().trim()),
  gid: Number(execFileSync('id', ['-g', 'postgres']).toString().trim()),
});

function runPg(binary: string, args: readonly string[]): void {
  const command = asRoot
    ? ['runuser', '-u', 'postgres', '--', join(BIN, binary), ...args]
    : [join(BIN, binary), ...args];
  const result = spawnSync(command[0]!, command.slice(1), { encoding: 'utf8' });
  if (result.status !== 0) throw new Error(`${binary} failed: ${result.stderr || result.stdout}`);
}

/** Makes `dir` (a new or empty folder) belong to the user the server runs as. */
export function ownForPostgres(dir: string): void {
  mkdirSync(dir, { recursive: true });
  if (asRoot) {
    const { uid, gid } = postgresIds();
    chownSync(dir, uid, gid);
  }
  chmodSync(dir, 0o700);
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const address = srv.address();
      srv.close(() => (typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no port'))));
    });
  });
}

async function start(dataDir: string, port: number, socketDir: string): Promise<PrivateCluster> {
  runPg('pg_ctl', [
    '-D',
    dataDir,
    '-w',
    '-t',
    '60',
    '-l',
    join(dataDir, 'server.log'),
    '-o',
    `-p ${port} -k ${socketDir} -c listen_addresses=127.0.0.1 -c fsync=off -c shared_buffers=16MB -c max_connections=60`,
    'start',
  ]);
  const cluster: PrivateCluster = {
    port,
    dataDir,
    url: (database = 'postgres') => `postgres://postgres@127.0.0.1:${port}/${database}`,
    startStandby: async (standbyDir: string) => {
      ownForPostgres(standbyDir);
      runPg('pg_basebackup', [
        '-D',
        standbyDir,
        '-R',
        // A fast checkpoint: the default spread one waits most of checkpoint_timeout.
        '-c',
        'fast',
        '-X',
        'stream',
        '-h',
        '127.0.0.1',
        '-p',
        String(port),
        '-U',
        'postgres',
      ]);
      return start(standbyDir, await freePort(), socketDir);
    },
    stop: () => {
      try {
        runPg('pg_ctl', ['-D', dataDir, '-m', 'immediate', '-w', 'stop']);
      } catch {
        // already stopped
      }
    },
  };
  return cluster;
}

/** initdb into `dataDir` (created, or an empty mount point) and start it on a free port. */
export async function startPrivateCluster(dataDir: string): Promise<PrivateCluster> {
  ownForPostgres(dataDir);
  runPg('initdb', ['-D', dataDir, '-U', 'postgres', '--auth=trust', '--no-sync', '-E', 'UTF8']);
  writeFileSync(
    join(dataDir, 'pg_hba.conf'),
    'local all all trust\nhost all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n',
  );
  const socketDir = mkdtempSync(join(tmpdir(), 'taskfence-pgsock-'));
  chmodSync(socketDir, 0o777);
  return start(dataDir, await freePort(), socketDir);
}

/** Removes a folder a private cluster used (after `stop()`). */
export function removeDir(dir: string): void {
  rmSync(dir, { recursive: true, force: true });
}
