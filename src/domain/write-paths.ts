/**
 * Path-scoped write coordination, the pure part (seed 002, SPEC §5): normalizing the paths a
 * task writes, reducing them to lease keys, deciding overlap, and encoding keys so the database
 * can find every overlapping lease with index lookups. No I/O here; `repositories/paths.ts`
 * does the leasing.
 *
 * A lease key is a normalized workspace-relative path (`src/a.ts`) or `""`, the whole-workspace
 * sentinel. Two keys overlap when one is the other or an ancestor of it, on whole segments.
 */
import { TaskfenceError } from '../errors.js';

/** A write path was rejected by `normalizeWritePath`; `reason` says why. */
export class InvalidWritePathError extends TaskfenceError {
  readonly code = 'INVALID_WRITE_PATH';
  constructor(
    readonly path: unknown,
    readonly reason: string,
  ) {
    super(
      `Invalid write path ${typeof path === 'string' ? JSON.stringify(path) : String(path)}: ${reason}. ` +
        'Write paths are relative to the workspace root, use / (or \\) between segments, and stay inside the workspace.',
    );
  }
}

/** The whole-workspace lease key: it overlaps every other key. */
export const WHOLE_WORKSPACE_KEY = '';

/** Longest normalized write path, in UTF-8 bytes (keeps lease keys well inside index-entry limits). */
export const MAX_WRITE_PATH_BYTES = 1024;

// C0 and C1 control characters, DEL included; NUL is reported separately.
// eslint-disable-next-line no-control-regex -- matching control characters is the point
const CONTROL = /[\u0001-\u001f\u007f-\u009f]/u;
const LONE_SURROGATE = /\p{Cs}/u;
const DRIVE_LETTER = /^[A-Za-z]:/;
// Characters that make a segment a glob pattern (fnmatch, minimatch braces); conservative on purpose:
// a literal `[` in a name only makes the lease broader.
const GLOB_MAGIC = /[*?[\]{}]/;

/**
 * Normalizes a workspace-relative write path: backslashes become `/`, empty and `.` segments
 * go, `..` is resolved, no leading or trailing slash, Unicode in NFC. The workspace root itself
 * (`""`, `"."`, `"a/.."`) normalizes to `""`, the whole workspace. Idempotent.
 *
 * Throws `InvalidWritePathError` (naming the path and the reason) for non-strings, absolute
 * paths (`/etc`, `\\server`, `C:\x`), `..` that escapes the root (`../x`, `a/../../b`), NUL and
 * other control characters, unpaired UTF-16 surrogates, and paths over `MAX_WRITE_PATH_BYTES`.
 *
 * @example
 * normalizeWritePath('./src//lib/../a.ts'); // 'src/a.ts'
 * normalizeWritePath('src\\b.ts');          // 'src/b.ts'
 * normalizeWritePath('../x');               // throws InvalidWritePathError
 */
export function normalizeWritePath(path: string): string {
  if (typeof path !== 'string') throw new InvalidWritePathError(path, 'it is not a string');
  if (path.includes('\u0000')) throw new InvalidWritePathError(path, 'it contains a NUL byte');
  if (CONTROL.test(path)) throw new InvalidWritePathError(path, 'it contains a control character');
  if (LONE_SURROGATE.test(path)) throw new InvalidWritePathError(path, 'it contains an unpaired UTF-16 surrogate');
  const slashed = path.normalize('NFC').replaceAll('\\', '/');
  if (slashed.startsWith('/'))
    throw new InvalidWritePathError(path, 'it is absolute; give a path relative to the workspace root');
  if (DRIVE_LETTER.test(slashed))
    throw new InvalidWritePathError(path, 'it starts with a drive letter; give a path relative to the workspace root');
  const segments: string[] = [];
  for (const segment of slashed.split('/')) {
    if (segment === '' || segment === '.') continue;
    if (segment === '..') {
      if (segments.length === 0) throw new InvalidWritePathError(path, '".." escapes the workspace root');
      segments.pop();
      continue;
    }
    segments.push(segment);
  }
  const normalized = segments.join('/');
  if (Buffer.byteLength(normalized, 'utf8') > MAX_WRITE_PATH_BYTES) {
    throw new InvalidWritePathError(path, `it is longer than ${MAX_WRITE_PATH_BYTES} bytes`);
  }
  return normalized;
}

/** True if a normalized path's segment is a glob pattern. */
function isGlobSegment(segment: string): boolean {
  return GLOB_MAGIC.test(segment);
}

/** A normalized path reduced to the non-magic prefix of its glob (`src/**\/*.ts` → `src`, `*.md` → `""`). */
function globPrefix(normalized: string): string {
  if (normalized === '') return '';
  const segments = normalized.split('/');
  const magic = segments.findIndex(isGlobSegment);
  return magic === -1 ? normalized : segments.slice(0, magic).join('/');
}

/**
 * Does key `a` overlap key `b`? True when one is the other or its ancestor on whole segments;
 * `""` overlaps everything. Symmetric and reflexive. Takes lease keys (normalized paths).
 *
 * @example
 * keysOverlap('src', 'src/a.ts'); // true
 * keysOverlap('src', 'srcx');     // false
 * keysOverlap('', 'docs');        // true
 */
export function keysOverlap(a: string, b: string): boolean {
  if (a === WHOLE_WORKSPACE_KEY || b === WHOLE_WORKSPACE_KEY || a === b) return true;
  return b.startsWith(`${a}/`) || a.startsWith(`${b}/`);
}

