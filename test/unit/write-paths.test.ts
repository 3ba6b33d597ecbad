import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import {
  InvalidWritePathError,
  keysOverlap,
  leaseKeys,
  normalizeWritePath,
  writeSetsConflict,
} from '../../src/index.js';
import {
  decodePathLeaseKey,
  encodePathLeaseKey,
  storedPathAncestorKeys,
  storedPathDescendantRange,
} from '../../src/domain/write-paths.js';

const RUNS = { numRuns: 500 };

/** A path segment: plain names, names with `.`/`-`/`%`/`_`, and Unicode (no globs, no `.`/`..`). */
const segment = fc
  .oneof(
    fc.constantFrom(
      'src',
      'srcx',
      'sr',
      'a',
      'b',
      'a-b',
      'a.b',
      'lib',
      '100%',
      'x_y',
      'données',
      'é',
      'e\u0301',
      '日本',
      '🙂',
      '.env',
      '...',
    ),
    fc.stringMatching(/^[a-z0-9._%-]{1,6}$/),
  )
  .filter((s) => s !== '.' && s !== '..');
/** A normalized, glob-free path (a lease key other than the whole workspace). */
const key = fc.array(segment, { minLength: 1, maxLength: 4 }).map((segments) => normalizeWritePath(segments.join('/')));
const keyOrWhole = fc.oneof({ weight: 1, arbitrary: fc.constant('') }, { weight: 6, arbitrary: key });
/** Raw strings that look like paths, including junk separators, `.`, `..` and globs. */
const rawPath = fc
  .array(fc.oneof(segment, fc.constantFrom('', '.', '..', '*', '**', '*.ts', '[ab]', '{x,y}')), { maxLength: 6 })
  .chain((segments) => fc.tuple(fc.constant(segments), fc.constantFrom('/', '\\', '//')))
  .map(([segments, sep]) => segments.join(sep));

/** Independent reference: whole-segment prefix containment. */
function referenceOverlap(a: string, b: string): boolean {
  const sa = a === '' ? [] : a.split('/');
  const sb = b === '' ? [] : b.split('/');
  const n = Math.min(sa.length, sb.length);
  for (let i = 0; i < n; i++) if (sa[i] !== sb[i]) return false;
  return true;
}

/** What the database decides for "does a lease stored under `held` block a request for `wanted`", compared bytewise like COLLATE "C" / BINARY. */
function storedPredicateOverlaps(wanted: string, held: string): boolean {
  const stored = Buffer.from(encodePathLeaseKey(held));
  if (storedPathAncestorKeys(wanted).some((a) => Buffer.from(a).equals(stored))) return true;
  const { from, to } = storedPathDescendantRange(wanted);
  return Buffer.compare(stored, Buffer.from(from)) >= 0 && Buffer.compare(stored, Buffer.from(to)) < 0;
}

function tryNormalize(p: string): string | null {
  try {
    return normalizeWritePath(p);
  } catch (error) {
    if (error instanceof InvalidWritePathError) return null;
    throw error;
  }
}

