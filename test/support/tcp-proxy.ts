import net from 'node:net';

/**
 * A TCP proxy on 127.0.0.1 in front of a PostgreSQL server, for fault injection. It forwards
 * bytes both ways until told to misbehave:
 * - `cutAll()` destroys every open connection (a network reset, a proxy restart);
 * - `cutAfterNextCommit()` lets the next COMMIT (alone, or ending a simple query that carries the
 *   transaction's last statements) reach the server and destroys the connection
 *   before the server's answer reaches the client: the transaction committed, the client cannot know;
 * - `silence()` stops forwarding anything and accepts new connections without ever answering
 *   (a network that goes silent); `restore()` ends it and drops the silenced connections.
 */
export class FaultProxy {
  readonly #server: net.Server;
  readonly #pairs = new Set<{ client: net.Socket; upstream: net.Socket; commitInFlight: boolean }>();
  #silent = false;
  #commitCutsArmed = 0;
  readonly #cutsBefore: { pattern: RegExp; count: number }[] = [];
  /** How many connections were cut right after the server answered a COMMIT. */
  commitCuts = 0;
  /** How many connections were cut before a statement `cutBeforeNext` named reached the server. */
  cutsBefore = 0;

  private constructor(
    server: net.Server,
    readonly port: number,
  ) {
    this.#server = server;
  }

  /** Starts a proxy to `target` (host and port of the real server) on a free local port. */
  static async start(target: { host: string; port: number }): Promise<FaultProxy> {
    // eslint-disable-next-line prefer-const -- assigned after the server that uses it is created
    let proxy!: FaultProxy;
    const server = net.createServer((client) => proxy.#accept(client, target));
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    proxy = new FaultProxy(server, (server.address() as net.AddressInfo).port);
    return proxy;
  }

  /** `url` with its host and port replaced by this proxy's. */
  urlThrough(url: string): string {
    const u = new URL(url);
    u.hostname = '127.0.0.1';
    u.port = String(this.port);
    return u.toString();
  }

  #accept(client: net.Socket, target: { host: string; port: number }): void {
    client.on('error', () => {});
    if (this.#silent) {
      // Accept, never answer: what a blackholed route looks like to the client.
      const pair = { client, upstream: new net.Socket(), commitInFlight: false };
      this.#pairs.add(pair);
      client.on('close', () => this.#pairs.delete(pair));
      return;
    }
    const upstream = net.connect(target.port, target.host);
    upstream.on('error', () => {});
    const pair = { client, upstream, commitInFlight: false };
    this.#pairs.add(pair);
    const drop = () => {
      this.#pairs.delete(pair);
      client.destroy();
      upstream.destroy();
    };
    client.on('close', drop);
    upstream.on('close', drop);
    client.on('data', (chunk: Buffer) => {
      if (this.#silent) return;
      const before = this.#cutsBefore.find((c) => c.count > 0 && c.pattern.test(chunk.toString('latin1')));
      if (before) {
        // The statement never reaches the server: the transaction dies before COMMIT.
        before.count--;
        this.cutsBefore++;
        drop();
        return;
      }
      if (this.#commitCutsArmed > 0 && (isSimpleQuery(chunk, 'commit') || carriesCommit(chunk))) {
        this.#commitCutsArmed--;
        pair.commitInFlight = true;
      }
      upstream.write(chunk);
    });
    upstream.on('data', (chunk: Buffer) => {
      if (this.#silent) return;
      if (pair.commitInFlight && chunk.includes(COMMIT_COMPLETE)) {
        // The server committed; the client never hears it.
        this.commitCuts++;
        drop();
        return;
      }
      client.write(chunk);
    });
  }

  /** Destroys every open connection, both sides. */
  cutAll(): number {
    const n = this.#pairs.size;
    for (const { client, upstream } of [...this.#pairs]) {
      client.destroy();
      upstream.destroy();
    }
    this.#pairs.clear();
    return n;
  }

  /** Arms the next `count` COMMITs (any connection) to be cut after the server committed them. */
  cutAfterNextCommit(count = 1): void {
    this.#commitCutsArmed += count;
  }

  /**
   * Cuts the connection (without forwarding) the next `count` times a client sends SQL containing
   * `text`. A quoted name in `text` also matches its schema-qualified form (`insert into "tasks"`
   * matches `insert into "taskfence_ci"."tasks"`), so the cut works when the suite runs in a schema.
   */
  cutBeforeNext(text: string, count = 1): void {
    const escaped = text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
    const pattern = new RegExp(escaped.replace(/"([^"]+)"/g, '(?:"[^"]+"\\.)?"$1"'));
    this.#cutsBefore.push({ pattern, count });
  }

  /** From now on nothing is forwarded and new connections are accepted but never answered. */
  silence(): void {
    this.#silent = true;
  }

  /** Ends the silence: the silenced connections are dropped, new ones are forwarded again. */
  restore(): void {
    this.#silent = false;
    this.cutAll();
  }

  async close(): Promise<void> {
    this.cutAll();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}

/** CommandComplete ('C') carrying the tag COMMIT. */
const COMMIT_COMPLETE = Buffer.concat([Buffer.from('C'), int32(4 + 'COMMIT'.length + 1), Buffer.from('COMMIT\0')]);

/** Whether `chunk` holds a simple-protocol Query message ('Q') whose text is exactly `text`. */
function isSimpleQuery(chunk: Buffer, text: string): boolean {
  const message = Buffer.concat([Buffer.from('Q'), int32(4 + text.length + 1), Buffer.from(`${text}\0`)]);
  return chunk.includes(message);
}

/** Whether `chunk` holds a simple-protocol Query message that ends with COMMIT (`stmt; …; commit`, commitWith). */
function carriesCommit(chunk: Buffer): boolean {
  return chunk[0] === 'Q'.charCodeAt(0) && chunk.includes(Buffer.from('; commit\0'));
}

function int32(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeInt32BE(n);
  return b;
}