/**
 * The lease keys of a set of write paths: each path normalized (throws `InvalidWritePathError`),
 * globs reduced to their non-magic prefix (`*.md` → `""`, the whole workspace), duplicates and
 * keys covered by another key of the set dropped. The result is sorted and no two of its keys
 * overlap; `[]` gives `[]`.
 *
 * @example
 * leaseKeys(['src/**\/*.ts', 'src/a.ts', 'docs/']); // ['docs', 'src']
 * leaseKeys(['*.md', 'src']);                       // ['']
 */
export function leaseKeys(paths: readonly string[]): string[] {
  // An agent claims the same few write sets again and again: their keys are remembered by the
  // exact strings given (a pure function of them). Only lists of NUL-free strings are looked up,
  // so the count and the joined strings are unambiguous ([] and [''] differ by their count), and
  // anything invalid still reaches the checks below.
  const memoKey = paths.every((p) => typeof p === 'string' && !p.includes('\u0000'))
    ? `${paths.length}\u0000${paths.join('\u0000')}`
    : null;
  const known = memoKey === null ? undefined : LEASE_KEYS.get(memoKey);
  if (known) return [...known];
  const roots = computeLeaseKeys(paths);
  if (memoKey !== null) {
    if (LEASE_KEYS.size >= LEASE_KEYS_REMEMBERED) LEASE_KEYS.delete(LEASE_KEYS.keys().next().value!);
    LEASE_KEYS.set(memoKey, Object.freeze([...roots]));
  }
  return roots;
}

/** Write sets whose lease keys `leaseKeys` remembers, oldest forgotten first. */
const LEASE_KEYS_REMEMBERED = 512;
const LEASE_KEYS = new Map<string, readonly string[]>();

function computeLeaseKeys(paths: readonly string[]): string[] {
  const keys = [...new Set(paths.map((p) => globPrefix(normalizeWritePath(p))))];
  // Sorted by segments, an ancestor comes right before its descendants' run, so one pass keeps the roots.
  keys.sort(compareKeys);
  const roots: string[] = [];
  for (const key of keys) {
    const last = roots[roots.length - 1];
    if (last !== undefined && keysOverlap(last, key)) continue;
    roots.push(key);
  }
  return roots;
}

/** Orders keys segment by segment (so `a` < `a/b` < `a-b`), which keeps an ancestor's descendants contiguous. */
function compareKeys(a: string, b: string): number {
  const sa = a === '' ? [] : a.split('/');
  const sb = b === '' ? [] : b.split('/');
  for (let i = 0; i < Math.min(sa.length, sb.length); i++) {
    if (sa[i] !== sb[i]) return sa[i]! < sb[i]! ? -1 : 1;
  }
  return sa.length - sb.length;
}

/**
 * Do two tasks' write sets conflict? `null` (omitted) means the whole workspace; `[]` (dynamic)
 * leases nothing up front and so conflicts with nothing. Paths are normalized and glob-reduced
 * as by `leaseKeys`.
 *
 * @example
 * writeSetsConflict(['src/a.ts'], ['src/b.ts']); // false
 * writeSetsConflict(null, ['docs']);             // true
 * writeSetsConflict([], null);                   // false
 */
export function writeSetsConflict(a: readonly string[] | null, b: readonly string[] | null): boolean {
  const ka = a === null ? [WHOLE_WORKSPACE_KEY] : leaseKeys(a);
  const kb = b === null ? [WHOLE_WORKSPACE_KEY] : leaseKeys(b);
  return ka.some((x) => kb.some((y) => keysOverlap(x, y)));
}

/**
 * How a lease key is stored (`path_leases.lease_key`): `/` + key + `/`, and `/` for the whole
 * workspace. With keys compared bytewise, a key's ancestors are found by equality
 * (`storedPathAncestorKeys`) and its descendants by one range (`storedPathDescendantRange`); since `/`
 * is one byte in UTF-8 and every multi-byte sequence is ≥ 0x80, no other path sorts inside it.
 *
 * @example
 * encodePathLeaseKey('src/a.ts'); // '/src/a.ts/'
 * encodePathLeaseKey('');         // '/'
 */
export function encodePathLeaseKey(key: string): string {
  return key === WHOLE_WORKSPACE_KEY ? '/' : `/${key}/`;
}

/** The inverse of `encodePathLeaseKey`. */
export function decodePathLeaseKey(stored: string): string {
  return stored.length <= 1 ? WHOLE_WORKSPACE_KEY : stored.slice(1, -1);
}

/**
 * The stored keys of a key's proper ancestors, the whole workspace first.
 *
 * @example
 * storedPathAncestorKeys('src/lib/a.ts'); // ['/', '/src/', '/src/lib/']
 */
export function storedPathAncestorKeys(key: string): string[] {
  if (key === WHOLE_WORKSPACE_KEY) return [];
  const segments = key.split('/');
  const out = ['/'];
  for (let i = 1; i < segments.length; i++) out.push(`/${segments.slice(0, i).join('/')}/`);
  return out;
}

/**
 * The half-open bytewise range `[from, to)` of stored keys that are the key itself or its
 * descendants: `to` is `from` with its final `/` (0x2F) replaced by `0` (0x30).
 *
 * @example
 * storedPathDescendantRange('src'); // { from: '/src/', to: '/src0' }
 * storedPathDescendantRange('');    // { from: '/', to: '0' }
 */
export function storedPathDescendantRange(key: string): { from: string; to: string } {
  const from = encodePathLeaseKey(key);
  return { from, to: `${from.slice(0, -1)}0` };
}
