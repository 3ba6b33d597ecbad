import { sql } from 'kysely';
import type { Store } from '../../src/index.js';
import { inStoreSchema, tbl } from '../support/schema.js';

/**
 * Makes `store`'s empty database look like one the older app created: the v5 tables made by
 * plain SQL (no taskfence history), `PRAGMA user_version = 5` on SQLite, and some rows.
 */
export async function makeLegacyV5Database(store: Store): Promise<void> {
  const [baseline] = await store.plan({ to: 5 });
  // The baseline's plain SQL names no schema: in a schema-confined store, it runs with that schema first.
  await inStoreSchema(store.db, async (db) => {
    for (const statement of baseline!.statements) await sql.raw(statement).execute(db);
  });
  if (store.dialect.kind === 'sqlite') await sql`pragma user_version = 5`.execute(store.db);
  await store.db.insertInto('companies').values({ id: 'c1', name: 'Acme', created_at: 1 }).execute();
  await store.db
    .insertInto('agents')
    .values([
      {
        id: 'a-eng',
        company_id: 'c1',
        name: 'Eve',
        role: 'Senior Engineer',
        department: null,
        workspace_id: null,
        created_at: 1,
      },
      {
        id: 'a-cfo',
        company_id: 'c1',
        name: 'Fin',
        role: 'CFO',
        department: 'finance',
        workspace_id: null,
        created_at: 1,
      },
    ])
    .execute();
  const task = (id: string, assignee: string, status: string) =>
    sql`insert into ${tbl(store.db, 'tasks')} (id, company_id, assignee_agent_id, title, status, created_at, updated_at)
        values (${id}, 'c1', ${assignee}, ${id}, ${status}, 1, 1)`.execute(store.db);
  await task('t-eng', 'a-eng', 'todo');
  await task('t-cfo', 'a-cfo', 'todo');
}
