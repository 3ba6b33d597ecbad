/**
 * A normalized description of a database schema. Both dialects are described with the same
 * logical types (see `normalizeType`), so two descriptions compare with deep equality.
 */
export interface SchemaDescription {
  readonly tables: Record<string, TableDescription>;
}

export interface TableDescription {
  /** Columns by name. */
  readonly columns: Record<string, ColumnDescription>;
  readonly primaryKey: readonly string[];
  /** Sorted by their column list. */
  readonly foreignKeys: readonly ForeignKeyDescription[];
  /** Explicitly created indexes by name (primary-key indexes are described by `primaryKey`). */
  readonly indexes: Record<string, IndexDescription>;
}

export type LogicalType = 'integer' | 'text' | 'real' | 'blob' | 'json' | 'boolean' | `other:${string}`;

export interface ColumnDescription {
  readonly type: LogicalType;
  readonly nullable: boolean;
  /** The default as a normalized expression, or null. */
  readonly default: string | null;
}

export interface ForeignKeyDescription {
  readonly columns: readonly string[];
  readonly referencedTable: string;
  readonly referencedColumns: readonly string[];
  readonly onDelete: string;
}

export interface IndexDescription {
  readonly unique: boolean;
  /** Column names or normalized expressions, in index order. */
  readonly columns: readonly string[];
  /** The normalized partial-index predicate, or null. */
  readonly where: string | null;
}

/** Maps a dialect's declared column type to the logical type both dialects share. */
export function normalizeType(declared: string): LogicalType {
  const t = declared.trim().toLowerCase();
  if (/^(integer|int|int4|int8|bigint|smallint|int2)$/.test(t)) return 'integer';
  if (/^(text|varchar.*|character varying.*|char.*|character.*)$/.test(t)) return 'text';
  if (/^(real|double precision|double|float.*|numeric.*)$/.test(t)) return 'real';
  if (/^(blob|bytea)$/.test(t)) return 'blob';
  if (/^(json|jsonb)$/.test(t)) return 'json';
  if (/^(boolean|bool)$/.test(t)) return 'boolean';
  return `other:${t}`;
}

/**
 * Normalizes an SQL expression (default, index expression, predicate) so that SQLite's stored
 * source text and PostgreSQL's deparsed form compare equal: lower case, no casts, no quotes
 * around identifiers, no parentheses or whitespace, and a list test in its written form
 * (PostgreSQL deparses `x not in ('a', 'b')` as `x <> ALL (ARRAY['a', 'b'])`, `in` as `= ANY`).
 */
export function normalizeExpression(expression: string): string {
  return expression
    .replace(/::[a-z_ ]+(\[\])?/gi, '')
    .replace(/"/g, '')
    .replace(/[()\s]/g, '')
    .toLowerCase()
    .replace(/<>allarray\[([^\]]*)\]/g, 'notin$1')
    .replace(/=anyarray\[([^\]]*)\]/g, 'in$1');
}

/** Splits a parenthesized list on its top-level commas: `a, coalesce(b, ''), c` → three parts. */
export function splitTopLevel(list: string): string[] {
  const parts: string[] = [];
  let depth = 0;
  let quoted = false;
  let current = '';
  for (const ch of list) {
    if (ch === "'") quoted = !quoted;
    if (!quoted && ch === '(') depth++;
    if (!quoted && ch === ')') depth--;
    if (!quoted && depth === 0 && ch === ',') {
      parts.push(current.trim());
      current = '';
    } else {
      current += ch;
    }
  }
  if (current.trim() !== '') parts.push(current.trim());
  return parts;
}

export function sortedRecord<T>(entries: Iterable<[string, T]>): Record<string, T> {
  return Object.fromEntries([...entries].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
}

export function sortForeignKeys(fks: ForeignKeyDescription[]): ForeignKeyDescription[] {
  return fks.sort((a, b) => {
    const ka = `${a.columns.join(',')}>${a.referencedTable}`;
    const kb = `${b.columns.join(',')}>${b.referencedTable}`;
    return ka < kb ? -1 : ka > kb ? 1 : 0;
  });
}