describe('normalizeWritePath', () => {
  it.each([
    ['./src//lib/../a.ts', 'src/a.ts'],
    ['src\\win\\b.ts', 'src/win/b.ts'],
    ['src/', 'src'],
    ['a/b/./c/', 'a/b/c'],
    ['.', ''],
    ['', ''],
    ['a/..', ''],
    ['100%/_x', '100%/_x'],
    ['données/e\u0301té.md', 'données/\u00e9té.md'],
    ['日本/🙂.txt', '日本/🙂.txt'],
  ])('normalizes %j to %j', (input, expected) => {
    expect(normalizeWritePath(input)).toBe(expected);
  });

  it.each([
    ['../x', 'escapes'],
    ['a/../../b', 'escapes'],
    ['..\\x', 'escapes'],
    ['src/../../etc/passwd', 'escapes'],
    ['/etc', 'absolute'],
    ['\\etc', 'absolute'],
    ['\\\\server\\share', 'absolute'],
    ['C:\\Windows', 'drive letter'],
    ['c:/x', 'drive letter'],
    ['a\u0000b', 'NUL'],
    ['a\nb', 'control character'],
    ['tab\there', 'control character'],
    ['del\u007f', 'control character'],
    ['c1\u0085', 'control character'],
    ['bad\ud800', 'surrogate'],
    ['a/'.repeat(400) + 'b'.repeat(300), 'longer than 1024 bytes'],
  ])('rejects %j with a typed error naming the path and the reason (%s)', (input, reason) => {
    let caught: unknown;
    try {
      normalizeWritePath(input);
    } catch (error) {
      caught = error;
    }
    expect(caught).toBeInstanceOf(InvalidWritePathError);
    const error = caught as InvalidWritePathError;
    expect(error.code).toBe('INVALID_WRITE_PATH');
    expect(error.path).toBe(input);
    expect(error.reason).toContain(reason);
    expect(error.message).toContain(JSON.stringify(input));
  });

  it('rejects non-strings', () => {
    expect(() => normalizeWritePath(42 as unknown as string)).toThrow(InvalidWritePathError);
  });

  it('is idempotent', () => {
    fc.assert(
      fc.property(fc.oneof(rawPath, fc.string(), fc.string({ unit: 'grapheme' })), (p) => {
        const once = tryNormalize(p);
        if (once !== null) expect(normalizeWritePath(once)).toBe(once);
      }),
      RUNS,
    );
  });

  it('produces canonical output: no leading, trailing or doubled slash, no backslash, no . or .. segment', () => {
    fc.assert(
      fc.property(rawPath, (p) => {
        const n = tryNormalize(p);
        if (n === null || n === '') return;
        expect(n.startsWith('/') || n.endsWith('/') || n.includes('//') || n.includes('\\')).toBe(false);
        expect(n.split('/').some((s) => s === '.' || s === '..')).toBe(false);
      }),
      RUNS,
    );
  });

  it('rejects exactly the paths whose .. climbs above the root', () => {
    fc.assert(
      fc.property(fc.array(fc.oneof(segment, fc.constant('..')), { maxLength: 6 }), (segments) => {
        let depth = 0;
        let escapes = false;
        for (const s of segments) {
          depth += s === '..' ? -1 : 1;
          if (depth < 0) escapes = true;
        }
        expect(tryNormalize(segments.join('/')) === null).toBe(escapes);
      }),
      RUNS,
    );
  });

  it('treats NFC and NFD spellings of a Unicode name as the same path', () => {
    fc.assert(
      fc.property(fc.string({ unit: 'grapheme', minLength: 1, maxLength: 8 }), (name) => {
        const nfc = tryNormalize(`dir/${name.normalize('NFC')}`);
        const nfd = tryNormalize(`dir/${name.normalize('NFD')}`);
        expect(nfd).toBe(nfc);
      }),
      RUNS,
    );
  });
});

describe('keysOverlap', () => {
  it.each([
    ['src', 'src/a.ts', true],
    ['src', 'src', true],
    ['src', 'srcx', false],
    ['src', 'sr', false],
    ['src/a', 'src/a-b', false],
    ['', 'anything/at/all', true],
    ['', '', true],
    ['docs', 'src', false],
  ])('keysOverlap(%j, %j) is %s', (a, b, expected) => {
    expect(keysOverlap(a, b)).toBe(expected);
    expect(keysOverlap(b, a)).toBe(expected);
  });

  it('is symmetric and agrees with whole-segment prefix containment', () => {
    fc.assert(
      fc.property(keyOrWhole, keyOrWhole, (a, b) => {
        expect(keysOverlap(a, b)).toBe(keysOverlap(b, a));
        expect(keysOverlap(a, b)).toBe(referenceOverlap(a, b));
      }),
      RUNS,
    );
  });

  it('is reflexive', () => {
    fc.assert(
      fc.property(keyOrWhole, (a) => {
        expect(keysOverlap(a, a)).toBe(true);
      }),
      RUNS,
    );
  });

  it('makes a key overlap every descendant, and the whole workspace overlap everything', () => {
    fc.assert(
      fc.property(keyOrWhole, key, (a, rest) => {
        const descendant = a === '' ? rest : `${a}/${rest}`;
        expect(keysOverlap(a, descendant)).toBe(true);
        expect(keysOverlap('', descendant)).toBe(true);
      }),
      RUNS,
    );
  });

  it('never makes disjoint siblings overlap, even when one name is a prefix of the other', () => {
    fc.assert(
      fc.property(fc.constantFrom('', 'p', 'p/q'), segment, segment, key, key, (parent, x, y, tailX, tailY) => {
        fc.pre(x !== y);
        const base = parent === '' ? '' : `${parent}/`;
        expect(keysOverlap(`${base}${x}`, `${base}${y}`)).toBe(false);
        expect(keysOverlap(`${base}${x}/${tailX}`, `${base}${y}/${tailY}`)).toBe(false);
        expect(keysOverlap(`${base}${x}`, `${base}${x}x`)).toBe(false);
      }),
      RUNS,
    );
  });
});

