import type { SchemaDescription } from './describe.js';

/**
 * A normalized description of a store's schema (tables, columns with logical types,
 * nullability, defaults, primary and foreign keys, unique and partial indexes), equal across
 * dialects for equal schemas.
 *
 * @example
 * const a = await describeSchema(sqliteStore);
 * const b = await describeSchema(postgresStore);
 * assert.deepEqual(a, b);
 */
export function describeSchema(store: { describeSchema(): Promise<SchemaDescription> }): Promise<SchemaDescription> {
  return store.describeSchema();
}
