/**
 * How big each backfill batch is. A batch holds its rows' locks (PostgreSQL) or the one write
 * lock (SQLite) until it commits, so a writer of the running release that needs one of them waits
 * as long as the batch takes: the batch's duration is the deploy's stall. With `batchTimeMs` the
 * size adapts to the time the last batch took, between `FIRST_ADAPTIVE_BATCH` rows and `batchSize`
 * (at most doubling per batch), so each batch takes about `batchTimeMs` whatever the rows cost.
 * Without it (0), every batch takes `batchSize` rows.
 */
export interface BatchSizing {
  /** The most rows a batch takes. */
  readonly batchSize: number;
  /** The time a batch should take, in ms; 0: a fixed `batchSize`. */
  readonly batchTimeMs: number;
}

/** Rows per backfill batch at most, unless `batchSize` says otherwise. */
export const DEFAULT_BATCH_SIZE = 5_000;
/** What an adaptive batch aims to take, in ms, unless `batchTimeMs` says otherwise. */
export const DEFAULT_BATCH_TIME_MS = 100;
/**
 * The first adaptive batch's size, and the smallest: a batch also pays a fixed cost (the lock, its
 * round trips) that does not shrink with it, and on a loaded machine smaller batches would only
 * multiply that cost without shortening the stall.
 */
export const FIRST_ADAPTIVE_BATCH = 500;

/** The first batch's size (what `plan` shows). */
export function firstBatchSize(sizing: BatchSizing): number {
  return sizing.batchTimeMs > 0 ? Math.min(sizing.batchSize, FIRST_ADAPTIVE_BATCH) : sizing.batchSize;
}

/** The next batch's size, after a batch of `size` rows took `tookMs`. */
export function nextBatchSize(sizing: BatchSizing, size: number, tookMs: number): number {
  if (sizing.batchTimeMs <= 0) return sizing.batchSize;
  const scaled = Math.floor(size * Math.min(2, sizing.batchTimeMs / Math.max(tookMs, 1)));
  return Math.max(Math.min(FIRST_ADAPTIVE_BATCH, sizing.batchSize), Math.min(sizing.batchSize, scaled));
}

/** What `plan` says about a backfill's batches. */
export function describeBatches(sizing: BatchSizing): string {
  return sizing.batchTimeMs > 0
    ? `in batches sized to take about ${sizing.batchTimeMs} ms each (${firstBatchSize(sizing)} rows first, at most ${sizing.batchSize})`
    : `in batches of ${sizing.batchSize} rows`;
}
