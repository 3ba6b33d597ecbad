/**
 * examples/orchestrator and examples/cleanup-worker, run end to end on a fresh database and checked
 * by their outcome, so the examples cannot rot: a change to the public API or to a guarantee they
 * teach fails here.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCleanupDemo } from '../../examples/cleanup-worker/main.js';
import type { CleanupPassResult } from '../../examples/cleanup-worker/worker.js';
import { runOrchestratorDemo } from '../../examples/orchestrator/main.js';
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

    it('orchestrator: reconciles the crashed run, dispatches under leases and locks, retries the crashed task, fences the late report', async () => {
      const lines: string[] = [];
      const report = await runOrchestratorDemo({ url: await fx.freshUrl(), log: (line) => lines.push(line) });

      // Run start: the crashed predecessor was reconciled (failed) and its tasks adopted.
      expect(report.reconciledRunIds).toEqual([report.crashedRun.id]);
      expect(report.crashedRun.status).toBe('failed');
      expect(report.adoptedTaskCount).toBe(3);
      expect(report.run.status).toBe('completed');
      expect(report.run.targetKey).toBe(report.targetKey);
      expect(report.targetKey).toMatch(/^worktree:acme-main-/);

      // Every task done; four dispatches: three completed, one failed (the crash), none left active.
      expect(report.tasks).toEqual({
        'Fix the login bug': 'done',
        'Add a changelog entry': 'done',
        'Draft the release notes': 'done',
      });
      expect(report.dispatches).toEqual({ active: 0, completed: 3, failed: 1, cancelled: 0 });
      expect(report.stats.delivered).toEqual({ 'task.done': 3, 'terminal.exited': 1 });
      expect(report.pendingMessages).toBe(0);

      // Fencing: the crashed task was dispatched twice, the second time with a higher task-lease
      // token; the repo's workspace lock was granted three times with increasing tokens; the cognitive
      // task took no workspace lock; the two coding tasks met a busy workspace at least once.
      const crashed = report.stats.dispatched.filter((d) => d.taskId === report.crashedTaskId);
      expect(crashed).toHaveLength(2);
      expect(crashed[1]!.taskLeaseToken).toBeGreaterThan(crashed[0]!.taskLeaseToken);
      const lockTokens = report.stats.dispatched.flatMap((d) =>
        d.workspaceLockToken === null ? [] : [d.workspaceLockToken],
      );
      expect(lockTokens).toHaveLength(3);
      expect([...lockTokens].sort((a, b) => a - b)).toEqual(lockTokens);
      expect(new Set(lockTokens).size).toBe(3);
      expect(report.stats.dispatched.filter((d) => d.workspaceLockToken === null)).toHaveLength(1);
      expect(report.stats.workspaceBusy).toBeGreaterThan(0);

      // The crashed worker's late report was refused by its stale task-lease token.
      expect(report.zombieReport).toBe('STALE_TASK_LEASE');
      expect(lines.some((l) => l.includes('STALE_TASK_LEASE'))).toBe(true);
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
