import { POSTGRES_COLUMN_TYPES } from './postgres/postgres-column-types.js';
import { SQLITE_COLUMN_TYPES } from './sqlite/sqlite-column-types.js';
import type { ColumnTypes, StoreDialect } from './types.js';

/**
 * The column types of dialect `kind`, without opening one: for the migration engine, which
 * compiles migrations for either dialect (checksums, `plan`). An open dialect has them as
 * `StoreDialect.columnTypes`.
 */
export function columnTypesFor(kind: StoreDialect['kind']): ColumnTypes {
  return kind === 'sqlite' ? SQLITE_COLUMN_TYPES : POSTGRES_COLUMN_TYPES;
}
