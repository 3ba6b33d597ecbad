/**
 * The claim-next race (issue 22): real processes call `dispatchNext` over a DAG of 500 tasks with
 * random dependencies and priorities while completing, failing (exit reports) and abandoning
 * their dispatches (leases lapse and are reclaimed). Checked:
 * - every task is held by at most one live worker at a time (a host row per held task);
 * - no task is dispatched before all of its dependencies are done (checked by the claimer right
 *   after its claim: a dependency that is not done then was not done at claim time either);
 * - every task ends `done`, `failed` (the breaker) or `blocked` with its reason, nothing is left
 *   in flight or with an active dispatch, and every late completion with an abandoned lease was
 *   refused;
 * - the priority invariant, on a static pool (nothing becomes ready during the drain): number
 *   the claims by dispatch `seq`. A claim of priority p may be followed by a claim of a higher
 *   priority only when that task was row-locked by another claimer at the time, so for every
 *   claim, the later claims of strictly higher priority number at most (claimers − 1); SQLite's
 *   serialized writers make it 0;
 * - the priority invariant under concurrent complete, fail and reclaim, in the DAG drain (see
 *   `priorityViolations`): no claim takes a task while one of higher priority was ready from
 *   before the claim until after it, judged from the dispatch rows;
 * - one terminal's dispatches never overlap: a worker replacing an abandoning one reuses its
 *   terminal, and afterwards, in seq order per terminal, each dispatch ended before the next began;
 * - `dispatchRun` never leases a task after it stopped being runnable: one process blocks, gates
 *   or completes a task while the others claim and release its task lease in a loop.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Dispatch, Store } from '../../src/index.js';
import type { DialectFixture } from '../support/fixtures.js';
import { Contenders } from '../support/race.js';
import { tbl } from '../support/schema.js';
import { sql } from 'kysely';
import { ops as OPS } from './lifecycle-race.ops.js';

const TASKS = 500;
/**
 * The priority check's slack (`priorityViolations`): 0 on SQLite, where the check is strict. On
 * PostgreSQL, a bound on a transaction's clock read to its commit (or a claimer's pick to its
 * clock read) on a loaded 2-core machine: 500 ms was exceeded there (560 and 640 ms, both race
 * files at once), so the bound is 2 s.
 */
const PRIORITY_SLACK_MS = { sqlite: 0, postgres: 2_000 } as const;

/**
 * The priority invariant under concurrent complete, fail and reclaim, judged after the drain from
 * the run's dispatch rows (in seq order per task) and the DAG:
 * - a task is ready from its creation (no dependencies) or from its last dependency's completion
 *   (that dispatch's `endedAt`) until its next dispatch's `createdAt`, and again from a failed
 *   dispatch's `endedAt` (an exit or a reclaim, below the breaker's third failure);
 * - a claim (dispatch) of priority p at time t violates it if a task of higher priority was ready
 *   from before `t − slack` until after `t + slack`.
 *
 * On SQLite the slack is 0 and the check is strict: writers are serialized and each reads its
 * clock inside the write lock, so "ready from before t until after t" means committed ready before
 * the claim's transaction and still undispatched after it. On PostgreSQL a strict check is not
 * possible from outside: a transaction reads its clock some time before it commits, a claim does
 * not see a task made ready by a commit after its snapshot, and `SKIP LOCKED` rightly passes over a
 * task another claimer has locked but whose dispatch's `createdAt` is read a little later. The
 * slack bounds those gaps (clock read to commit, pick to clock read), so PostgreSQL asserts the
 * weaker form: no task is passed over while it was ready and unclaimed for the whole of the
 * window around the claim.
 */
