/**
 * No password is ever printed: a marker password in every form a database URL can carry it
 * (userinfo with an unencoded `@`, `?password=`, a libpq key/value string, `PGPASSWORD`), through
 * openStore's errors, errors after the server dropped the store, events, and every CLI command
 * (`inspect` and the `ui` dashboard included) with and without `--json` and `--verbose`, given by
 * `--db` and by `TASKFENCE_DATABASE_URL`.
 * The service trusts local connections, so the live forms really connect (the password is sent
 * only if asked for, and accepted either way). Needs `npm run build` (the CLI runs from dist/).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import { openStore, type TaskfenceEvent } from '../../src/index.js';
import { main } from '../../src/cli.js';
import { postgresFixture } from '../support/dialects.js';
import { runCli } from '../suites/cli.suite.js';
import { http, startUi } from '../suites/ui.suite.js';

const MARKER = 'Mk7Secret';
const fx = postgresFixture();
let live: string; // postgres://postgres@127.0.0.1:5432/tf_… (as the fixture makes it)
afterAll(() => fx.cleanup());
beforeAll(async () => {
  live = await fx.freshUrl();
});

/** The same database (or a dead port) with the marker password in each URL form. */
function forms(base: string): Record<string, string> {
  const u = new URL(base);
  const hostPart = `${u.hostname}:${u.port || 5432}`;
  const db = u.pathname;
  const search = u.search.replace(/^\?/, '');
  const more = search === '' ? '' : `&${search}`;
  return {
    'userinfo with an unencoded @': `postgres://postgres:${MARKER.slice(0, 3)}@${MARKER.slice(3)}@${hostPart}${db}${u.search}`,
    'userinfo, percent-encoded': `postgres://postgres:${encodeURIComponent(`${MARKER}@/`)}@${hostPart}${db}${u.search}`,
    '?password= in the query': `postgres://${hostPart}${db}?user=postgres&password=${MARKER}${more}`,
    // An unencoded `?` in the password: no URL parser accepts these, so they only ever fail, and
    // the failure must not print them.
    'userinfo with ?…= in the password': `postgres://postgres:a?b=${MARKER}@${hostPart}${db}${u.search}`,
    'userinfo with a ?x= after the password': `postgres://postgres:${MARKER}?x=1@${hostPart}${db}${u.search}`,
  };
}
/** Forms that are not well-formed URLs: refused (INVALID_DATABASE_URL), never connected. */
const UNPARSEABLE = new Set(['userinfo with ?…= in the password', 'userinfo with a ?x= after the password']);
const dead = (url: string) => url.replace(/:5432\b|127\.0\.0\.1:\d+/, '127.0.0.1:1');

/**
 * The CLI's `main` in this process (what `dist/cli.js` runs, short of its last-resort handler),
 * output captured: the sweeps run most commands this way, since a process per command made this
 * file the slowest of the suite. Each sweep still runs one form through the built CLI's process.
 */
async function inProcess(
  args: readonly string[],
  env: Record<string, string | undefined> = {},
): Promise<{ code: number; out: string; err: string }> {
  const out: string[] = [];
  const err: string[] = [];
  const code = await main(
    args,
    (line) => out.push(line),
    (line) => err.push(line),
    {
      write: (text) => void out.push(text),
      tty: false,
      interactive: false,
      env: { ...process.env, TASKFENCE_DATABASE_URL: undefined, ...env },
    },
  );
  return { code, out: out.join('\n'), err: err.join('\n') };
}

function expectNoMarker(text: string, context: string): void {
  for (const piece of [MARKER, MARKER.slice(3), encodeURIComponent(`${MARKER}@/`)]) {
    expect(text.includes(piece), `${context}: ${text.slice(0, 400)}`).toBe(false);
  }
}

const COMMANDS: readonly (readonly string[])[] = [
  ['status'],
  ['status', '--verbose'],
  ['status', '--json'],
  ['status', '--check'],
  ['plan'],
  ['plan', '--json'],
  ['migrate', '--json'],
  ['migrate'],
  ['doctor'],
  ['doctor', '--json'],
  ['prune', '--older-than', '30d', '--json'],
  ['prune', '--older-than', '30d', '--verbose'],
  ['inspect'],
  ['inspect', '--json'],
  ['inspect', 'task', 'no-such-task', '--json'],
];

