/** Latency samples in milliseconds → the figures the report shows. */
export interface Figures {
  readonly opsPerSec: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  readonly samples: number;
}

export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return NaN;
  const index = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[index]!;
}

export function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

/** Runs `op` `iterations` times after `warmup` runs, one at a time, and reports throughput and latency. */
export async function measure(
  op: (i: number) => unknown,
  iterations: number,
  warmup = Math.ceil(iterations / 10),
): Promise<Figures> {
  for (let i = 0; i < warmup; i++) await op(-1 - i);
  const latencies: number[] = new Array(iterations);
  const started = performance.now();
  for (let i = 0; i < iterations; i++) {
    const t0 = performance.now();
    await op(i);
    latencies[i] = performance.now() - t0;
  }
  const elapsed = performance.now() - started;
  latencies.sort((a, b) => a - b);
  return {
    opsPerSec: (iterations / elapsed) * 1000,
    p50Ms: percentile(latencies, 50),
    p99Ms: percentile(latencies, 99),
    samples: iterations,
  };
}

/** The median (by throughput) of several runs of `measure`, so one noisy run does not decide. */
export async function medianOf(runs: number, once: () => Promise<Figures>): Promise<Figures> {
  const all: Figures[] = [];
  for (let r = 0; r < runs; r++) all.push(await once());
  all.sort((a, b) => a.opsPerSec - b.opsPerSec);
  return all[Math.floor(all.length / 2)]!;
}

export const round = (x: number, digits = 2) => Number(x.toFixed(digits));
