import type { Compilable, CompiledQuery, Kysely, QueryResult, RawBuilder } from 'kysely';
import { schemaOf } from './schema.js';
import { EXECUTE_COMPILED_SYNC, runsOnHeldConnection } from '../dialects/types.js';
import type { Database } from '../schema/database.js';

/*
 * Three ways to write a query in taskfence, and when to use each:
 *
 * 1. The Kysely builder (`db.selectFrom('tasks')…`) — the default. Typed against `Database`,
 *    portable across both dialects, and what to reach for in anything that is not on the hot
 *    path: maintenance, migrations, diagnostics, rare transitions, reads for the CLI.
 * 2. `sql` fragments (the `sql` template tag, `sql.join`, `tableIn(db, …)`) — when the builder cannot say
 *    it, or says it worse: `insert … on conflict … do update … where` compare-and-swaps, range
 *    predicates over byte-ordered keys, `case` orderings. Values are still parameters, never
 *    spliced text; table names go through `tableIn` so a PostgreSQL schema applies. A fragment
 *    must compile the same on both dialects, or be chosen by a `ColumnTypes` / `StoreDialect`
 *    capability, never by asking which dialect runs.
 * 3. Prepared queries (`prepared(...)`, below) — statements on the hot path: every repository
 *    call that the overhead benchmark (bench/overhead.bench.ts) measures, and the fences they
 *    run. The query is written with 1 or 2 and compiled once per dialect (and PostgreSQL
 *    schema); a call binds its values and executes. On SQLite, inside a write
 *    transaction, it runs synchronously on the connection the transaction holds (the dialect
 *    hands its callback a `HeldConnectionKysely`, see `src/dialects/types.ts`); elsewhere,
 *    PostgreSQL included, it goes through Kysely's normal `executeQuery`. Building and compiling
 *    a query costs more than SQLite takes to run it, so this is where the overhead ratio is won.
 *    Its cost: the query's text may depend only on its `shape` (see `prepared`), not on values.
 *
 * Parameters are placeholders handed to the builder as the values of `p`: Kysely puts each into
 * the compiled parameter list like any other value, and execution swaps in the caller's value at
 * the same position. A placeholder must only be passed to Kysely as a value (where, set, values,
 * limit, `sql` interpolation): it cannot be inspected. A list (`in`) is spelled
 * `elements(p.list, n)` with its length `n` in the query's shape, the cache key of queries whose
 * text depends on the input; a list sent as one array parameter (a PostgreSQL function's
 * argument) is spelled `wholeList(p.list)`.
 */

class Placeholder {
  constructor(
    readonly name: string,
    /** For one element of a list parameter: its index, and the list's length in this shape. */
    readonly element?: { readonly index: number; readonly length: number },
    /** The whole list as one parameter (`wholeList`): PostgreSQL's array, for a function's `text[]` argument. */
    readonly whole = false,
  ) {}
}

/** Shapes compiled per query and Kysely instance; past this, further shapes are compiled per call. */
const MAX_SHAPES = 64;

/**
 * The `length` elements of the list parameter `list`, for `in (…)`; `length` must be part of the
 * query's shape, and the list given at execution must have that length.
 */
export function elements<T>(list: readonly T[], length: number): T[] {
  const placeholder = list as unknown;
  if (!(placeholder instanceof Placeholder)) throw new TypeError('elements() takes a parameter of a prepared query.');
  return Array.from({ length }, (_, index) => new Placeholder(placeholder.name, { index, length }) as T);
}

/**
 * The list parameter `list` bound as one value, an array, whatever its length (PostgreSQL: a
 * `text[]` argument, `${wholeList(p.keys)}::text[]`). The query's text does not depend on it.
 */
export function wholeList<T>(list: readonly T[]): T[] {
  const placeholder = list as unknown;
  if (!(placeholder instanceof Placeholder)) throw new TypeError('wholeList() takes a parameter of a prepared query.');
  return new Placeholder(placeholder.name, undefined, true) as unknown as T[];
}

interface Compiled {
  readonly query: CompiledQuery;
  /** Each parameter of the compiled query: a placeholder to fill, or a constant of the query. */
  readonly slots: readonly unknown[];
}

