/**
 * The validation layer at the API boundary (SPEC §8: bad input stops at the boundary). Every
 * public repository function checks its arguments with these before its first statement, so a
 * refusal is an `InvalidArgumentError` naming the field, changes nothing, and is the same on
 * both dialects. Plain checks on purpose: they run on every hot-path call.
 *
 * The documented limits:
 * - identifiers (ids, handles, holders, target keys, kinds): non-empty strings of at most
 *   `MAX_ID_LENGTH` UTF-16 code units (so every index entry stays inside PostgreSQL's limit);
 * - free text (names, titles, descriptions, questions, errors, root paths): at most `MAX_TEXT_LENGTH`;
 * - every string: no NUL character and no unpaired UTF-16 surrogate (PostgreSQL cannot store
 *   NUL; both databases would silently replace a lone surrogate);
 * - durations (TTLs, staleness, timeouts): integers from 1 ms to `MAX_DURATION_MS` (10 years);
 * - fencing tokens and generations: positive safe integers (≤ 2^53 − 1; the columns are 64-bit);
 * - message payloads: JSON-serializable, at most `MAX_PAYLOAD_LENGTH` characters of JSON;
 * - write sets: at most `MAX_WRITE_PATHS` paths.
 */
import { InvalidArgumentError } from '../errors.js';

/** Longest identifier (id, handle, holder, target key, message kind), in UTF-16 code units. */
export const MAX_ID_LENGTH = 256;
/** Longest free text (name, title, description, question, resolution, error, root path). */
export const MAX_TEXT_LENGTH = 1_048_576;
/** Longest duration a TTL, staleness threshold or timeout may have: 10 years in ms. */
export const MAX_DURATION_MS = 10 * 365 * 24 * 60 * 60 * 1000;
/** Longest JSON text of a message payload. */
export const MAX_PAYLOAD_LENGTH = 1_048_576;
/** Most paths one write set (`createTask` writes, every path-lease call) may hold. */
export const MAX_WRITE_PATHS = 10_000;

type WellFormed = { isWellFormed(): boolean };

function checkString(field: string, value: string, max: number): void {
  if (value.length > max)
    throw new InvalidArgumentError(field, `must be at most ${max} characters long (got ${value.length})`);
  if (value.includes('\u0000')) throw new InvalidArgumentError(field, 'must not contain a NUL character');
  if (!(value as unknown as WellFormed).isWellFormed())
    throw new InvalidArgumentError(field, 'must not contain an unpaired UTF-16 surrogate');
}

/** A non-empty (not only whitespace) string of at most `max` characters, without NUL or lone surrogates. */
export function requireText(field: string, value: unknown, max: number = MAX_TEXT_LENGTH): string {
  if (typeof value !== 'string' || value.trim() === '')
    throw new InvalidArgumentError(field, 'must be a non-empty string');
  checkString(field, value, max);
  return value;
}

/** An identifier: `requireText` with the identifier length limit. */
export function requireId(field: string, value: unknown): string {
  return requireText(field, value, MAX_ID_LENGTH);
}

/** `undefined` or `null` (→ null), or an identifier. */
export function optionalId(field: string, value: unknown): string | null {
  return value === undefined || value === null ? null : requireId(field, value);
}

/** `undefined` or `null` (→ null), or non-empty free text. */
export function optionalText(field: string, value: unknown): string | null {
  return value === undefined || value === null ? null : requireText(field, value);
}

/** `undefined` or `null` (→ null), or a string that may be empty. */
export function optionalString(field: string, value: unknown): string | null {
  return value === undefined || value === null ? null : requireString(field, value);
}

/** A string that may be empty (still without NUL or lone surrogates). */
export function requireString(field: string, value: unknown, max: number = MAX_TEXT_LENGTH): string {
  if (typeof value !== 'string') throw new InvalidArgumentError(field, 'must be a string');
  checkString(field, value, max);
  return value;
}

/** The input object of a call (`{ … }`); anything else is refused before a property is read. */
export function requireInput<T>(field: string, value: T): NonNullable<T> {
  if (typeof value !== 'object' || value === null || Array.isArray(value))
    throw new InvalidArgumentError(field, 'must be an object');
  return value;
}

