/**
 * Jittered exponential backoff, for every retry loop: write transactions (`retryTransient`), the
 * PostgreSQL migration lock's try-lock poll and the LISTEN connection's reconnects.
 *
 * Each delay is the current step times a random factor in [0.5, 1.5), so processes that failed
 * together do not retry in lockstep; after each delay the step doubles, up to `maxMs`.
 *
 * @example
 * const backoff = new Backoff(2, 100);
 * await new Promise((resolve) => setTimeout(resolve, backoff.next()));
 */
export class Backoff {
  #stepMs: number;

  /**
   * @param initialMs The first step (and the step after `reset()`), in ms; positive.
   * @param maxMs The largest step, in ms; at least `initialMs`.
   * @param random Source of the jitter factor in [0, 1) (default `Math.random`); tests pin it.
   */
  constructor(
    readonly initialMs: number,
    readonly maxMs: number,
    private readonly random: () => number = Math.random,
  ) {
    if (!(initialMs > 0) || !(maxMs >= initialMs))
      throw new RangeError(`Backoff needs 0 < initialMs <= maxMs (got ${initialMs} and ${maxMs}).`);
    this.#stepMs = initialMs;
  }

  /** The step the next delay is drawn around, in ms. */
  get stepMs(): number {
    return this.#stepMs;
  }

  /**
   * The next delay in ms: the current step, capped at `capMs` (e.g. the time left before a
   * deadline), times a jitter factor in [0.5, 1.5). Then the step doubles, up to `maxMs`.
   */
  next(capMs = Infinity): number {
    const delay = jittered(Math.max(0, Math.min(this.#stepMs, capMs)), this.random);
    this.#stepMs = Math.min(this.#stepMs * 2, this.maxMs);
    return delay;
  }

  /** Back to `initialMs`, after a success. */
  reset(): void {
    this.#stepMs = this.initialMs;
  }
}

/** `ms` times a random factor in [0.5, 1.5): on average `ms`, never less than half of it. */
export function jittered(ms: number, random: () => number = Math.random): number {
  return ms * (0.5 + random());
}