describe('leaseKeys', () => {
  it('remembers write sets without confusing them: [] and [""] differ, a NUL is still refused, results are copies', () => {
    expect(leaseKeys([])).toEqual([]);
    expect(leaseKeys([''])).toEqual(['']);
    expect(leaseKeys([])).toEqual([]);
    expect(leaseKeys(['a', 'b'])).toEqual(['a', 'b']);
    expect(() => leaseKeys(['a\u0000b'])).toThrow(InvalidWritePathError);
    const first = leaseKeys(['src/x', 'docs']);
    first.push('mutated');
    expect(leaseKeys(['src/x', 'docs'])).toEqual(['docs', 'src/x']);
    expect(() => leaseKeys([42 as unknown as string])).toThrow(InvalidWritePathError);
  });

  it.each([
    [['src/**/*.ts'], ['src']],
    [['*.md'], ['']],
    [['src/a.ts', 'src/a.ts', './src/a.ts'], ['src/a.ts']],
    [['src/a.ts', 'src'], ['src']],
    [
      ['src/a.ts', 'srcx/b', 'src/b'],
      ['src/a.ts', 'src/b', 'srcx/b'],
    ],
    [
      ['docs/{a,b}.md', 'lib/[ab].ts', 'x/?.txt'],
      ['docs', 'lib', 'x'],
    ],
    [['.', 'src'], ['']],
    [[], []],
  ])('leaseKeys(%j) is %j', (paths, expected) => {
    expect(leaseKeys(paths)).toEqual(expected);
  });

  it('throws InvalidWritePathError for a bad path in the set', () => {
    expect(() => leaseKeys(['src', '../etc'])).toThrow(InvalidWritePathError);
  });

  it('returns an antichain that covers every input path, and is idempotent', () => {
    fc.assert(
      fc.property(fc.array(rawPath, { maxLength: 8 }), (raw) => {
        const paths = raw.filter((p) => tryNormalize(p) !== null);
        const keys = leaseKeys(paths);
        for (let i = 0; i < keys.length; i++) {
          for (let j = i + 1; j < keys.length; j++) expect(keysOverlap(keys[i]!, keys[j]!)).toBe(false);
        }
        for (const p of paths) {
          const n = normalizeWritePath(p);
          expect(keys.some((k) => referenceOverlap(k, n) && (k === '' || n === k || n.startsWith(`${k}/`)))).toBe(true);
        }
        expect(leaseKeys(keys)).toEqual(keys);
        expect(new Set(keys).size).toBe(keys.length);
      }),
      RUNS,
    );
  });
});

describe('writeSetsConflict', () => {
  it.each([
    [['src/a.ts'], ['src/b.ts'], false],
    [['src'], ['src/b.ts'], true],
    [null, ['docs'], true],
    [null, null, true],
    [[], null, false],
    [[], [], false],
    [['*.md'], ['lib/x'], true],
  ] as const)('writeSetsConflict(%j, %j) is %s', (a, b, expected) => {
    expect(writeSetsConflict(a, b)).toBe(expected);
    expect(writeSetsConflict(b, a)).toBe(expected);
  });

  it('is true exactly when some pair of paths overlaps', () => {
    fc.assert(
      fc.property(fc.array(keyOrWhole, { maxLength: 4 }), fc.array(keyOrWhole, { maxLength: 4 }), (a, b) => {
        const expected = a.some((x) => b.some((y) => referenceOverlap(x, y)));
        expect(writeSetsConflict(a, b)).toBe(expected);
      }),
      RUNS,
    );
  });
});

describe('stored key encoding', () => {
  it('round-trips', () => {
    fc.assert(
      fc.property(keyOrWhole, (k) => {
        expect(decodePathLeaseKey(encodePathLeaseKey(k))).toBe(k);
      }),
      RUNS,
    );
  });

  it('finds exactly the overlapping keys by ancestor equality plus one bytewise range', () => {
    fc.assert(
      fc.property(keyOrWhole, keyOrWhole, (wanted, held) => {
        expect(storedPredicateOverlaps(wanted, held)).toBe(referenceOverlap(wanted, held));
      }),
      { numRuns: 2000 },
    );
  });

  it('keeps names that sort right next to a key out of its range', () => {
    for (const [wanted, held] of [
      ['a', 'a-b'],
      ['a', 'a.b/c'],
      ['a', 'a0'],
      ['a', 'a\u00e9'],
      ['a/b', 'a/b!'],
    ]) {
      expect(storedPredicateOverlaps(wanted!, held!), `${wanted} vs ${held}`).toBe(false);
    }
  });
});
