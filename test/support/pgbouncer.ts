import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';

/** Whether a `pgbouncer` binary is on the PATH (Debian: `apt-get install -y pgbouncer`). */
export function pgbouncerInstalled(): boolean {
  return spawnSync('pgbouncer', ['--version'], { stdio: 'ignore' }).status === 0;
}

/**
 * Whether a test file that starts its own PgBouncer runs here: always in CI (`.ci/run` installs
 * it, so a missing binary fails there), elsewhere only when it is installed; a skip says so.
 */
export function pgbouncerRunsHere(file: string): boolean {
  const runs = pgbouncerInstalled() || process.env.CI !== undefined;
  if (!runs)
    console.warn(`[taskfence tests] pgbouncer is not installed: ${file} skipped (apt-get install -y pgbouncer)`);
  return runs;
}

/** `directUrl`'s database, and its `?schema=` when the suite runs in one, through the pooler. */
export function throughPooler(bouncer: { url(database: string): string }, directUrl: string): string {
  const direct = new URL(directUrl);
  const through = new URL(bouncer.url(direct.pathname.slice(1)));
  through.search = direct.search;
  return through.toString();
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });
}

/**
 * A PgBouncer in transaction mode in front of the server `adminUrl` names, on a free local port.
 * `url(database)` is a URL through it. Started as a child process (as `postgres` when run as
 * root: PgBouncer refuses root); `stop()` ends it.
 */
export async function startPgbouncer(
  adminUrl: string,
): Promise<{ url(database: string): string; stop(): Promise<void> }> {
  const server = new URL(adminUrl);
  const user = decodeURIComponent(server.username || 'postgres');
  const password = decodeURIComponent(server.password);
  const dir = mkdtempSync(join(tmpdir(), 'taskfence-pgbouncer-'));
  chmodSync(dir, 0o777);
  const port = await freePort();
  writeFileSync(join(dir, 'users.txt'), `"${user}" "${password}"\n`, { mode: 0o644 });
  writeFileSync(
    join(dir, 'pgbouncer.ini'),
    [
      '[databases]',
      `* = host=${server.hostname} port=${server.port || 5432}`,
      '[pgbouncer]',
      'listen_addr = 127.0.0.1',
      `listen_port = ${port}`,
      'unix_socket_dir =',
      'auth_type = trust',
      `auth_file = ${join(dir, 'users.txt')}`,
      'pool_mode = transaction',
      'default_pool_size = 4',
      'max_client_conn = 200',
      // No ignore_startup_parameters: taskfence must send none a pooler rejects.
      '',
    ].join('\n'),
    { mode: 0o644 },
  );
  const asRoot = process.getuid?.() === 0;
  const child: ChildProcess = spawn('pgbouncer', [...(asRoot ? ['-u', 'postgres'] : []), join(dir, 'pgbouncer.ini')], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr?.on('data', (chunk) => (stderr += String(chunk)));
  const url = (database: string) => {
    const through = new URL(adminUrl);
    through.port = String(port);
    through.pathname = `/${database}`;
    return through.toString();
  };
  const stop = async () => {
    if (child.exitCode === null) {
      const exited = new Promise((resolve) => child.once('exit', resolve));
      child.kill('SIGTERM');
      await exited;
    }
    rmSync(dir, { recursive: true, force: true });
  };
  const started = Date.now();
  for (;;) {
    const client = new pg.Client({ connectionString: url(server.pathname.slice(1) || 'postgres') });
    try {
      await client.connect();
      await client.end();
      return { url, stop };
    } catch (error) {
      await client.end().catch(() => {});
      if (child.exitCode !== null || Date.now() - started > 10_000) {
        await stop();
        throw new Error(`PgBouncer did not start: ${stderr || String(error)}`);
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
}
