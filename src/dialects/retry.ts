import { WriteTimeoutError } from '../errors.js';
import { Backoff } from './backoff.js';
import type { DialectStats, ErrorKind } from './types.js';

/**
 * Retries `attempt` while `classify` says the failure is transient, with jittered exponential
 * backoff, until `deadlineMs` has passed. Shared by both dialects' write transactions.
 */
export async function retryTransient<T>(
  attempt: () => Promise<T>,
  classify: (error: unknown) => ErrorKind,
  retryable: ReadonlySet<ErrorKind>,
  deadlineMs: number,
  stats: DialectStats,
): Promise<T> {
  const started = Date.now();
  let attempts = 0;
  let backoff: Backoff | undefined; // made on the first retry: most transactions never need one
  for (;;) {
    attempts++;
    stats.transactions = (stats.transactions ?? 0) + 1;
    try {
      return await attempt();
    } catch (error) {
      const kind = classify(error);
      if (!retryable.has(kind)) throw error;
      const elapsed = Date.now() - started;
      // An unreachable database stays DATABASE_UNAVAILABLE; contention past the deadline is a write timeout.
      if (elapsed >= deadlineMs)
        throw kind === 'connection_lost' ? error : new WriteTimeoutError(deadlineMs, attempts, error);
      stats.retries++;
      const wait = (backoff ??= new Backoff(2, 100)).next(deadlineMs - elapsed);
      stats.onRetry?.(kind, attempts, wait);
      await new Promise((resolve) => setTimeout(resolve, wait));
    }
  }
}
