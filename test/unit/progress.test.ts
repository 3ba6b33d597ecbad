import { describe, expect, it } from 'vitest';
import { ProgressRenderer } from '../../src/cli.js';

describe('the CLI progress renderer', () => {
  const event = (done: number, total?: number) => ({
    type: 'progress' as const,
    version: 52,
    message: `backfilled ${done}`,
    done,
    ...(total !== undefined ? { total } : {}),
  });

  it('on a terminal redraws one line with a bar, percent, rows/s and ETA, and ends it with a newline', () => {
    let now = 0;
    let text = '';
    const r = new ProgressRenderer(
      (t) => (text += t),
      true,
      2_000,
      () => now,
    );
    r.start();
    now = 1_000;
    r.update(event(50_000, 200_000));
    now = 2_000;
    r.update(event(100_000, 200_000));
    r.finish();
    expect(text).toBe(
      '\r\x1b[2K  0052 [######------------------]  25% 50000/200000 rows, 50000 rows/s, ETA 3 s' +
        '\r\x1b[2K  0052 [############------------]  50% 100000/200000 rows, 50000 rows/s, ETA 2 s\n',
    );
  });

  it('without a terminal prints a plain line at most every few seconds, and messages without counts as they come', () => {
    let now = 0;
    const lines: string[] = [];
    const r = new ProgressRenderer(
      (t) => lines.push(t),
      false,
      2_000,
      () => now,
    );
    r.start();
    now = 1_000;
    r.update(event(10_000, 40_000));
    now = 1_500;
    r.update(event(20_000, 40_000)); // within 2 s of the last line: not printed
    now = 3_500;
    r.update(event(30_000));
    r.update({ type: 'progress', version: 52, message: '0052: backfill complete' });
    expect(lines).toEqual([
      '  0052 backfill: 25%, 10000/40000 rows, 10000 rows/s, ETA 3 s\n',
      '  0052 backfill: 30000 rows, 8571 rows/s\n',
      '  0052: backfill complete\n',
    ]);
  });
});
