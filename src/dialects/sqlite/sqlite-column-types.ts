import type { ColumnTypes } from '../types.js';

/** SQLite's column types for migrations (see `ColumnTypes` and the type mapping in the README). */
export const SQLITE_COLUMN_TYPES: ColumnTypes = Object.freeze({
  epochMs: 'integer',
  bytewiseText: 'text',
  integerIs64Bit: true,
  nativeSequences: false,
  concurrentDdl: false,
  storedFunctions: false,
});