describe('the CLI never prints a password', () => {
  it('in every command, live, with every URL form given by --db and by TASKFENCE_DATABASE_URL', async () => {
    for (const [n, [form, url]] of Object.entries(forms(live)).entries()) {
      // The first form through the built CLI's processes (three at a time: what is asserted of
      // each does not depend on the others), the others through `main` in this process.
      const run = n === 0 ? runCli : (args: readonly string[]) => inProcess(args);
      for (let i = 0; i < COMMANDS.length; i += 3) {
        const batch = COMMANDS.slice(i, i + 3);
        const results = await Promise.all(batch.map((command) => run([...command, '--db', url])));
        for (const [j, byFlag] of results.entries()) {
          const command = batch[j]!;
          expectNoMarker(byFlag.out + byFlag.err, `${form}: ${command.join(' ')} --db`);
          // 0, or a status --check code; never a usage error. A malformed URL is refused.
          if (UNPARSEABLE.has(form)) expect(byFlag.code, `${form}: ${command.join(' ')}`).not.toBe(0);
          else expect(byFlag.code, `${form}: ${command.join(' ')}: ${byFlag.err}`).not.toBe(2);
        }
      }
      const byEnv = await runCli(['status', '--verbose'], { env: { TASKFENCE_DATABASE_URL: url } });
      expectNoMarker(byEnv.out + byEnv.err, `${form}: status via TASKFENCE_DATABASE_URL`);
      if (!UNPARSEABLE.has(form)) expect(byEnv.out).toMatch(/database: postgres:\/\//);
    }
  }, 600_000);

  it('in every error: a dead server, a key/value string, an unknown scheme, PGPASSWORD', async () => {
    const urls = [
      ...Object.values(forms(live)).map(dead),
      `host=127.0.0.1 port=1 password=${MARKER} dbname=x`,
      `mysql://u:${MARKER}@127.0.0.1/x`,
      `postgres://u:${MARKER}@/nohost`,
    ];
    for (const [n, url] of urls.entries()) {
      // The first URL through the built CLI's processes, the others through `main` in this process.
      const run = n === 0 ? runCli : (args: readonly string[]) => inProcess(args);
      for (const command of [
        ['status', '--verbose'],
        ['migrate', '--json'],
        ['doctor', '--json'],
        ['plan'],
        ['inspect', '--json'],
        ['inspect'],
      ]) {
        const result = await run([...command, '--db', url]);
        expectNoMarker(result.out + result.err, `${url}: ${command.join(' ')}`);
        expect(result.code).not.toBe(0);
      }
      const byEnv =
        n === 0
          ? await runCli(['migrate', '--verbose'], { env: { TASKFENCE_DATABASE_URL: url } })
          : await inProcess(['migrate', '--verbose'], { TASKFENCE_DATABASE_URL: url });
      expectNoMarker(byEnv.out + byEnv.err, `${url}: migrate via TASKFENCE_DATABASE_URL`);
      expect(byEnv.code).not.toBe(0);
    }
    // PGPASSWORD is what pg sends when the URL has none: never echoed, live or dead.
    for (const url of [live, dead(live)]) {
      const result = await runCli(['status', '--verbose', '--db', url], { env: { PGPASSWORD: MARKER } });
      expectNoMarker(result.out + result.err, `PGPASSWORD with ${url}`);
    }
  }, 600_000);
});

describe('the library never reports a password', () => {
  it("openStore's errors, in message, fields, cause and stack, for every form", async () => {
    for (const url of [
      ...Object.values(forms(live)).map(dead),
      `host=h password=${MARKER}`,
      `postgres://u:${MARKER}@/x`,
    ]) {
      const error = await openStore({ url, connectTimeoutMs: 2_000 }).catch((e: unknown) => e);
      expect(error, url).toBeInstanceOf(Error);
      const e = error as Error & Record<string, unknown>;
      expectNoMarker(`${e.message} ${e.stack} ${JSON.stringify(e)} ${String(e.cause)}`, url);
    }
  });

  it('events and errors after the server dropped the store', async () => {
    for (const form of Object.keys(forms(live)).filter((f) => !UNPARSEABLE.has(f))) {
      const url = forms(await fx.freshUrl())[form]!;
      const events: TaskfenceEvent[] = [];
      // A short write deadline: the call after the drop retries its lost connection until then
      // (events, then a typed error), and only what they say is checked here.
      const store = await openStore({ url, onEvent: (e) => events.push(e), writeDeadlineMs: 1_500 });
      await store.migrate();
      await store.org.createCompany({ name: 'acme' });
      // The server ends every session of the database, then the database itself is gone.
      const name = new URL(url.replace(/\?.*$/, '')).pathname.slice(1);
      const admin = new pg.Client({ connectionString: live.replace(/\/[^/?]+(\?.*)?$/, '/postgres') });
      await admin.connect();
      await admin.query(`drop database ${name} with (force)`);
      await admin.end();
      const error = await store.org.createCompany({ name: 'after' }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(Error);
      const e = error as Error;
      expectNoMarker(`${e.message} ${e.stack} ${JSON.stringify(e)}`, `after drop: ${url}`);
      await store.close().catch(() => {});
      expect(events.length).toBeGreaterThan(0);
      expectNoMarker(JSON.stringify(events), `events: ${url}`);
      expectNoMarker(store.dialect.kind + JSON.stringify(store.stats()), 'stats');
    }
  });
});

describe('the dashboard (taskfence ui) never shows a password', () => {
  it('in its start lines, page, config and snapshot with every live form, and its errors with every form', async () => {
    // ui serves a migrated database only (run alone, no earlier test has migrated it).
    await (await fx.open(live)).migrate();
    for (const [form, url] of Object.entries(forms(live))) {
      if (UNPARSEABLE.has(form)) continue;
      const ui = await startUi(url);
      try {
        for (const path of ['', 'api/config', 'api/snapshot']) {
          const page = await http(`${ui.url}${path}`);
          expect(page.status, `${form}: /${path}`).toBe(200);
          expectNoMarker(page.text, `${form}: ui /${path}`);
        }
        expect((await http(`${ui.url}api/config`)).json()).toMatchObject({
          label: expect.stringMatching(/^postgres:/),
        });
      } finally {
        await ui.stop();
      }
      expectNoMarker(ui.output(), `${form}: ui output`);
    }
    for (const url of [...Object.values(forms(live)).map(dead), `host=127.0.0.1 port=1 password=${MARKER} dbname=x`]) {
      const failed = await startUi(url).then(
        async (ui) => {
          await ui.stop();
          throw new Error(`taskfence ui started on ${url}`);
        },
        (e: unknown) => e as Error,
      );
      expect(failed.message).toMatch(/taskfence ui exited with [1-9]/);
      expectNoMarker(failed.message, `ui error: ${url}`);
    }
  }, 600_000);
});
