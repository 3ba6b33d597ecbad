/**
 * A private two-node PostgreSQL 15 cluster on loopback, managed by Patroni with etcd (Debian's
 * packages): streaming replication, automatic failover (`primary_start_timeout: 0`, so a killed
 * primary is replaced instead of restarted), pg_rewind to bring the old primary back as a
 * standby. Everything lives in one temporary directory on ports of its own; the machine's
 * PostgreSQL service is never touched.
 */
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { createServer } from 'node:net';
import { chownSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync, readdirSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';

export const PG_BIN = process.env.TASKFENCE_PG_BIN ?? '/usr/lib/postgresql/15/bin';

export interface Node {
  readonly name: string;
  readonly pgPort: number;
  readonly restPort: number;
  readonly dataDir: string;
}

/** One member as Patroni's REST API lists it. */
export interface Member {
  readonly name: string;
  readonly role: string;
  readonly state: string;
  readonly port: number;
  readonly lag?: number | string;
  readonly timeline?: number;
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Patroni runs PostgreSQL, which refuses to run as root: as root, run it as the postgres user. */
function asPostgres(command: string, args: string[]): [string, string[]] {
  return process.getuid?.() === 0 ? ['runuser', ['-u', 'postgres', '--', command, ...args]] : [command, args];
}

export class PatroniCluster {
  readonly nodes: Node[] = [];
  readonly #children: ChildProcess[] = [];
  #etcdPort = 0;
  readonly database = 'taskfence';

  private constructor(
    readonly dir: string,
    /** Whether a healthy cluster needs a synchronous standby (changed with `patchConfig`). */
    public synchronous: boolean,
  ) {}

  /** Starts etcd and two Patroni nodes, and waits for a primary and a streaming standby. */
  static async start(options: { synchronous: boolean }): Promise<PatroniCluster> {
    const dir = mkdtempSync(join(tmpdir(), 'taskfence-failover-'));
    const cluster = new PatroniCluster(dir, options.synchronous);
    try {
      await cluster.#start();
    } catch (error) {
      await cluster.stop();
      throw error;
    }
    return cluster;
  }

  async #start(): Promise<void> {
    if (process.getuid?.() === 0) {
      const uid = Number(execFileSync('id', ['-u', 'postgres']).toString());
      const gid = Number(execFileSync('id', ['-g', 'postgres']).toString());
      chownSync(this.dir, uid, gid);
    }
    this.#etcdPort = await freePort();
    const peerPort = await freePort();
    this.#spawn('etcd', 'etcd', [
      '--name=tf',
      `--data-dir=${join(this.dir, 'etcd')}`,
      `--listen-client-urls=http://127.0.0.1:${this.#etcdPort}`,
      `--advertise-client-urls=http://127.0.0.1:${this.#etcdPort}`,
      `--listen-peer-urls=http://127.0.0.1:${peerPort}`,
      `--initial-advertise-peer-urls=http://127.0.0.1:${peerPort}`,
      `--initial-cluster=tf=http://127.0.0.1:${peerPort}`,
      '--log-level=warn',
    ]);
    await this.#waitFor('etcd', async () => (await fetch(`http://127.0.0.1:${this.#etcdPort}/health`)).ok, 30_000);
    for (const name of ['node1', 'node2']) {
      const node = { name, pgPort: await freePort(), restPort: await freePort(), dataDir: join(this.dir, name) };
      this.nodes.push(node);
    }
    // The first node bootstraps alone; the second then clones it (pg_basebackup), so they never race.
    this.#startNode(this.nodes[0]!);
    await this.#waitFor('a primary', async () => (await this.members()).some((m) => isPrimary(m)), 90_000);
    this.#startNode(this.nodes[1]!);
    await this.waitHealthy(120_000);
    const admin = new pg.Client(this.#adminConfig((await this.currentPrimary())!));
    await admin.connect();
    try {
      await admin.query(`create database ${this.database}`);
    } finally {
      await admin.end();
    }
    await this.waitHealthy(60_000);
  }

  #adminConfig(node: Node): pg.ClientConfig {
    return { host: '127.0.0.1', port: node.pgPort, user: 'postgres', database: 'postgres' };
  }

  #spawn(name: string, command: string, args: string[]): ChildProcess {
    const log = openSync(join(this.dir, `${name}.log`), 'a');
    const [cmd, argv] = command === 'patroni' ? asPostgres(command, args) : [command, args];
    // Its own process group: stop() ends exactly what was started here.
    const child = spawn(cmd, argv, { stdio: ['ignore', log, log], detached: true });
    this.#children.push(child);
    return child;
  }

  #startNode(node: Node): void {
    const config = join(this.dir, `${node.name}.yml`);
    writeFileSync(config, this.#patroniConfig(node));
    if (process.getuid?.() === 0) {
      const uid = Number(execFileSync('id', ['-u', 'postgres']).toString());
      chownSync(config, uid, uid === 0 ? 0 : Number(execFileSync('id', ['-g', 'postgres']).toString()));
    }
    this.#spawn(`patroni-${node.name}`, 'patroni', [config]);
  }

  #patroniConfig(node: Node): string {
    return `scope: taskfence
namespace: /taskfence/
name: ${node.name}
log:
  level: INFO
restapi:
  listen: 127.0.0.1:${node.restPort}
  connect_address: 127.0.0.1:${node.restPort}
etcd3:
  hosts: 127.0.0.1:${this.#etcdPort}
bootstrap:
  dcs:
    ttl: 20
    loop_wait: 1
    retry_timeout: 5
    maximum_lag_on_failover: 104857600
    primary_start_timeout: 0
    synchronous_mode: ${this.synchronous ? 'true' : 'false'}
    postgresql:
      use_pg_rewind: true
      remove_data_directory_on_rewind_failure: true
      remove_data_directory_on_diverged_timelines: true
      use_slots: true
      parameters:
        wal_level: replica
        hot_standby: 'on'
        max_wal_senders: 10
        max_replication_slots: 10
        wal_log_hints: 'on'
        max_connections: 100
        shared_buffers: 32MB
  initdb:
    - encoding: UTF8
    - data-checksums
    - auth: trust
  pg_hba:
    - local all all trust
    - host replication all 127.0.0.1/32 trust
    - host all all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:${node.pgPort}
  connect_address: 127.0.0.1:${node.pgPort}
  data_dir: ${node.dataDir}
  bin_dir: ${PG_BIN}
  pgpass: ${join(this.dir, `${node.name}.pgpass`)}
  basebackup:
    - checkpoint: fast
  authentication:
    superuser:
      username: postgres
    replication:
      username: replicator
    rewind:
      username: postgres
  parameters:
    unix_socket_directories: '${this.dir}'
  pg_hba:
    - local all all trust
    - host replication all 127.0.0.1/32 trust
    - host all all 127.0.0.1/32 trust
tags:
  nofailover: false
  noloadbalance: false
`;
  }

  /** Patroni's view of the cluster, asked of any node that answers. */
  async members(): Promise<Member[]> {
    for (const node of this.nodes) {
      try {
        const response = await fetch(`http://127.0.0.1:${node.restPort}/cluster`, {
          signal: AbortSignal.timeout(2_000),
        });
        if (response.ok) return ((await response.json()) as { members: Member[] }).members ?? [];
      } catch {
        // try the other node
      }
    }
    return [];
  }

  /** The node Patroni lists as leader (running), if any. */
  primaryNode(members: readonly Member[]): Node | undefined {
    const leader = members.find(isPrimary);
    return leader ? this.nodes.find((n) => n.name === leader.name) : undefined;
  }

  async currentPrimary(): Promise<Node | undefined> {
    return this.primaryNode(await this.members());
  }

  /**
   * A running primary and a standby streaming from it with no lag; with synchronous replication,
   * the standby listed as the synchronous one (so every commit acknowledged from now on is on both).
   */
  async waitHealthy(timeoutMs: number): Promise<Member[]> {
    let last: Member[] = [];
    await this.#waitFor(
      'a primary and a caught-up standby',
      async () => {
        last = await this.members();
        const primary = last.find(isPrimary);
        const standby = last.find((m) => m.name !== primary?.name);
        if (!primary || !standby) return false;
        if (!['running', 'streaming'].includes(standby.state)) return false;
        if (this.synchronous && standby.role !== 'sync_standby') return false;
        return standby.lag === 0 || standby.lag === '0';
      },
      timeoutMs,
      () => JSON.stringify(last),
    );
    return last;
  }

  /** The multi-host URL a store uses: both nodes, read-write sessions only. */
  url(): string {
    const hosts = this.nodes.map((n) => `127.0.0.1:${n.pgPort}`).join(',');
    return `postgres://postgres@${hosts}/${this.database}?target_session_attrs=read-write`;
  }

  /** A plain client of one node (for checks after the test). */
  client(node: Node, database = this.database): pg.Client {
    const client = new pg.Client({ ...this.#adminConfig(node), database });
    client.on('error', () => {});
    return client;
  }

  /** The postmaster's pid, from the first line of its data directory's postmaster.pid. */
  postmasterPid(node: Node): number {
    return Number(readFileSync(join(node.dataDir, 'postmaster.pid'), 'utf8').split('\n')[0]);
  }

  /** SIGKILL of the primary's postmaster; returns the node and when (ms since epoch). */
  killPostmaster(node: Node): number {
    const pid = this.postmasterPid(node);
    process.kill(pid, 'SIGKILL');
    return Date.now();
  }

  /** Changes Patroni's dynamic configuration (e.g. `{ synchronous_mode: false }`). */
  async patchConfig(patch: Record<string, unknown>): Promise<void> {
    const node = this.nodes[0]!;
    const response = await fetch(`http://127.0.0.1:${node.restPort}/config`, {
      method: 'PATCH',
      body: JSON.stringify(patch),
      headers: { 'content-type': 'application/json' },
    });
    if (!response.ok) throw new Error(`PATCH /config: ${response.status} ${await response.text()}`);
  }

  async #waitFor(what: string, ok: () => Promise<boolean>, timeoutMs: number, describe?: () => string): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      try {
        if (await ok()) return;
      } catch {
        // not yet
      }
      if (Date.now() > deadline) {
        throw new Error(
          `timed out after ${timeoutMs} ms waiting for ${what}${describe ? `: ${describe()}` : ''}\n${this.logTail()}`,
        );
      }
      await sleep(200);
    }
  }

  /** The last lines of every log in the cluster's directory, for a failure message. */
  logTail(lines = 15): string {
    return readdirSync(this.dir)
      .filter((f) => f.endsWith('.log'))
      .map((f) => {
        const text = readFileSync(join(this.dir, f), 'utf8').split('\n').slice(-lines).join('\n');
        return `--- ${f}\n${text}`;
      })
      .join('\n');
  }

  /** Stops Patroni (which stops its PostgreSQL) and etcd, kills what is left of them, and removes the directory. */
  async stop(): Promise<void> {
    const alive = (c: ChildProcess) => c.exitCode === null && c.signalCode === null;
    for (const child of this.#children.slice().reverse()) {
      if (alive(child) && child.pid) {
        try {
          process.kill(-child.pid, 'SIGTERM');
        } catch {
          // already gone
        }
      }
    }
    const deadline = Date.now() + 20_000;
    while (this.#children.some(alive) && Date.now() < deadline) await sleep(100);
    for (const child of this.#children) {
      if (alive(child) && child.pid) {
        try {
          process.kill(-child.pid, 'SIGKILL');
        } catch {
          // already gone
        }
      }
    }
    // A postmaster Patroni started is in Patroni's process group; one left behind is killed by its pid file.
    for (const node of this.nodes) {
      try {
        if (statSync(join(node.dataDir, 'postmaster.pid')).isFile()) process.kill(this.postmasterPid(node), 'SIGKILL');
      } catch {
        // no server left
      }
    }
    if (!process.env.TASKFENCE_KEEP_CLUSTER) rmSync(this.dir, { recursive: true, force: true });
  }
}

function isPrimary(m: Member): boolean {
  return (m.role === 'leader' || m.role === 'primary' || m.role === 'master') && m.state === 'running';
}