function priorityViolations(
  dispatches: readonly Dispatch[],
  tasks: readonly { id: string; priority: number; createdAt: number }[],
  deps: ReadonlyMap<string, readonly string[]>,
  slackMs: number,
): string[] {
  const byTask = new Map<string, Dispatch[]>();
  for (const d of dispatches) byTask.set(d.taskId, [...(byTask.get(d.taskId) ?? []), d]);
  const doneAt = new Map<string, number>();
  for (const d of dispatches) if (d.status === 'completed') doneAt.set(d.taskId, d.endedAt!);
  const ready = new Map<string, [number, number][]>();
  for (const t of tasks) {
    const on = deps.get(t.id) ?? [];
    let since: number | null =
      on.length === 0
        ? t.createdAt
        : on.every((x) => doneAt.has(x))
          ? Math.max(...on.map((x) => doneAt.get(x)!))
          : null;
    const spans: [number, number][] = [];
    let failures = 0;
    for (const d of byTask.get(t.id) ?? []) {
      if (since !== null) spans.push([since, d.createdAt]);
      since = d.status === 'failed' && ++failures < 3 ? d.endedAt! : null;
    }
    if (since !== null) spans.push([since, Infinity]);
    ready.set(t.id, spans);
  }
  const priority = new Map(tasks.map((t) => [t.id, t.priority]));
  const out: string[] = [];
  for (const claim of dispatches) {
    const p = priority.get(claim.taskId)!;
    const at = claim.createdAt;
    for (const t of tasks)
      if (t.priority > p && ready.get(t.id)!.some(([from, to]) => from < at - slackMs && to > at + slackMs))
        out.push(
          `claim ${claim.seq} took priority ${p} at ${at} while task ${t.id} of priority ${t.priority} was ready (${JSON.stringify(ready.get(t.id))})`,
        );
  }
  return out;
}
const POOL = 200;

/**
 * The priority check of a static pool: claims in `seq` order, and for each the number of later
 * claims of strictly higher priority; the largest such count.
 */
function mostOutranked(claims: readonly { taskId: string }[], priority: ReadonlyMap<string, number>): number {
  let worst = 0;
  claims.forEach((c, i) => {
    const p = priority.get(c.taskId)!;
    worst = Math.max(worst, claims.slice(i + 1).filter((later) => priority.get(later.taskId)! > p).length);
  });
  return worst;
}

/** A seeded generator, so a failure can be replayed (the seed is printed). */
function generator(seed: number) {
  let s = seed;
  return () => {
    s = (s * 1_103_515_245 + 12_345) % 2_147_483_648;
    return s / 2_147_483_648;
  };
}

