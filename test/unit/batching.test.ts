import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { describeBatches, firstBatchSize, nextBatchSize } from '../../src/migrator/batching.js';

describe('backfill batch sizing', () => {
  const adaptive = { batchSize: 5_000, batchTimeMs: 100 };
  const fixed = { batchSize: 5_000, batchTimeMs: 0 };

  it('a fixed size never changes; an adaptive one starts at 500 rows', () => {
    expect(firstBatchSize(fixed)).toBe(5_000);
    expect(nextBatchSize(fixed, 5_000, 10_000)).toBe(5_000);
    expect(firstBatchSize(adaptive)).toBe(500);
    expect(firstBatchSize({ batchSize: 20, batchTimeMs: 100 })).toBe(20);
  });

  it('follows the time the last batch took: shrinks after a slow batch, at most doubles after a fast one', () => {
    expect(nextBatchSize(adaptive, 2_000, 200)).toBe(1_000);
    expect(nextBatchSize(adaptive, 1_000, 400)).toBe(500);
    expect(nextBatchSize(adaptive, 1_000, 100)).toBe(1_000);
    expect(nextBatchSize(adaptive, 1_000, 5)).toBe(2_000);
    expect(nextBatchSize(adaptive, 4_000, 5)).toBe(5_000);
    expect(nextBatchSize(adaptive, 600, 60_000)).toBe(500);
    expect(nextBatchSize({ batchSize: 20, batchTimeMs: 100 }, 20, 60_000)).toBe(20);
  });

  it('stays within [min(500, batchSize), batchSize] for any timing', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 100_000 }),
        fc.integer({ min: 1, max: 10_000 }),
        fc.integer({ min: 1, max: 100_000 }),
        fc.double({ min: 0, max: 1e6, noNaN: true }),
        (batchSize, batchTimeMs, size, tookMs) => {
          const next = nextBatchSize({ batchSize, batchTimeMs }, Math.min(size, batchSize), tookMs);
          expect(Number.isSafeInteger(next)).toBe(true);
          expect(next).toBeGreaterThanOrEqual(Math.min(500, batchSize));
          expect(next).toBeLessThanOrEqual(batchSize);
          expect(next).toBeLessThanOrEqual(Math.max(Math.min(500, batchSize), 2 * Math.min(size, batchSize)));
        },
      ),
    );
  });

  it('plan describes either form', () => {
    expect(describeBatches(adaptive)).toBe('in batches sized to take about 100 ms each (500 rows first, at most 5000)');
    expect(describeBatches(fixed)).toBe('in batches of 5000 rows');
  });
});
