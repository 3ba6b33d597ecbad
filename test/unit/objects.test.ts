/**
 * `extend` is what the hot paths copy records with instead of `{ ...base, key }` (src/objects.ts):
 * it must copy exactly as that spread does.
 */
import { describe, expect, it } from 'vitest';
import { extend } from '../../src/objects.js';

describe('extend', () => {
  it('copies base with extra set, as a spread does, and leaves both untouched', () => {
    const base = Object.freeze({ a: 1, b: 2 });
    const extra = { b: 3, c: 4 };
    const copy = extend(base, extra);
    expect(copy).toEqual({ ...base, ...extra });
    expect(Object.keys(copy)).toEqual(['a', 'b', 'c']);
    expect(Object.isFrozen(copy)).toBe(false);
    expect(base).toEqual({ a: 1, b: 2 });
    expect(extra).toEqual({ b: 3, c: 4 });
  });

  it('keeps an own __proto__ key of a parsed input as a key, not a prototype', () => {
    const input = JSON.parse('{"__proto__": {"polluted": true}, "kind": "x"}') as object;
    const copy = extend(input, { traceContext: null });
    const spread = { ...input, traceContext: null };
    expect(Object.getPrototypeOf(copy)).toBe(Object.prototype);
    expect((copy as { polluted?: unknown }).polluted).toBeUndefined();
    expect(Object.getOwnPropertyNames(copy)).toEqual(Object.getOwnPropertyNames(spread));
  });

  it('keeps an own __proto__ key of a parsed extra as a key, not a prototype', () => {
    const extra = JSON.parse('{"__proto__": {"polluted": true}, "kind": "x"}') as object;
    const copy = extend({ id: 't1' }, extra);
    const spread = { id: 't1', ...extra };
    expect(Object.getPrototypeOf(copy)).toBe(Object.prototype);
    expect((copy as { polluted?: unknown }).polluted).toBeUndefined();
    expect(Object.getOwnPropertyNames(copy)).toEqual(Object.getOwnPropertyNames(spread));
  });
});