/** A query compiled once per Kysely instance (and per shape), executed with `P`'s values. */
export interface PreparedQuery<P, R, S = void> {
  /** Every row the query returns. */
  execute(db: Kysely<Database>, params: P, shape: S): Promise<R[]>;
  /** The first row, or undefined. */
  first(db: Kysely<Database>, params: P, shape: S): Promise<R | undefined>;
  /** The driver's result, for the affected-row count of a statement without RETURNING. */
  run(db: Kysely<Database>, params: P, shape: S): Promise<QueryResult<R>>;
  /** The statement with `params` bound, to send later with `runBound` (or with BEGIN: `WriteTransactionOptions.first`). */
  bind(db: Kysely<Database>, params: P, shape: S): CompiledQuery<R>;
}

/** Sends a statement bound by a prepared query's `bind`, as its `run` would. */
export function runBound<R>(
  db: Kysely<Database>,
  compiled: CompiledQuery<R>,
): QueryResult<R> | Promise<QueryResult<R>> {
  return runsOnHeldConnection(db) ? db[EXECUTE_COMPILED_SYNC]<R>(compiled) : db.executeQuery<R>(compiled);
}

type Build<P, R, S> = (db: Kysely<Database>, p: P, shape: S) => Compilable<R> | RawBuilder<R>;

/**
 * Declares a prepared query (see the note at the top of this module). `shape`, when the query's
 * text depends on the input (a list's length, a table), is part of the cache key: keep its values
 * few and primitive.
 *
 * @example
 * const selectTask = prepared((db, p: { id: string }) => db.selectFrom('tasks').selectAll().where('id', '=', p.id));
 * const task = await selectTask.first(trx, { id });
 */
export function prepared<P extends object, R, S extends string | number | void = void>(
  build: Build<P, R, S>,
): PreparedQuery<P, R, S> {
  // Keyed by the Kysely instance's adapter (transactions share their Kysely's adapter), then by
  // its PostgreSQL schema: a host's Kysely joined with store.withTransaction may serve several.
  const cache = new WeakMap<object, Map<string | undefined, Map<S, Compiled>>>();

  const compile = (db: Kysely<Database>, shape: S): Compiled => {
    const adapter = db.getExecutor().adapter;
    let bySchema = cache.get(adapter);
    if (!bySchema) cache.set(adapter, (bySchema = new Map<string | undefined, Map<S, Compiled>>()));
    const schema = schemaOf(db);
    let byShape = bySchema.get(schema);
    if (!byShape) bySchema.set(schema, (byShape = new Map<S, Compiled>()));
    let compiled = byShape.get(shape);
    if (!compiled) {
      const p = new Proxy({} as P, { get: (_target, name) => new Placeholder(String(name)) });
      const built = build(db, p, shape);
      const query = 'isRawBuilder' in built ? built.compile(db) : built.compile();
      compiled = { query, slots: query.parameters };
      if (byShape.size < MAX_SHAPES) byShape.set(shape, compiled);
    }
    return compiled;
  };

  const bound = (db: Kysely<Database>, params: P, shape: S): CompiledQuery<R> => {
    const { query, slots } = compile(db, shape);
    const parameters = slots.map((slot) =>
      slot instanceof Placeholder ? bind(params as Record<string, unknown>, slot) : slot,
    );
    // Field by field, not `{ ...query, parameters }`: this runs for every statement (see src/objects.ts).
    return { query: query.query, queryId: query.queryId, sql: query.sql, parameters };
  };
  const run = (db: Kysely<Database>, params: P, shape: S) => runBound(db, bound(db, params, shape));

  return Object.freeze({
    async execute(db: Kysely<Database>, params: P, shape: S) {
      return (await run(db, params, shape)).rows;
    },
    async first(db: Kysely<Database>, params: P, shape: S) {
      return (await run(db, params, shape)).rows[0];
    },
    async run(db: Kysely<Database>, params: P, shape: S) {
      return run(db, params, shape);
    },
    bind: bound,
  });
}

function bind(params: Record<string, unknown>, { name, element, whole }: Placeholder): unknown {
  if (!(name in params)) throw new TypeError(`Prepared query parameter "${name}" was not given.`);
  const value = params[name];
  if (whole) {
    if (!Array.isArray(value)) throw new TypeError(`Prepared query parameter "${name}" must be a list.`);
    return value;
  }
  if (!element) {
    if (Array.isArray(value))
      throw new TypeError(`Prepared query parameter "${name}" is a list; pass it through elements().`);
    return value;
  }
  if (!Array.isArray(value) || value.length !== element.length) {
    throw new TypeError(`Prepared query parameter "${name}" must be a list of ${element.length} (the query's shape).`);
  }
  return value[element.index];
}
