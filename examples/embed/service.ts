/**
 * A small HTTP service embedding taskfence (issue 14): one host table, `box_items`, moved between
 * "boxes" under named resource locks, in transactions taskfence opens and shares with the host.
 *
 *   POST /boxes/:box/items   {"item": "…"}                  put an item in a box
 *   POST /moves              {"item": "…", "from": "…", "to": "…"}   move it (409 if it is not in `from`)
 *   GET  /boxes/:box                                         the box's items
 *
 * Run it: `npx tsx examples/embed/service.ts` (TASKFENCE_DATABASE_URL picks the database; PORT the port).
 * In an application, import from 'taskfence' instead of the source tree.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { openStore, type Store, type StoreOptions } from '../../src/index.js';

/** The host's own tables, beside taskfence's in the same database (and PostgreSQL schema). */
type HostTables = {
  box_items: { item: string; box: string; moved_at: number };
};

/** The host's own migration, run after taskfence's chain at deploy time. */
export async function migrateHost(store: Store): Promise<void> {
  await store.migrate();
  await store.db
    .withTables<HostTables>()
    .schema.createTable('box_items')
    .ifNotExists()
    .addColumn('item', 'text', (c) => c.primaryKey())
    .addColumn('box', 'text', (c) => c.notNull())
    .addColumn('moved_at', 'bigint', (c) => c.notNull())
    .execute();
}

class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

async function readJson(req: IncomingMessage): Promise<Record<string, unknown>> {
  let body = '';
  for await (const chunk of req) body += chunk;
  try {
    const value: unknown = JSON.parse(body || '{}');
    if (value && typeof value === 'object') return value as Record<string, unknown>;
  } catch {
    // fall through
  }
  throw new HttpError(400, 'expected a JSON object');
}

function text(body: Record<string, unknown>, field: string): string {
  const value = body[field];
  if (typeof value !== 'string' || value === '') throw new HttpError(400, `"${field}" must be a non-empty string`);
  return value;
}

function send(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
}

/** The request handler: every write is one `store.transaction` holding the boxes it touches. */
export function handler(store: Store) {
  return async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    try {
      const url = new URL(req.url ?? '/', 'http://localhost');
      const boxPath = /^\/boxes\/([^/]+)(\/items)?$/.exec(url.pathname);
      if (req.method === 'GET' && boxPath && !boxPath[2]) {
        const items = await store.db
          .withTables<HostTables>()
          .selectFrom('box_items')
          .select('item')
          .where('box', '=', decodeURIComponent(boxPath[1]!))
          .orderBy('item')
          .execute();
        return send(res, 200, { items: items.map((r) => r.item) });
      }
      if (req.method === 'POST' && boxPath?.[2]) {
        const box = decodeURIComponent(boxPath[1]!);
        const item = text(await readJson(req), 'item');
        await store.transaction(async (tx) => {
          await tx.lockResources([`box:${box}`]);
          const db = tx.db.withTables<HostTables>();
          const existing = await db.selectFrom('box_items').select('box').where('item', '=', item).executeTakeFirst();
          if (existing) throw new HttpError(409, `${item} is already in box ${existing.box}`);
          await db.insertInto('box_items').values({ item, box, moved_at: Date.now() }).execute();
        });
        return send(res, 201, { item, box });
      }
      if (req.method === 'POST' && url.pathname === '/moves') {
        const body = await readJson(req);
        const [item, from, to] = [text(body, 'item'), text(body, 'from'), text(body, 'to')];
        // Both boxes, in whatever order the caller names them: lockResources sorts, so two
        // opposite moves cannot deadlock. The callback may be retried: no side effects in it.
        await store.transaction(async (tx) => {
          await tx.lockResources([`box:${from}`, `box:${to}`]);
          const moved = await tx.db
            .withTables<HostTables>()
            .updateTable('box_items')
            .set({ box: to, moved_at: Date.now() })
            .where('item', '=', item)
            .where('box', '=', from)
            .executeTakeFirst();
          if (moved.numUpdatedRows === 0n) throw new HttpError(409, `${item} is not in box ${from}`);
        });
        return send(res, 200, { item, box: to });
      }
      send(res, 404, { error: 'not found' });
    } catch (error) {
      if (error instanceof HttpError) return send(res, error.status, { error: error.message });
      send(res, 500, { error: error instanceof Error ? error.message : String(error) });
    }
  };
}

/** Opens the store, migrates (taskfence's chain, then the host's table) and listens on `port` (0: any free port). */
export async function startService(
  options: StoreOptions & { port?: number } = {},
): Promise<{ server: Server; port: number; store: Store; close(): Promise<void> }> {
  const { port = 0, ...storeOptions } = options;
  const store = await openStore(storeOptions);
  await migrateHost(store);
  const server = createServer((req, res) => void handler(store)(req, res));
  await new Promise<void>((resolve) => server.listen(port, resolve));
  return {
    server,
    port: (server.address() as AddressInfo).port,
    store,
    close: async () => {
      await new Promise<void>((resolve, reject) => server.close((e) => (e ? reject(e) : resolve())));
      await store.close();
    },
  };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const service = await startService({ port: Number(process.env.PORT ?? 3000) });
  console.log(`listening on http://localhost:${service.port}`);
}