export function defineLifecycleRaceSuite(makeFixture: () => DialectFixture, processes: number, loops: number) {
  let fx: DialectFixture;
  let store: Store;
  let contenders: Contenders<typeof OPS>;
  let company: string;

  beforeAll(async () => {
    fx = makeFixture();
    const url = await fx.freshUrl();
    store = await fx.open(url);
    await store.migrate();
    await sql`create table ${tbl(store.db, 'lc_holding')} (task_id text primary key, worker text not null)`.execute(
      store.db,
    );
    company = (await store.org.createCompany({ name: 'acme' })).id;
    contenders = await Contenders.start(processes, { url, ops: OPS, storeOptions: { poolSize: loops + 1 } });
  }, 600_000);
  afterAll(async () => {
    await contenders?.close();
    await fx.cleanup();
  }, 120_000);

  describe(`${processes} processes × ${loops} claimers on one ready queue`, () => {
    it(`drains a DAG of ${TASKS} tasks: one live holder per task, dependencies first, every task ends with a reason`, async () => {
      const seed = Number(process.env.LIFECYCLE_SEED ?? Date.now() % 1_000_000);
      const random = generator(seed);
      const targetKey = `worktree:dag-${seed}`;
      const run = await store.runs.startCoordinatorRun({ targetKey });
      const ids: string[] = [];
      const deps = new Map<string, string[]>();
      await store.transaction(async (tx) => {
        for (let i = 0; i < TASKS; i++) {
          const dependsOn = new Set<string>();
          const count = Math.floor(random() * 4);
          if (i > 0)
            for (let j = 0; j < count; j++) dependsOn.add(ids[i - 1 - Math.floor(random() * Math.min(40, i))]!);
          const t = await tx.tasks.createTask({
            companyId: company,
            title: `t${i}`,
            targetKey,
            requiresFilesystem: false,
            status: 'ready',
            priority: Math.floor(random() * 10),
            dependsOn: [...dependsOn],
          });
          ids.push(t.id);
          deps.set(t.id, [...dependsOn]);
        }
      });
      const started = Date.now();
      const outcomes = await contenders.race('work', () => ({
        runId: run.id,
        loops,
        failRate: 0.25,
        abandonRate: 0.03,
        // Half the completions claim the terminal's next task in their transaction (`next`).
        chainRate: 0.5,
        seed,
      }));
      const reports = outcomes.flatMap((o) => {
        if (!o.ok) throw new Error(`contender ${o.index} (seed ${seed}): ${o.error.message}`);
        return o.value;
      });
      const elapsed = Date.now() - started;
      const violations = reports.flatMap((r) => r.violations);
      if (violations.length > 0) console.log(`[lifecycle race] seed ${seed} violations:\n${violations.join('\n')}`);
      expect(violations, `seed ${seed}`).toEqual([]);
      const total = (
        k: 'claims' | 'completed' | 'failed' | 'abandoned' | 'lateRefused' | 'terminalWaits' | 'chained',
      ) => reports.reduce((sum, r) => sum + r[k], 0);
      expect(total('lateRefused')).toBe(total('abandoned'));
      // Mutant "next-before-complete" (the function claims before it completes) claims nothing here.
      expect(total('chained')).toBeGreaterThan(0);

      const tasks = await store.tasks.listTasks({ runId: run.id });
      expect(tasks).toHaveLength(TASKS);
      const byId = new Map(tasks.map((t) => [t.id, t]));
      for (const t of tasks) {
        expect(['done', 'failed', 'blocked'], `${t.id} (seed ${seed})`).toContain(t.status);
        if (t.status === 'blocked') {
          expect(t.blockedReason).not.toBeNull();
          // Blocked for a reason that holds: some dependency is not done.
          expect(deps.get(t.id)!.some((d) => byId.get(d)!.status !== 'done')).toBe(true);
        }
        if (t.status === 'done') expect(deps.get(t.id)!.every((d) => byId.get(d)!.status === 'done')).toBe(true);
      }
      expect(await store.dispatches.listDispatches({ runId: run.id, status: 'active' })).toEqual([]);
      // One terminal's dispatches never overlap: in seq order, each ended before the next was made.
      const byTerminal = new Map<string, Dispatch[]>();
      for (const d of await store.dispatches.listDispatches({ runId: run.id }))
        byTerminal.set(d.terminalHandle, [...(byTerminal.get(d.terminalHandle) ?? []), d]);
      const overlaps: string[] = [];
      for (const [terminal, list] of byTerminal)
        list.forEach((d, i) => {
          const next = list[i + 1];
          // Stamped by each call's clock read, so on PostgreSQL within the priority check's slack
          // (a claim that waited is stamped before an end that committed first; CI saw 91 ms). The
          // claimers' own check (no other active dispatch on the terminal right after a claim)
          // judges the overlap without clocks.
          if (next !== undefined && (d.endedAt === null || d.endedAt > next.createdAt + PRIORITY_SLACK_MS[fx.kind]))
            overlaps.push(
              `${terminal}: dispatch ${d.seq} (ended ${d.endedAt}) overlaps ${next.seq} (made ${next.createdAt})`,
            );
        });
      expect(overlaps, `seed ${seed}`).toEqual([]);
      const outranked = priorityViolations(
        await store.dispatches.listDispatches({ runId: run.id }),
        tasks,
        deps,
        PRIORITY_SLACK_MS[fx.kind],
      );
      if (outranked.length > 0)
        console.log(`[lifecycle race] seed ${seed} priority:\n${outranked.slice(0, 20).join('\n')}`);
      expect(outranked.length, `seed ${seed}`).toBe(0);
      const failedTasks = tasks.filter((t) => t.status === 'failed');
      for (const t of failedTasks) {
        const failures = await store.dispatches.listDispatches({ taskId: t.id, status: 'failed' });
        expect(failures.length).toBeGreaterThanOrEqual(3);
      }
      console.log(
        `[lifecycle race] seed ${seed}: ${total('claims')} claims (${total('completed')} completed, ${total('failed')} failed, ` +
          `${total('abandoned')} abandoned and reclaimed, ${total('terminalWaits')} waits on a held terminal, ` +
          `${total('chained')} claimed by a completion with next) in ${elapsed} ms; tasks: ` +
          `${tasks.filter((t) => t.status === 'done').length} done, ${failedTasks.length} failed, ` +
          `${tasks.filter((t) => t.status === 'blocked').length} blocked`,
      );
    }, 300_000);

    it(`takes the highest priority first: a claim is outranked later only by tasks other claimers held`, async () => {
      const random = generator(42);
      const targetKey = `worktree:pool-${Date.now()}`;
      const run = await store.runs.startCoordinatorRun({ targetKey });
      const priority = new Map<string, number>();
      await store.transaction(async (tx) => {
        for (let i = 0; i < POOL; i++) {
          const t = await tx.tasks.createTask({
            companyId: company,
            title: `p${i}`,
            targetKey,
            requiresFilesystem: false,
            status: 'ready',
            priority: Math.floor(random() * 20),
          });
          priority.set(t.id, t.priority);
        }
      });
      const outcomes = await contenders.race('drain', () => ({ runId: run.id, loops }));
      const claims = outcomes
        .flatMap((o) => {
          if (!o.ok) throw new Error(`contender ${o.index}: ${o.error.message}`);
          return o.value;
        })
        .sort((a, b) => a.seq - b.seq);
      expect(claims).toHaveLength(POOL);
      expect(new Set(claims.map((c) => c.taskId)).size).toBe(POOL);
      const claimers = processes * loops;
      const bound = fx.kind === 'sqlite' ? 0 : claimers - 1;
      expect(mostOutranked(claims, priority)).toBeLessThanOrEqual(bound);
    }, 300_000);

    it(`dispatchNextBatch races as dispatchNext does: every task of the pool dispatched exactly once, in priority order`, async () => {
      const random = generator(7);
      const targetKey = `worktree:batch-pool-${Date.now()}`;
      const run = await store.runs.startCoordinatorRun({ targetKey });
      const priority = new Map<string, number>();
      const created = await store.tasks.createTasks(
        Array.from({ length: POOL }, (_, i) => ({
          companyId: company,
          title: `b${i}`,
          targetKey,
          requiresFilesystem: false,
          status: 'ready' as const,
          priority: Math.floor(random() * 20),
        })),
      );
      for (const t of created) priority.set(t.id, t.priority);
      const terminals = 3;
      const outcomes = await contenders.race('drainBatches', () => ({ runId: run.id, loops, terminals }));
      const claims = outcomes
        .flatMap((o) => {
          if (!o.ok) throw new Error(`contender ${o.index}: ${o.error.message}`);
          return o.value;
        })
        .sort((a, b) => a.seq - b.seq);
      // Exactly once: no task dispatched twice by two batches, none left behind.
      expect(claims).toHaveLength(POOL);
      expect(new Set(claims.map((c) => c.taskId)).size).toBe(POOL);
      expect(await store.dispatches.listDispatches({ runId: run.id, status: 'active' })).toEqual([]);
      expect((await store.tasks.listTasks({ runId: run.id })).every((t) => t.status === 'done')).toBe(true);
      // Priority: a batch takes the best ready tasks it can lock, so a claim is outranked later only
      // by tasks the other claimers' batches held (at most `terminals` each); SQLite: never.
      const bound = fx.kind === 'sqlite' ? 0 : (processes * loops - 1) * terminals;
      expect(mostOutranked(claims, priority)).toBeLessThanOrEqual(bound);
    }, 300_000);

    it('dependencies finishing at once: their dependent is ready once the last commits, every round', async () => {
      const targetKey = `worktree:fan-in-${Date.now()}`;
      await store.runs.startCoordinatorRun({ targetKey });
      const fanIn = Math.min(4, processes);
      const rounds = 40;
      const stuck: string[] = [];
      for (let round = 0; round < rounds; round++) {
        const task = (title: string, dependsOn: string[] = []) =>
          store.tasks.createTask({
            companyId: company,
            title,
            targetKey,
            requiresFilesystem: false,
            status: 'ready',
            dependsOn,
          });
        const deps = [];
        for (let i = 0; i < fanIn; i++) deps.push(await task(`f${round}-${i}`));
        const dependent = await task(
          `f${round}-join`,
          deps.map((d) => d.id),
        );
        expect(dependent.status).toBe('blocked');
        const dispatchIds: string[] = [];
        for (const d of deps)
          dispatchIds.push(
            (await store.dispatches.createDispatch({ taskId: d.id, terminalHandle: `fan-${round}-${d.id}` })).id,
          );
        const outcomes = await contenders.race(
          'completeOne',
          () => ({ dispatchIds }),
          dispatchIds.map((_, i) => i),
        );
        for (const o of outcomes)
          if (!o.ok) throw new Error(`round ${round}, contender ${o.index}: ${o.error.message}`);
        const after = await store.tasks.requireTask(dependent.id);
        if (after.status !== 'ready') stuck.push(`round ${round}: ${after.status} (${after.blockedReason})`);
      }
      // Mutant complete-fn-no-dependent-lock (the move without the dependents' lock): each
      // completion's move misses the others' commits, and the dependent stays blocked.
      expect(stuck).toEqual([]);
    }, 300_000);

    it('dispatchRun never leases a task after it stopped being runnable: blocked, gated or completed mid-race', async () => {
      const targetKey = `worktree:readiness-${Date.now()}`;
      await store.runs.startCoordinatorRun({ targetKey });
      const agent = await store.org.createAgent({ companyId: company, name: 'dev', role: 'engineer' });
      const ways = ['block', 'gate', 'complete'] as const;
      const violations: string[] = [];
      let grants = 0;
      for (let round = 0; round < 24; round++) {
        const task = await store.tasks.createTask({
          companyId: company,
          title: `r${round}`,
          targetKey,
          requiresFilesystem: false,
          status: 'ready',
        });
        const how = ways[round % ways.length]!;
        const outcomes = await contenders.race('readinessRound', (index) =>
          index === 0
            ? { role: 'blocker' as const, taskId: task.id, delayMs: 3 + ((round * 7) % 20), how }
            : { role: 'claimer' as const, taskId: task.id, agentId: agent.id, runPrefix: `r${round}` },
        );
        const failures = outcomes.flatMap((o) => (o.ok ? [] : [`contender ${o.index}: ${o.error.message}`]));
        if (failures.length > 0) throw new Error(`round ${round} (${how}): ${failures.join('; ')}`);
        const results = outcomes.map((o) => {
          if (!o.ok) throw new Error(`contender ${o.index}, round ${round}: ${o.error.message}`);
          return o.value;
        });
        const blockedAt = results[0]!.blockedAtToken!;
        for (const [i, r] of results.slice(1).entries()) {
          grants += r.granted.length;
          expect(r.refusedAs, `claimer ${i + 1}, round ${round}`).toBe(how === 'complete' ? 'done' : 'blocked');
          for (const token of r.granted)
            if (token > blockedAt)
              violations.push(`round ${round} (${how}): token ${token} granted after the change (at ${blockedAt})`);
        }
      }
      console.log(`[lifecycle race] dispatchRun readiness: ${grants} grants in 24 rounds`);
      expect(grants).toBeGreaterThan(0);
      expect(violations).toEqual([]);
    }, 300_000);

    it('a completion with next and dispatchNext race for one terminal: it passes straight to the next dispatch, claimers typed, nothing lost', async () => {
      const targetKey = `worktree:terminal-${Date.now()}`;
      const run = await store.runs.startCoordinatorRun({ targetKey });
      const rounds = 30;
      let collisions = 0;
      let busyWorkers = 0;
      for (let round = 0; round < rounds; round++) {
        for (let i = 0; i < processes + 1; i++)
          await store.tasks.createTask({
            companyId: company,
            title: `tr${round}-${i}`,
            targetKey,
            requiresFilesystem: false,
            status: 'ready',
          });
        const terminal = `tr-${round}`;
        const held = (await store.dispatches.dispatchNext({ runId: run.id, terminalHandle: terminal }))!;
        const outcomes = await contenders.race('terminalRound', (index) =>
          index === 0
            ? { role: 'worker' as const, dispatchId: held.id, lease: held.lease! }
            : { role: 'claimer' as const, runId: run.id, terminal },
        );
        const results = outcomes.map((o) => {
          if (!o.ok) throw new Error(`contender ${o.index}, round ${round}: ${o.error.message}`);
          return o.value;
        });
        const made = results.flatMap((r) => (r.made === null ? [] : [r.made]));
        const active = await store.dispatches.listDispatches({ runId: run.id, status: 'active' });
        expect(made.length, `round ${round}`).toBeLessThanOrEqual(1);
        expect(
          active.map((d) => d.id),
          `round ${round}`,
        ).toEqual(made);
        // Tasks were ready throughout: the terminal went from the worker's dispatch straight to
        // its next one, never free, so no claimer took it. Mutant "next-in-two-transactions"
        // (the completion commits, then the claim runs) leaves it free in between: a claimer wins.
        expect(results[0]!.made, `round ${round}`).not.toBeNull();
        // The worker's completion was never lost: refused busy with its dispatch untouched, then done.
        expect((await store.dispatches.getDispatch(held.id))?.status, `round ${round}`).toBe('completed');
        if (results[0]!.busy) {
          busyWorkers++;
          expect(results[0]!.stillActiveWhenBusy, `round ${round}`).toBe(true);
        }
        collisions += results.filter((r) => r.busy).length;
        for (const d of active) await store.dispatches.completeDispatch(d.id);
      }
      console.log(
        `[lifecycle race] terminal race: ${rounds} rounds; ${collisions} contenders met TerminalBusyError, ${busyWorkers} of them completions with next`,
      );
    }, 300_000);

    // Last: it kills a contender.
    it('a worker SIGKILLed while holding a dispatch: after the TTL its task is ready again, its late completion refused', async () => {
      const targetKey = `worktree:crash-${Date.now()}`;
      const run = await store.runs.startCoordinatorRun({ targetKey });
      const task = await store.tasks.createTask({
        companyId: company,
        title: 'crash',
        targetKey,
        requiresFilesystem: false,
        status: 'ready',
      });
      const victim = processes - 1;
      const hanging = contenders.start(victim, 'holdAndHang', { runId: run.id, ttlMs: 500 });
      await contenders.waitForSignal(victim, 'holding');
      const [held] = await store.dispatches.listDispatches({ taskId: task.id, status: 'active' });
      await contenders.kill(victim);
      await hanging.catch(() => undefined);
      expect(await store.dispatches.reclaimExpiredDispatches({ runId: run.id })).toEqual([]);
      await new Promise((resolve) => setTimeout(resolve, 600));
      const [reclaimed] = await store.dispatches.reclaimExpiredDispatches({ runId: run.id });
      expect(reclaimed).toMatchObject({ taskStatus: 'ready', dispatch: { id: held!.id, error: 'lease_expired' } });
      await expect(store.dispatches.completeDispatch(held!.id, { lease: held!.lease! })).rejects.toMatchObject({
        code: 'DISPATCH_LEASE_LOST',
        reason: 'expired',
      });
      expect((await store.tasks.requireTask(task.id)).status).toBe('ready');
    }, 120_000);
  });
}
