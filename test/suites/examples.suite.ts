/**
 * examples/orchestrator and examples/cleanup-worker, run end to end on a fresh database and checked
 * by their outcome, so the examples cannot rot: a change to the public API or to a guarantee they
 * teach fails here.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCleanupDemo } from '../../examples/cleanup-worker/main.js';
import type { CleanupPassResult } from '../../examples/cleanup-worker/worker.js';
import { FLAKY, PLAN, runOrchestratorDemo } from '../../examples/orchestrator/main.js';
import type { DialectFixture } from '../support/fixtures.js';

export function defineExamplesSuite(makeFixture: () => DialectFixture) {
  describe('examples', () => {
    let fx: DialectFixture;
    beforeAll(() => {
      fx = makeFixture();
    });
    afterAll(async () => {
      await fx.cleanup();
    });

    it('orchestrator: terminals take the DAG in dependency and priority order, a failed task is retried, the inbox is drained', async () => {
      const report = await runOrchestratorDemo({ url: await fx.freshUrl(), log: () => {} });

      expect(report.run.status).toBe('completed');
      expect(report.tasks).toEqual(Object.fromEntries(PLAN.map((t) => [t.name, 'done'])));

      // One dispatch per task, plus the failed first attempt at FLAKY (retried, counted by the breaker).
      const failed = report.dispatches.filter((d) => d.status === 'failed');
      expect(failed.map((d) => [d.name, d.error])).toEqual([[FLAKY, 'flaky test run']]);
      expect(report.dispatches.filter((d) => d.status === 'completed')).toHaveLength(PLAN.length);
      expect(report.dispatches).toHaveLength(PLAN.length + 1);

      // Dependency order, as far as the report can show it: every dispatch was made after its
      // task's dependencies' completed dispatches were made (positions in the list, which is in
      // `seq` order: a seq is drawn when the claim inserts the row). That a dependent is claimed
      // only once its dependencies are *done* is raced in lifecycle-race.suite, where each claimer
      // reads the dependencies right after its claim. The report's times cannot show it: a call
      // reads its time when it starts, so a claim that waited to reach the server (a loaded
      // machine) can be stamped before a completion that committed while it waited (CI saw a
      // 48 ms inversion). See README, "Time is the database's".
      const doneIndex = new Map(
        report.dispatches.flatMap((d, i) => (d.status === 'completed' ? [[d.name, i] as const] : [])),
      );
      report.dispatches.forEach((d, i) => {
        for (const dep of PLAN.find((t) => t.name === d.name)!.dependsOn ?? [])
          expect(i, `${d.name} dispatched before ${dep}'s completed dispatch`).toBeGreaterThan(doneIndex.get(dep)!);
      });
      // Priority: the lower-priority root (`docs`, ready from the start) was dispatched only after
      // both higher-priority roots. Not "the first two dispatches were schema and design": on a
      // loaded machine one terminal can finish `schema` before the other's first claim, and then
      // `api` (priority 1, ready now) can be dispatched before `design` by the other terminal
      // (CI saw {schema, api}); that is priority order too.
      const first = (name: string) => report.dispatches.findIndex((d) => d.name === name);
      expect(first('docs')).toBeGreaterThan(first('schema'));
      expect(first('docs')).toBeGreaterThan(first('design'));

      // The inbox: every report received and acked once, nothing left.
      expect(report.reports.filter((r) => r.kind === 'task.done')).toHaveLength(PLAN.length);
      expect(report.reports.filter((r) => r.kind === 'task.failed').map((r) => r.payload)).toEqual([
        { name: FLAKY, error: 'flaky test run', taskStatus: 'ready' },
      ]);
      expect(report.pendingMessages).toBe(0);
    });

    it('orchestrator: a coordinator that dies between receive and ack gets the report again, and handles each once', async () => {
      const report = await runOrchestratorDemo({ url: await fx.freshUrl(), log: () => {}, crashBeforeAck: true });

      expect(report.run.status).toBe('completed');
      expect(report.tasks).toEqual(Object.fromEntries(PLAN.map((t) => [t.name, 'done'])));
      // The crash cut the handling of one report short, before its ack committed: it was handed
      // out again after its lease lapsed (a later attempt) and handled then. Nothing was lost.
      expect(report.crashed).not.toBeNull();
      const again = report.reports.find((r) => r.id === report.crashed!.id);
      expect(again, 'the report whose handling crashed was never handed out again').toBeDefined();
      expect(again!.attempt).toBeGreaterThan(report.crashed!.attempt);
      // Every report handled once: one per task done, one for the flaky failure.
      expect(new Set(report.reports.map((r) => r.id)).size).toBe(report.reports.length);
      expect(
        report.reports
          .filter((r) => r.kind === 'task.done')
          .map((r) => r.payload.name)
          .sort(),
      ).toEqual(PLAN.map((t) => t.name).sort());
      expect(report.reports.filter((r) => r.kind === 'task.failed')).toHaveLength(1);
      expect(report.pendingMessages).toBe(0);
    });

    it('cleanup worker: admits, claims, tears down and completes; a moved resource is never torn down', async () => {
      const report = await runCleanupDemo({ url: await fx.freshUrl(), log: () => {} });

      expect(report.readmittedIdempotently).toBe(true);
      expect(report.barrierRefusals).toEqual(['CLEANUP_BARRIER', 'CLEANUP_BARRIER']);
      expect(report.transferDuringClaim).toBe('CLEANUP_IN_PROGRESS');

      // main: claimed by the stalled worker A, finished by B after A's claim expired (attempt 2);
      // scratch: failed once (in use), completed on the retry; group: completed; handoff: stale.
      expect(report.snapshots).toEqual({
        main: { state: 'completed', attempts: 2 },
        scratch: { state: 'completed', attempts: 2 },
        group: { state: 'completed', attempts: 1 },
        handoff: { state: 'stale', attempts: 0 },
      });
      expect(report.directories).toEqual({ main: false, scratch: false, handoff: true });
      expect(report.handoff).toEqual({ ownerTaskId: report.followUpTaskId, generation: 2, status: 'active' });
      expect(report.groupStatus).toBe('removed');
      // Pass 1: group completed, scratch failed, handoff stale (main still claimed by worker A); the
      // later passes complete scratch and, once A's claim expired, main.
      const counts = (p: CleanupPassResult) => [p.completed.length, p.failed.length, p.stale.length, p.skipped.length];
      expect(counts(report.passes[0]!)).toEqual([1, 1, 1, 0]);
      const total = report.passes.map(counts).reduce((a, b) => a.map((n, i) => n + b[i]!));
      expect(total).toEqual([3, 1, 1, 0]);
      expect(report.stalledWorkerComplete).toBe('CLEANUP_ALREADY_COMPLETED');
      expect(report.pendingAfter).toBe(0);
    });
  });
}
