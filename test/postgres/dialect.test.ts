import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sql, type Kysely } from 'kysely';
import { MIGRATIONS, Migrator, type MigrationDefinition } from '../../src/index.js';
import { defineDialectSuite } from '../suites/dialect.suite.js';
import { postgresFixture } from '../support/dialects.js';
import type { DialectFixture } from '../support/fixtures.js';

defineDialectSuite(postgresFixture);

// PostgreSQL only: SQLite has no JIT, and `bulk` is a no-op there.
describe('bulk transactions (PostgreSQL)', () => {
  let fx: DialectFixture;
  beforeAll(() => {
    fx = postgresFixture();
  });
  afterAll(() => fx.cleanup());

  const jitSetting = async (db: Kysely<any>) =>
    (await sql<{ jit: string }>`select current_setting('jit') as jit`.execute(db)).rows[0]?.jit;

  it('turn JIT off for their own transaction only', async () => {
    const seed = await fx.freshStore({ to: 5 });
    // One pooled connection with JIT on for its session, whatever the server's default.
    const store = await fx.open(seed.location.url, { poolSize: 1 });
    await sql`set jit = on`.execute(store.db);
    expect(await store.dialect.writeTransaction((trx) => jitSetting(trx), { bulk: true })).toBe('off');
    expect(await store.dialect.writeTransaction((trx) => jitSetting(trx))).toBe('on');
    expect(await jitSetting(store.db)).toBe('on');
  });

  it('run every migration as one', async () => {
    const seed = await fx.freshStore({ to: 8 });
    const store = await fx.open(seed.location.url, { poolSize: 1 });
    await sql`set jit = on`.execute(store.db);
    const seen: string[] = [];
    const observed = MIGRATIONS.map(
      (m): MigrationDefinition =>
        m.version !== 52
          ? m
          : {
              ...m,
              async up(ctx) {
                // The checksum pass records this statement without running it (no rows come back).
                const jit = await jitSetting(ctx.db);
                if (jit !== undefined) seen.push(jit);
                await m.up(ctx);
              },
            },
    );
    await new Migrator(store.dialect, observed).migrate({ to: 52 });
    expect(seen).toEqual(['off']);
  });
});

// PostgreSQL only: the client-side query timeout (a little above statement_timeout, so a silent
// network cannot hang a call) follows what a connection states, as a migration's index build does.
describe('client-side query timeout (PostgreSQL)', () => {
  let fx: DialectFixture;
  beforeAll(() => {
    fx = postgresFixture();
  });
  afterAll(() => fx.cleanup());

  it('a session SET statement_timeout = 0 lifts it until RESET, then the store default applies again', async () => {
    const seed = await fx.freshStore({ to: 5 });
    // statement_timeout 500 ms: the client gives up after 1,500 ms.
    const store = await fx.open(seed.location.url, { statementTimeoutMs: 500 });
    await store.db.connection().execute(async (conn) => {
      await sql`set statement_timeout = 0`.execute(conn);
      // Longer than the client's 1,500 ms: only a lifted client timeout lets it finish.
      await sql`select pg_sleep(2)`.execute(conn);
      await sql`reset statement_timeout`.execute(conn);
      // Back to the client's 1,500 ms (outside a transaction the server states no timeout of its own).
      await expect(sql`select pg_sleep(2)`.execute(conn)).rejects.toMatchObject({ code: 'DATABASE_UNAVAILABLE' });
    });
  }, 60_000);
});

// PostgreSQL only: statements sent with COMMIT (`commitWith`) and a read begun meanwhile.
describe('statements sent with COMMIT (PostgreSQL)', () => {
  let fx: DialectFixture;
  beforeAll(() => {
    fx = postgresFixture();
  });
  afterAll(() => fx.cleanup());

  it('go with the COMMIT of their own transaction, never with a read transaction begun meanwhile', async () => {
    const store = await fx.freshStore();
    const table = 'commit_with_probe';
    await sql`create table ${sql.table(table)} (id text primary key)`.execute(store.db);
    const insert = sql`insert into ${sql.table(table)} (id) values (${'sent-with-commit'})`.compile(store.db);
    const count = async (db: Kysely<any>) =>
      Number((await sql<{ n: string }>`select count(*) as n from ${sql.table(table)}`.execute(db)).rows[0]!.n);
    const seen = await store.dialect.writeTransaction(async (trx) => {
      await store.dialect.commitWith(trx, insert);
      // Not sent yet: the statement waits for this transaction's COMMIT.
      const inside = await count(trx);
      // A read transaction on another connection commits on its own (a read-only one would refuse the insert).
      const elsewhere = await store.dialect.readTransaction((r) => count(r));
      return { inside, elsewhere };
    });
    expect(seen).toEqual({ inside: 0, elsewhere: 0 });
    expect(await count(store.db)).toBe(1);
  });
});
