#!/usr/bin/env node
// The consumer-app test: what a backend team gets from the published package.
//
// Packs this repository's tarball (after `npm run build`), installs it into fresh apps in a temp
// folder outside the repository, and for each Kysely line:
//   1. typechecks (strict, skipLibCheck off) an app whose own function takes a `Kysely<Database>`
//      from the app's kysely and is handed `store.db` — one kysely copy, no TS2345;
//   2. runs it: migrate + a repository call + the app's own query on SQLite;
//   3. runs the CommonJS smoke test (`require('taskfence')`) from the installed package;
//   4. runs `taskfence/otel` (with @opentelemetry/api installed) and `taskfence inspect --json` on SQLite.
// Then a PostgreSQL-only app (no better-sqlite3, no @opentelemetry/api installed) migrates
// PostgreSQL (TEST_PG_URL), gets DriverNotInstalledError for a `sqlite:` URL, runs
// `taskfence inspect`, and finds `taskfence/otel` unloadable without its optional peer.
//
// Kysely lines: KYSELY_VERSIONS (comma-separated), else 0.28.0 (the lowest in the peer range) and 0.28 on Node 20 and 0.28,0.29 on Node ≥ 22
// (kysely 0.29 needs Node 22). Installs run with --ignore-scripts (the package needs none); the
// SQLite app gets the better-sqlite3 binary already built in this repository for this Node.
import { execFileSync } from 'node:child_process';
import { copyFileSync, cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const repo = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const nodeMajor = Number(process.versions.node.split('.')[0]);
const kyselyLines = (process.env.KYSELY_VERSIONS ?? (nodeMajor >= 22 ? '0.28,0.29' : '0.28.0,0.28'))
  .split(',')
  .map((s) => s.trim());
const pgUrl = process.env.TEST_PG_URL;
const keep = process.env.KEEP_CONSUMER_APPS === '1';

const npm = (args, cwd) => run('npm', args, cwd);
function run(cmd, args, cwd, env = {}) {
  console.log(`  $ ${cmd} ${args.join(' ')}`);
  try {
    return execFileSync(cmd, args, {
      cwd,
      stdio: ['ignore', 'pipe', 'inherit'],
      env: { ...process.env, ...env },
      encoding: 'utf8',
    });
  } catch (error) {
    process.stdout.write(error.stdout ?? '');
    throw new Error(`${cmd} ${args.join(' ')} failed (exit ${error.status ?? error.signal})`);
  }
}
const installedVersion = (dir, name) =>
  JSON.parse(readFileSync(join(dir, 'node_modules', name, 'package.json'), 'utf8')).version;

const work = mkdtempSync(join(tmpdir(), 'taskfence-consumer-'));
console.log(`== consumer test on Node ${process.version}, kysely ${kyselyLines.join(' and ')}, in ${work}`);
try {
  npm(['run', 'build'], repo);
  const packed = JSON.parse(npm(['pack', '--ignore-scripts', '--json', '--pack-destination', work], repo));
  const tarball = join(work, packed[0].filename);
  const files = packed[0].files.map((f) => f.path);
  const stray = files.filter((f) => !(f.startsWith('dist/') || ['package.json', 'README.md', 'LICENSE'].includes(f)));
  if (stray.length > 0) throw new Error(`the tarball holds files outside dist/: ${stray.join(', ')}`);
  const manifest = JSON.parse(readFileSync(join(repo, 'package.json'), 'utf8'));
  for (const hook of ['preinstall', 'install', 'postinstall']) {
    if (manifest.scripts?.[hook]) throw new Error(`package.json has an install-time script "${hook}"`);
  }
  const sqliteVersion = installedVersion(repo, 'better-sqlite3');
  const tsc = join(repo, 'node_modules/typescript/bin/tsc');

  for (const line of kyselyLines) {
    const app = join(work, `app-kysely-${line}`);
    mkdirSync(join(app, 'src'), { recursive: true });
    writeJson(join(app, 'package.json'), {
      name: 'consumer-app',
      private: true,
      type: 'module',
      dependencies: {
        taskfence: `file:${tarball}`,
        kysely: line.split('.').length === 3 ? line : `~${line}.0`,
        'better-sqlite3': sqliteVersion,
        '@opentelemetry/api': installedVersion(repo, '@opentelemetry/api'),
      },
      // A Node backend has Node's types; taskfence itself needs no other @types package.
      devDependencies: { '@types/node': installedVersion(repo, '@types/node') },
    });
    writeJson(join(app, 'tsconfig.json'), {
      compilerOptions: {
        target: 'ES2022',
        module: 'NodeNext',
        moduleResolution: 'NodeNext',
        strict: true,
        skipLibCheck: false,
        types: ['node'],
        outDir: 'out',
        rootDir: 'src',
      },
      include: ['src'],
    });
    copyFileSync(join(repo, 'test/consumer/app.ts'), join(app, 'src/app.ts'));
    copyFileSync(join(repo, 'test/consumer/require.cjs'), join(app, 'require.cjs'));
    copyFileSync(join(repo, 'test/consumer/otel-smoke.mjs'), join(app, 'otel-smoke.mjs'));
    npm(['install', '--ignore-scripts', '--no-audit', '--no-fund'], app);
    // The better-sqlite3 binary this repository built for this Node (same version): no compile here.
    cpSync(join(repo, 'node_modules/better-sqlite3/build'), join(app, 'node_modules/better-sqlite3/build'), {
      recursive: true,
    });
    const kysely = installedVersion(app, 'kysely');
    if (!`${kysely}.`.startsWith(`${line}.`)) throw new Error(`installed kysely ${kysely}, wanted ${line}.x`);
    // One kysely copy: taskfence must resolve the app's.
    const nested = join(app, 'node_modules/taskfence/node_modules/kysely');
    if (existsDir(nested)) throw new Error(`taskfence got its own kysely copy (${nested})`);
    console.log(`-- kysely ${kysely}: typecheck`);
    run(process.execPath, [tsc, '-p', 'tsconfig.json'], app);
    console.log(`-- kysely ${kysely}: run on SQLite`);
    process.stdout.write(run(process.execPath, ['out/app.js', `sqlite:${join(app, 'app.sqlite')}`], app));
    process.stdout.write(run(process.execPath, ['require.cjs'], app));
    const sqliteUrl = `sqlite:${join(app, 'otel.sqlite')}`;
    process.stdout.write(run(process.execPath, ['otel-smoke.mjs', sqliteUrl], app));
    checkInspect(run(join(app, 'node_modules/.bin/taskfence'), ['inspect', '--db', sqliteUrl, '--json'], app));
  }

  console.log('-- PostgreSQL-only app (no better-sqlite3)');
  const pgApp = join(work, 'app-pg-only');
  mkdirSync(pgApp);
  writeJson(join(pgApp, 'package.json'), {
    name: 'pg-only-app',
    private: true,
    type: 'module',
    dependencies: { taskfence: `file:${tarball}` },
  });
  npm(['install', '--ignore-scripts', '--no-audit', '--no-fund'], pgApp);
  if (existsDir(join(pgApp, 'node_modules/better-sqlite3')))
    throw new Error('better-sqlite3 was installed for a PostgreSQL-only app');
  copyFileSync(join(repo, 'test/consumer/pg-only.mjs'), join(pgApp, 'pg-only.mjs'));
  if (!pgUrl) throw new Error('TEST_PG_URL is not set: the PostgreSQL-only app needs a server');
  process.stdout.write(run(process.execPath, ['pg-only.mjs'], pgApp));
  // The optional peer is not installed: the core loaded without it (above), taskfence/otel cannot.
  const otel = run(
    process.execPath,
    ['-e', "import('taskfence/otel').then(() => console.log('loaded'), (e) => console.log(e.code))"],
    pgApp,
  );
  if (otel.trim() !== 'ERR_MODULE_NOT_FOUND') throw new Error(`taskfence/otel without @opentelemetry/api: ${otel}`);
  console.log('== consumer test passed');
} finally {
  if (keep) console.log(`(kept ${work})`);
  else rmSync(work, { recursive: true, force: true });
}

/** `taskfence inspect --json` prints one object whose keys are the sections (issue 26). */
function checkInspect(out) {
  const keys = Object.keys(JSON.parse(out));
  for (const key of ['runs', 'dispatches', 'locks', 'paths', 'semaphores', 'inbox', 'ownership', 'readyQueue'])
    if (!keys.includes(key)) throw new Error(`taskfence inspect --json has no ${key}: ${keys.join(', ')}`);
  console.log(`taskfence inspect --json: ok (${keys.length} keys)`);
}

function writeJson(path, value) {
  writeFileSync(path, `${JSON.stringify(value, null, 2)}\n`);
}
function existsDir(path) {
  try {
    return readFileSync(join(path, 'package.json')).length > 0;
  } catch {
    return false;
  }
}
