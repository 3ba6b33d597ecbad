/**
 * The round-trip budget (issue 24): every hot call sends at most its budget of statements, counted
 * with `onQuery` (a count, not a timing, so it is stable on a loaded machine). The README's
 * "Round trips per call" table lists the same figures; lower a budget when a call gets cheaper.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { DialectFixture } from '../support/fixtures.js';
import { HOT_CALLS, measureRoundTrips, statementCounter, type HotCall } from './round-trips.ops.js';

/** Statements per call, per dialect (PostgreSQL: round trips, BEGIN counted with its first statement). */
export const ROUND_TRIP_BUDGET: Record<HotCall, { readonly sqlite: number; readonly postgres: number }> = {
  startCoordinatorRun: { sqlite: 6, postgres: 3 },
  'createTask (with a target)': { sqlite: 5, postgres: 3 },
  dispatchNext: { sqlite: 7, postgres: 1 },
  heartbeatDispatch: { sqlite: 3, postgres: 3 },
  completeDispatch: { sqlite: 6, postgres: 1 },
  'completeDispatch (with next)': { sqlite: 12, postgres: 1 },
  'dispatchNextBatch (2 terminals)': { sqlite: 13, postgres: 1 },
  claimWorkspaceLock: { sqlite: 4, postgres: 1 },
  renewWorkspaceLock: { sqlite: 3, postgres: 3 },
  releaseWorkspaceLock: { sqlite: 3, postgres: 1 },
  claimTaskLease: { sqlite: 3, postgres: 3 },
  renewTaskLease: { sqlite: 3, postgres: 3 },
  releaseTaskLease: { sqlite: 3, postgres: 1 },
  'semaphores.acquire': { sqlite: 6, postgres: 3 },
  'semaphores.renew': { sqlite: 3, postgres: 3 },
  'semaphores.release': { sqlite: 3, postgres: 1 },
  'tryAcquirePaths (2 paths)': { sqlite: 7, postgres: 3 },
  renewPaths: { sqlite: 4, postgres: 3 },
  releasePaths: { sqlite: 3, postgres: 1 },
  'paths.claimTask': { sqlite: 11, postgres: 3 },
  sendMessage: { sqlite: 5, postgres: 3 },
  'receiveMessages (1)': { sqlite: 5, postgres: 2 },
  'ackMessages (1)': { sqlite: 3, postgres: 1 },
  'deliverPendingMessages (1)': { sqlite: 5, postgres: 2 },
  transferEnvironmentOwnership: { sqlite: 3, postgres: 3 },
};

export function defineRoundTripSuite(makeFixture: () => DialectFixture) {
  let fx: DialectFixture;
  let counts: Record<HotCall, number>;

  beforeAll(async () => {
    fx = makeFixture();
    const counter = statementCounter();
    const store = await fx.freshStore({ onQuery: counter.onQuery });
    counts = await measureRoundTrips(store, counter);
  }, 120_000);
  afterAll(() => fx.cleanup());

  describe('round trips per hot call', () => {
    it.each(HOT_CALLS)('%s stays within its budget', (call) => {
      expect(counts[call]).toBeGreaterThan(0);
      expect(counts[call]).toBeLessThanOrEqual(ROUND_TRIP_BUDGET[call][fx.kind]);
    });
  });
}
