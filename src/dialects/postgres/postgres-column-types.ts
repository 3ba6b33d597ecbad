import type { ColumnTypes } from '../types.js';

/** PostgreSQL's column types for migrations (see `ColumnTypes` and the type mapping in the README). */
export const POSTGRES_COLUMN_TYPES: ColumnTypes = Object.freeze({
  epochMs: 'bigint',
  bytewiseText: 'text collate "C"',
  integerIs64Bit: false,
  nativeSequences: true,
  concurrentDdl: true,
  storedFunctions: true,
});
