import {
  WithSchemaPlugin,
  sql,
  type DatabaseIntrospector,
  type DatabaseMetadataOptions,
  type Dialect,
  type Kysely,
  type RawBuilder,
  type SchemaMetadata,
  type TableMetadata,
} from 'kysely';
import { InvalidArgumentError } from '../errors.js';

/*
 * PostgreSQL schema support. Every statement taskfence sends names its tables with the
 * configured schema (Kysely's WithSchemaPlugin, plus `tableIn` for table names inside raw SQL),
 * instead of relying on `search_path`: no session or transaction state, so it works through a
 * transaction-mode pooler and inside a host's transaction without changing what the host's own
 * unqualified names resolve to.
 */

const SCHEMA_NAME = /^[A-Za-z_][A-Za-z0-9_$]{0,62}$/;

/** Checks a PostgreSQL schema name (a plain identifier: letters, digits, `_`, `$`; at most 63 bytes). */
export function validateSchemaName(schema: string): string {
  if (typeof schema !== 'string' || !SCHEMA_NAME.test(schema)) {
    throw new InvalidArgumentError(
      'schema',
      `${JSON.stringify(schema)} is not a plain identifier (letters, digits, _ and $, at most 63, not starting with a digit)`,
    );
  }
  return schema;
}

/** The WithSchemaPlugin taskfence installs, with its schema readable (for `tableIn` and prepared queries). */
export class TaskfenceSchemaPlugin extends WithSchemaPlugin {
  constructor(readonly schema: string) {
    super(schema);
  }
}

/** The schema `db`'s statements are confined to, if one was configured. */
export function schemaOf(db: Kysely<any> | undefined): string | undefined {
  if (db === undefined) return undefined;
  for (const plugin of db.getExecutor().plugins) if (plugin instanceof TaskfenceSchemaPlugin) return plugin.schema;
  return undefined;
}

/**
 * A table name for raw SQL run on `db`: schema-qualified when `db` has one, else the bare name,
 * spelled exactly as before (so migration checksums, recorded without a schema, do not change).
 */
export function tableIn(db: Kysely<any> | undefined, name: string): RawBuilder<unknown> {
  const schema = schemaOf(db);
  return schema === undefined ? sql.raw(name) : sql.table(`${schema}.${name}`);
}

/**
 * Wraps a dialect so `db.introspection` lists only the tables of one schema (the configured one,
 * else `current_schema()`): Kysely's PostgreSQL introspector lists every schema, so another
 * install's (or the host's) tables would look like taskfence's.
 */
export function confineIntrospection(dialect: Dialect, schema: string | undefined): Dialect {
  return {
    createAdapter: () => dialect.createAdapter(),
    createDriver: () => dialect.createDriver(),
    createQueryCompiler: () => dialect.createQueryCompiler(),
    createIntrospector: (db) => new ConfinedIntrospector(dialect.createIntrospector(db), db, schema),
  };
}

class ConfinedIntrospector implements DatabaseIntrospector {
  constructor(
    private readonly inner: DatabaseIntrospector,
    private readonly db: Kysely<any>,
    private readonly schema: string | undefined,
  ) {}

  async #schema(): Promise<string> {
    if (this.schema !== undefined) return this.schema;
    const { rows } = await sql<{ schema: string }>`select current_schema() as schema`.execute(this.db);
    return rows[0]!.schema;
  }

  getSchemas(): Promise<SchemaMetadata[]> {
    return this.inner.getSchemas();
  }

  async getTables(options?: DatabaseMetadataOptions): Promise<TableMetadata[]> {
    const schema = await this.#schema();
    return (await this.inner.getTables(options)).filter((t) => t.schema === schema);
  }

  /** Kysely 0.28's introspector method (0.29 dropped it); spelled without its type so both versions compile. */
  async getMetadata(options?: DatabaseMetadataOptions): Promise<{ tables: TableMetadata[] }> {
    return { tables: await this.getTables(options) };
  }
}
