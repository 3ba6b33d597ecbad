/**
 * The live dashboard behind `taskfence ui`: a node:http server with no dependencies, serving plain
 * HTML/JS/CSS from ./static (no build step) and the `inspect` views as JSON, refreshed over
 * server-sent events. It binds to 127.0.0.1 and is read-only unless `allowActions`; actions then
 * need the token `startDashboard` returns, sent as `Authorization: Bearer <token>` (a header, so a
 * page of another origin cannot send it), and go through `runOperatorAction`. On a loopback bind
 * requests must name a loopback Host (no DNS rebinding). Nothing the server sends contains the
 * database URL's password: the page shows the label it is given (the CLI gives the redacted URL).
 */
import { randomBytes, timingSafeEqual } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { InvalidArgumentError, NotFoundError, TaskfenceError } from '../errors.js';
import { readAuditTrail } from '../inspect/audit.js';
import { explainTask, inspectStore, runTimeline } from '../inspect/index.js';
import type { Store } from '../store.js';
import { runOperatorAction } from './actions.js';

/** Options of `startDashboard`. */
export interface DashboardOptions {
  readonly store: Store;
  /** Default 127.0.0.1. Another address exposes the dashboard (and, with actions, the token's power) to the network. */
  readonly host?: string;
  /** Default 4747; 0 picks a free port. */
  readonly port?: number;
  /** Offer operator actions (default false: read-only). */
  readonly allowActions?: boolean;
  /** Passed to `inspectStore`. */
  readonly staleAfterMs?: number;
  /** How often connected pages get a new snapshot (default 1 000 ms). */
  readonly refreshMs?: number;
  /** What the page calls the database; give it a redacted URL, never one with a password. */
  readonly label?: string;
}

/** A running dashboard. */
export interface Dashboard {
  /** Where it listens, e.g. `http://127.0.0.1:4747/`. */
  readonly url: string;
  /** The bearer token actions need; null when read-only. */
  readonly actionToken: string | null;
  close(): Promise<void>;
}

const STATIC: Record<string, string> = {
  '/': 'index.html',
  '/index.html': 'index.html',
  '/app.mjs': 'app.mjs',
  '/style.css': 'style.css',
};
const TYPES: Record<string, string> = {
  html: 'text/html; charset=utf-8',
  mjs: 'text/javascript; charset=utf-8',
  css: 'text/css; charset=utf-8',
};
const SECURITY_HEADERS = {
  'content-security-policy': "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
  'cache-control': 'no-store',
};
const LOOPBACK = new Set(['127.0.0.1', 'localhost', '::1', '[::1]']);
const MAX_BODY = 16 * 1024;

class HttpError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

function send(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { ...SECURITY_HEADERS, 'content-type': 'application/json; charset=utf-8' });
  res.end(text);
}

function statusOf(error: unknown): number {
  if (error instanceof HttpError) return error.status;
  if (error instanceof InvalidArgumentError) return 400;
  if (error instanceof NotFoundError) return 404;
  if (error instanceof TaskfenceError) return 409; // a fence refused (stale token, run not running, …)
  return 500;
}

function errorBody(error: unknown): { error: { code: string; message: string } } {
  if (error instanceof HttpError || error instanceof TaskfenceError)
    return { error: { code: error.code, message: error.message } };
  return { error: { code: 'INTERNAL', message: 'unexpected error (see the server log)' } };
}

async function readJson(req: IncomingMessage): Promise<unknown> {
  let size = 0;
  const chunks: Buffer[] = [];
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > MAX_BODY) throw new HttpError(413, 'BODY_TOO_LARGE', `a request body is at most ${MAX_BODY} bytes`);
    chunks.push(chunk);
  }
  try {
    return JSON.parse(Buffer.concat(chunks).toString('utf8') || '{}') as unknown;
  } catch {
    throw new HttpError(400, 'INVALID_JSON', 'the body is not JSON');
  }
}

function sameToken(given: string, expected: string): boolean {
  const a = Buffer.from(given);
  const b = Buffer.from(expected);
  return a.length === b.length && timingSafeEqual(a, b);
}

/**
 * Starts the dashboard on `options.store` and resolves once it listens.
 *
 * @example
 * const dashboard = await startDashboard({ store, port: 0 });
 * console.log(`open ${dashboard.url}`);
 * await dashboard.close();
 */
