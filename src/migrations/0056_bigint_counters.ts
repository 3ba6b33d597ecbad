import type { MigrationDefinition } from './types.js';

/** The fencing tokens, ownership generations and attempt counters, by table. */
const COUNTERS: readonly (readonly [table: string, columns: readonly string[]])[] = [
  ['workspace_locks', ['token']],
  ['task_leases', ['token']],
  ['task_environments', ['ownership_generation', 'cleanup_claim_generation']],
  ['workspace_groups', ['ownership_generation', 'cleanup_claim_generation']],
  ['cleanup_snapshots', ['ownership_generation', 'attempts']],
];

/**
 * 64-bit fencing tokens, generations and attempt counters on both dialects. SQLite's integers
 * are already 64-bit, so it has nothing to do; PostgreSQL widens its 32-bit `integer` columns to
 * `bigint` (one rewrite per table). `down` narrows them back, and fails (rolled back, nothing
 * changed) if a value no longer fits in 32 bits.
 */
export const migration0056: MigrationDefinition = {
  version: 56,
  name: 'bigint_counters',
  async up({ db, types }) {
    if (types.integerIs64Bit) return;
    for (const [table, columns] of COUNTERS) {
      const [first, ...rest] = columns;
      let alter = db.schema.alterTable(table).alterColumn(first!, (c) => c.setDataType('bigint'));
      for (const column of rest) alter = alter.alterColumn(column, (c) => c.setDataType('bigint'));
      await alter.execute();
    }
  },
  async down({ db, types }) {
    if (types.integerIs64Bit) return;
    for (const [table, columns] of COUNTERS) {
      const [first, ...rest] = columns;
      let alter = db.schema.alterTable(table).alterColumn(first!, (c) => c.setDataType('integer'));
      for (const column of rest) alter = alter.alterColumn(column, (c) => c.setDataType('integer'));
      await alter.execute();
    }
  },
};
