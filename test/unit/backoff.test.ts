import { describe, expect, it } from 'vitest';
import { Backoff, jittered } from '../../src/dialects/backoff.js';

describe('jittered backoff', () => {
  it('draws each delay from [0.5, 1.5) of the step and doubles the step up to the maximum', () => {
    const low = new Backoff(2, 10, () => 0);
    expect([1, 2, 3, 4, 5].map(() => low.next())).toEqual([1, 2, 4, 5, 5]);
    const high = new Backoff(2, 10, () => 0.999);
    const delays = [1, 2, 3, 4].map(() => high.next());
    expect(delays.map((d) => Math.round(d))).toEqual([3, 6, 12, 15]);
    for (const [i, step] of [2, 4, 8, 10].entries()) expect(delays[i]).toBeLessThan(step * 1.5);
  });

  it('caps a delay at capMs (the time left before a deadline) without shrinking later steps', () => {
    const backoff = new Backoff(8, 100, () => 0.5);
    expect(backoff.next(3)).toBe(3);
    expect(backoff.stepMs).toBe(16);
    expect(backoff.next(-5)).toBe(0);
    expect(backoff.next()).toBe(32);
  });

  it('starts over after reset()', () => {
    const backoff = new Backoff(50, 5_000, () => 0.5);
    backoff.next();
    backoff.next();
    expect(backoff.stepMs).toBe(200);
    backoff.reset();
    expect(backoff.next()).toBe(50);
  });

  it('stays within [0.5, 1.5) of the step with the real random source', () => {
    for (let i = 0; i < 1_000; i++) {
      const d = jittered(10);
      expect(d).toBeGreaterThanOrEqual(5);
      expect(d).toBeLessThan(15);
    }
  });

  it('refuses steps that cannot back off', () => {
    expect(() => new Backoff(0, 10)).toThrow(RangeError);
    expect(() => new Backoff(10, 5)).toThrow(RangeError);
  });
});
