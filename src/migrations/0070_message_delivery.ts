import { sql, type Kysely } from 'kysely';
import { schemaOf, tableIn } from '../query/schema.js';
import type { MigrationDefinition } from './types.js';

/** Legacy rows numbered per backfill statement. */
const BACKFILL_BATCH = 1_000;

/** The sequence behind `messages.seq` on PostgreSQL, as `nextval` names it (schema-qualified when the store has one). */
function sequenceName(db: Kysely<any>): string {
  const schema = schemaOf(db);
  return schema === undefined ? 'messages_seq_seq' : `"${schema}".messages_seq_seq`;
}

/**
 * Leased delivery (issue 23) and send order (issue 22 item 2) for messages:
 * - `seq`: a monotonic number per message, the only order an inbox is read in (never a timestamp
 *   plus a random id). PostgreSQL: a sequence default; SQLite: an `AFTER INSERT` trigger takes
 *   max + 1 (writers are serialized by `BEGIN IMMEDIATE`). Legacy rows are numbered in batches in
 *   their old order (created_at, id), below every new row.
 * - `attempts`, `receipt`, `visible_at`: a hand-out is a lease; `visible_at` is when it lapses
 *   (null or past: visible), `receipt` the current hand-out's token.
 * - `dead_at`, `last_error`: dead-lettered after the store's `maxAttempts`. The status column
 *   keeps its two values (`pending`, `delivered`), so no check constraint changes (a rebuild on
 *   SQLite): a dead message is a pending row with `dead_at` set.
 *
 * Online-safe: nullable columns and a constant default, indexes, a batched backfill.
 */
export const migration0070: MigrationDefinition = {
  version: 70,
  name: 'message_delivery',
  onlineExceptions: [
    {
      rule: 'index-on-existing-table',
      reason:
        'messages_seq_idx and messages_receive_idx are built in the DDL transaction: writes to messages wait ' +
        'for the build (the migrator has no concurrent step yet); reads go on',
    },
    {
      rule: 'data-change-in-ddl-step',
      reason:
        'legacy messages are numbered inside the DDL transaction, in batches of 1 000, before the sequence ' +
        'starts above them; writes to messages wait for it',
    },
  ],
  async up({ db, types }) {
    const ms = types.epochMs;
    const messages = tableIn(db, 'messages');
    await db.schema.alterTable('messages').addColumn('seq', 'bigint').execute();
    await db.schema
      .alterTable('messages')
      .addColumn('attempts', 'integer', (c) => c.notNull().defaultTo(0))
      .execute();
    await db.schema.alterTable('messages').addColumn('receipt', 'text').execute();
    await db.schema.alterTable('messages').addColumn('visible_at', ms).execute();
    await db.schema.alterTable('messages').addColumn('dead_at', ms).execute();
    await db.schema.alterTable('messages').addColumn('last_error', 'text').execute();

    // Number the legacy rows in their old order, in batches.
    for (;;) {
      const result = await sql`
        update ${messages} set seq = numbered.n
        from (
          select id, row_number() over (order by created_at, id)
                     + (select coalesce(max(seq), 0) from ${messages}) as n
          from ${messages} where seq is null
          order by created_at, id
          limit ${sql.lit(BACKFILL_BATCH)}
        ) as numbered
        where ${messages}.id = numbered.id`.execute(db);
      if (Number(result.numAffectedRows ?? 0) < BACKFILL_BATCH) break;
    }

    if (types.nativeSequences) {
      const name = sequenceName(db);
      await sql`create sequence ${tableIn(db, 'messages_seq_seq')} owned by ${messages}.seq`.execute(db);
      await sql`select setval(${sql.lit(name)}, coalesce((select max(seq) from ${messages}), 0) + 1, false)`.execute(
        db,
      );
      await sql`alter table ${messages} alter column seq set default nextval(${sql.lit(name)}::regclass)`.execute(db);
    } else {
      await sql`
        create trigger messages_seq_assign after insert on messages
        for each row when new.seq is null
        begin
          update messages set seq = (select coalesce(max(seq), 0) + 1 from messages) where rowid = new.rowid;
        end`.execute(db);
    }
    await db.schema.createIndex('messages_seq_idx').on('messages').column('seq').unique().execute();
    // Receiving: an inbox's pending rows in send order.
    await db.schema
      .createIndex('messages_receive_idx')
      .on('messages')
      .columns(['to_handle', 'status', 'seq'])
      .execute();
  },
  async down({ db, types }) {
    const messages = tableIn(db, 'messages');
    await db.schema.dropIndex('messages_receive_idx').execute();
    await db.schema.dropIndex('messages_seq_idx').execute();
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