export async function startDashboard(options: DashboardOptions): Promise<Dashboard> {
  const { store } = options;
  const host = options.host ?? '127.0.0.1';
  const refreshMs = options.refreshMs ?? 1_000;
  if (!Number.isSafeInteger(refreshMs) || refreshMs < 100)
    throw new InvalidArgumentError('refreshMs', 'must be a whole number of milliseconds, at least 100');
  const actionToken = options.allowActions ? randomBytes(24).toString('base64url') : null;
  const inspectOptions = options.staleAfterMs === undefined ? {} : { staleAfterMs: options.staleAfterMs };
  const staticDir = new URL('./static/', import.meta.url);
  const loopbackBind = LOOPBACK.has(host);

  const clients = new Set<ServerResponse>();
  let timer: NodeJS.Timeout | undefined;
  let pushing = false;

  const config = () => ({
    label: options.label ?? store.dialect.kind,
    dialect: store.dialect.kind,
    actions: actionToken !== null,
    refreshMs,
  });
  const frame = async () => ({
    snapshot: await inspectStore(store, inspectOptions),
    audit: await readAuditTrail(store, { limit: 20 }),
  });

  async function push(): Promise<void> {
    if (pushing || clients.size === 0) return;
    pushing = true;
    try {
      const data = `event: snapshot\ndata: ${JSON.stringify(await frame())}\n\n`;
      for (const client of clients) client.write(data);
    } catch (error) {
      const data = `event: failure\ndata: ${JSON.stringify(errorBody(error))}\n\n`;
      for (const client of clients) client.write(data);
    } finally {
      pushing = false;
    }
  }

  function subscribe(req: IncomingMessage, res: ServerResponse): void {
    res.writeHead(200, { ...SECURITY_HEADERS, 'content-type': 'text/event-stream', connection: 'keep-alive' });
    res.write(`retry: ${refreshMs}\n\n`);
    clients.add(res);
    req.on('close', () => {
      clients.delete(res);
      if (clients.size === 0 && timer) {
        clearInterval(timer);
        timer = undefined;
      }
    });
    timer ??= setInterval(() => void push(), refreshMs);
    void push();
  }

  function checkHost(req: IncomingMessage): void {
    if (!loopbackBind) return;
    const header = req.headers.host ?? '';
    const name = header.startsWith('[') ? header.slice(0, header.indexOf(']') + 1) : header.split(':')[0]!;
    if (!LOOPBACK.has(name))
      throw new HttpError(421, 'WRONG_HOST', 'this dashboard answers only to a loopback host name');
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    checkHost(req);
    const url = new URL(req.url ?? '/', 'http://dashboard.invalid');
    const path = url.pathname;
    if (req.method === 'GET' && STATIC[path] !== undefined) {
      const file = STATIC[path];
      const body = await readFile(new URL(file, staticDir));
      res.writeHead(200, { ...SECURITY_HEADERS, 'content-type': TYPES[file.split('.').pop()!]! });
      res.end(body);
      return;
    }
    if (req.method === 'GET' && path === '/api/config') return send(res, 200, config());
    if (req.method === 'GET' && path === '/api/snapshot') return send(res, 200, await frame());
    if (req.method === 'GET' && path === '/api/events') return subscribe(req, res);
    if (req.method === 'GET' && path === '/api/audit') {
      const subjectKind = url.searchParams.get('subjectKind') ?? undefined;
      const subjectId = url.searchParams.get('subjectId') ?? undefined;
      return send(
        res,
        200,
        await readAuditTrail(store, {
          ...(subjectKind === undefined ? {} : { subjectKind }),
          ...(subjectId === undefined ? {} : { subjectId }),
        }),
      );
    }
    const run = /^\/api\/runs\/([^/]+)$/.exec(path);
    if (req.method === 'GET' && run)
      return send(res, 200, await runTimeline(store, decodeURIComponent(run[1]!), inspectOptions));
    const task = /^\/api\/tasks\/([^/]+)$/.exec(path);
    if (req.method === 'GET' && task)
      return send(res, 200, await explainTask(store, decodeURIComponent(task[1]!), inspectOptions));
    const action = /^\/api\/actions\/([a-z-]+)$/.exec(path);
    if (action) {
      if (req.method !== 'POST') throw new HttpError(405, 'METHOD_NOT_ALLOWED', 'actions are POST requests');
      if (actionToken === null)
        throw new HttpError(403, 'ACTIONS_DISABLED', 'this dashboard is read-only: start it with --allow-actions');
      const auth = req.headers.authorization ?? '';
      if (!auth.startsWith('Bearer ') || !sameToken(auth.slice(7), actionToken))
        throw new HttpError(401, 'BAD_TOKEN', 'actions need the token taskfence ui printed at start');
      const result = await runOperatorAction(store, action[1]!, await readJson(req), {
        remoteAddress: req.socket.remoteAddress ?? 'unknown',
      });
      void push();
      return send(res, 200, result);
    }
    throw new HttpError(404, 'NOT_FOUND', `nothing at ${req.method} ${path}`);
  }

  const server: Server = createServer((req, res) => {
    handle(req, res).catch((error: unknown) => {
      if (statusOf(error) === 500) console.error('taskfence ui:', error instanceof Error ? error.message : error);
      if (!res.headersSent) send(res, statusOf(error), errorBody(error));
      else res.end();
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port ?? 4747, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const { port } = server.address() as AddressInfo;
  const shownHost = host.includes(':') ? `[${host}]` : host;
  return {
    url: `http://${shownHost}:${port}/`,
    actionToken,
    close: async () => {
      if (timer) clearInterval(timer);
      for (const client of clients) client.end();
      clients.clear();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      server.closeAllConnections();
    },
  };
}
