import { sql } from 'kysely';
import { backfillIndexStep, numberLegacyBatch, numberNewRows, unnumberedRows } from './numbering.js';
import { tableIn } from '../query/schema.js';
import type { MigrationDefinition } from './types.js';

/**
 * Leased delivery (issue 23) and send order (issue 22 item 2) for messages:
 * - `seq`: a monotonic number per message, the only order an inbox is read in (never a timestamp
 *   plus a random id). PostgreSQL: a sequence default; SQLite: an `AFTER INSERT` trigger takes
 *   max + 1 (writers are serialized by `BEGIN IMMEDIATE`). Legacy rows are numbered by the
 *   backfill, after the DDL commits, in their old order (created_at, id), below every new row
 *   (the argument is in numbering.ts).
 * - `attempts`, `receipt`, `visible_at`: a hand-out is a lease; `visible_at` is when it lapses
 *   (null or past: visible), `receipt` the current hand-out's token.
 * - `dead_at`, `last_error`: dead-lettered after the store's `maxAttempts`. The status column
 *   keeps its two values (`pending`, `delivered`), so no check constraint changes (a rebuild on
 *   SQLite): a dead message is a pending row with `dead_at` set.
 *
 * Online-safe: nullable columns and a constant default; the indexes are concurrent steps, the
 * numbering a batched backfill.
 */
export const migration0070: MigrationDefinition = {
  version: 70,
  name: 'message_delivery',
  async up({ db, types }) {
    const ms = types.epochMs;
    await db.schema.alterTable('messages').addColumn('seq', 'bigint').execute();
    await db.schema
      .alterTable('messages')
      .addColumn('attempts', 'integer', (c) => c.notNull().defaultTo(0))
      .execute();
    await db.schema.alterTable('messages').addColumn('receipt', 'text').execute();
    await db.schema.alterTable('messages').addColumn('visible_at', ms).execute();
    await db.schema.alterTable('messages').addColumn('dead_at', ms).execute();
    await db.schema.alterTable('messages').addColumn('last_error', 'text').execute();

    await numberNewRows(db, types, 'messages');
  },
  concurrent: [
    {
      kind: 'create-index',
      index: 'messages_seq_idx',
      table: 'messages',
      build: (db) => db.schema.createIndex('messages_seq_idx').on('messages').column('seq').unique(),
    },
    backfillIndexStep('messages'),
    // Receiving: an inbox's pending rows in send order.
    {
      kind: 'create-index',
      index: 'messages_receive_idx',
      table: 'messages',
      build: (db) =>
        db.schema.createIndex('messages_receive_idx').on('messages').columns(['to_handle', 'status', 'seq']),
    },
  ],
  backfill: {
    batch: ({ db, batchSize }, cursor) => numberLegacyBatch(db, ['messages'], batchSize, cursor),
    workRows: (db) => unnumberedRows(db, ['messages']),
    summary: (changed) => `0070: backfill complete, ${changed} legacy messages numbered`,
  },
  // Until the concurrent steps, 0070 numbered the legacy messages and built its indexes inside its
  // DDL transaction; a database that applied it then has the same schema but the backfill index
  // (test/suites/online.suite.ts applies the old definition and migrates on).
  acceptedChecksums: {
    sqlite: ['58e26d6fbed33b17ef14bc47929d4a643497dfdcfe8a3f74e72407b170d10c1f'],
    postgres: ['06efd596e053ab174e829d65ed60a8a1c0dd4d2a12439d9cb919c9747ccecea0'],
  },
  async down({ db, types }) {
    const messages = tableIn(db, 'messages');
    // The concurrent steps may not all have run (a crash, then a revert).
    await db.schema.dropIndex('messages_receive_idx').ifExists().execute();
    await db.schema.dropIndex('messages_seq_backfill_idx').ifExists().execute();
    await db.schema.dropIndex('messages_seq_idx').ifExists().execute();
    if (types.nativeSequences) {
      await sql`alter table ${messages} alter column seq drop default`.execute(db);
      await sql`drop sequence ${tableIn(db, 'messages_seq_seq')}`.execute(db);
    } else {
      await sql`drop trigger messages_seq_assign`.execute(db);
    }
    for (const column of ['last_error', 'dead_at', 'visible_at', 'receipt', 'attempts', 'seq']) {
      await db.schema.alterTable('messages').dropColumn(column).execute();
    }
  },
};