/** An optional options object: `undefined` → `{}`. */
export function optionalInput<T extends object>(field: string, value: T | undefined | null): Partial<T> {
  if (value === undefined || value === null) return {};
  return requireInput(field, value);
}

/** An integer number of milliseconds from `min` (default 1) to `MAX_DURATION_MS`. */
export function requirePositiveMs(field: string, value: unknown, min = 1): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > MAX_DURATION_MS) {
    throw new InvalidArgumentError(
      field,
      `must be an integer number of milliseconds from ${min} to ${MAX_DURATION_MS} (10 years)`,
    );
  }
  return value;
}

/** A fencing token or generation: a positive safe integer. */
export function requireCounter(field: string, value: unknown, what: string): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 1) {
    throw new InvalidArgumentError(field, `must be the positive integer ${what} (at most ${Number.MAX_SAFE_INTEGER})`);
  }
  return value;
}

/** A positive integer limit up to `max`; `undefined` gives `fallback`. */
export function requireLimit(field: string, value: unknown, max: number, fallback?: number): number {
  if (value === undefined && fallback !== undefined) return fallback;
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 1 || value > max) {
    throw new InvalidArgumentError(field, `must be an integer from 1 to ${max}`);
  }
  return value;
}

/** A boolean the caller must decide explicitly. */
export function requireBoolean(field: string, value: unknown): boolean {
  if (typeof value !== 'boolean') throw new InvalidArgumentError(field, 'is required and must be true or false');
  return value;
}

/** One of `allowed`. */
export function requireOneOf<T extends string>(field: string, value: unknown, allowed: readonly T[]): T {
  if (typeof value !== 'string' || !allowed.includes(value as T)) {
    throw new InvalidArgumentError(field, `must be one of ${allowed.join(', ')}`);
  }
  return value as T;
}

/** A status filter: one known status or an array of them (deduplicated). `undefined` → null (no filter). */
export function optionalStatusFilter<T extends string>(
  field: string,
  value: unknown,
  allowed: readonly T[],
): T[] | null {
  if (value === undefined) return null;
  if (typeof value === 'string') return [requireOneOf(field, value, allowed)];
  if (!Array.isArray(value) || value.length > allowed.length * 4) {
    throw new InvalidArgumentError(field, `must be one of ${allowed.join(', ')}, or an array of them`);
  }
  return [...new Set(value.map((v) => requireOneOf(field, v, allowed)))];
}

/** `undefined` (no filter), `null` or an identifier: a target-key filter. */
export function optionalKeyFilter(field: string, value: unknown): string | null | undefined {
  return value === undefined ? undefined : value === null ? null : requireId(field, value);
}

/** `undefined` (no filter) or an identifier. */
export function optionalIdFilter(field: string, value: unknown): string | undefined {
  return value === undefined ? undefined : requireId(field, value);
}

/** A JSON-serializable value as its JSON text (`null` for `undefined`/`null`). BigInt, cycles and functions are refused. */
export function requireJson(field: string, value: unknown): string | null {
  if (value === undefined || value === null) return null;
  let json: string | undefined;
  try {
    json = JSON.stringify(value);
  } catch (error) {
    throw new InvalidArgumentError(
      field,
      `must be a JSON-serializable value (${error instanceof Error ? error.message : String(error)})`,
    );
  }
  if (json === undefined)
    throw new InvalidArgumentError(field, 'must be a JSON-serializable value (got a function, symbol or undefined)');
  if (json.length > MAX_PAYLOAD_LENGTH)
    throw new InvalidArgumentError(
      field,
      `must be at most ${MAX_PAYLOAD_LENGTH} characters as JSON (got ${json.length})`,
    );
  return json;
}

/** A list of path strings of at most `MAX_WRITE_PATHS` (the paths themselves are checked by `normalizeWritePath`). */
export function requirePathList(field: string, value: unknown): readonly string[] {
  if (!Array.isArray(value)) throw new InvalidArgumentError(field, 'must be an array of path strings');
  if (value.length > MAX_WRITE_PATHS) {
    throw new InvalidArgumentError(
      field,
      `must hold at most ${MAX_WRITE_PATHS} paths (got ${value.length}); split the work into smaller write sets`,
    );
  }
  return value as readonly string[];
}
