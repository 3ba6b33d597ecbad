/**
 * Gates that gate, raced (issue 22): claimer processes drain a run's ready queue with
 * dispatchNext → completeDispatch while gater processes open a gate on every task, in another
 * order. Both calls take the task's dispatch key and read the clock under it, so each task's gate
 * and its completion are ordered, and the outcome must match that order: a task completed before
 * its gate opened is `done`; a gate opened first holds the task (`blocked`) or, if it was already
 * dispatched, refuses its completion (`GATE_OPEN`: the dispatch stays active). No task is
 * completed with a gate open on it.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { Store } from '../../src/index.js';
import type { DialectFixture } from '../support/fixtures.js';
import { Contenders } from '../support/race.js';
import { ops as OPS } from './gates-race.ops.js';

const TASKS = 120;

export function defineGatesRaceSuite(makeFixture: () => DialectFixture, claimers: number, gaters: number) {
  let fx: DialectFixture;
  let store: Store;
  let url: string;
  let contenders: Contenders<typeof OPS>;
  beforeAll(async () => {
    fx = makeFixture();
    url = await fx.freshUrl();
    store = await fx.open(url);
    await store.migrate();
    contenders = await Contenders.start(claimers + gaters, { url, ops: OPS, storeOptions: { poolSize: 2 } });
  }, 600_000);
  afterAll(async () => {
    await contenders?.close();
    await fx.cleanup();
  }, 120_000);

  it(`${claimers} claimers and ${gaters} gaters over ${TASKS} tasks: no task completes with a gate open on it`, async () => {
    const company = (await store.org.createCompany({ name: 'race' })).id;
    const targetKey = 'worktree:gates-race';
    const run = await store.runs.startCoordinatorRun({ targetKey });
    const ids: string[] = [];
    for (let i = 0; i < TASKS; i++)
      ids.push(
        (
          await store.tasks.createTask({
            companyId: company,
            title: `t${i}`,
            targetKey,
            requiresFilesystem: false,
            status: 'ready',
            priority: i % 3,
          })
        ).id,
      );
    // Each gater walks its share of the tasks from the far end of the queue, meeting the claimers.
    const shares = Array.from({ length: gaters }, (_, g) => ids.filter((_, i) => i % gaters === g).reverse());
    const claimerIdx = Array.from({ length: claimers }, (_, i) => i);
    const gaterIdx = Array.from({ length: gaters }, (_, i) => claimers + i);
    const [claimed, gated] = await Promise.all([
      contenders.race('claimAndComplete', () => ({ runId: run.id }), claimerIdx),
      contenders.race('openGates', (i) => ({ taskIds: shares[i - claimers]! }), gaterIdx),
    ]);
    for (const o of [...claimed, ...gated]) if (!o.ok) throw new Error(`contender ${o.index}: ${o.error.message}`);

    const tasks = await store.db
      .selectFrom('tasks')
      .select(['id', 'status', 'blocked_reason'])
      .where('id', 'in', ids)
      .execute();
    const gates = await store.db
      .selectFrom('decision_gates')
      .select(['task_id', 'created_at', 'status'])
      .where('task_id', 'in', ids)
      .execute();
    const dispatches = await store.db
      .selectFrom('dispatch_contexts')
      .select(['task_id', 'status', 'created_at', 'ended_at'])
      .where('task_id', 'in', ids)
      .execute();
    expect(gates).toHaveLength(TASKS);
    const gateAt = new Map(gates.map((g) => [g.task_id!, Number(g.created_at)]));
    const counts = { done: 0, blocked: 0, inFlight: 0 };
    const violations: string[] = [];
    for (const t of tasks) {
      const at = gateAt.get(t.id)!;
      const ds = dispatches.filter((d) => d.task_id === t.id);
      if (t.status === 'done') {
        counts.done++;
        const completed = ds.find((d) => d.status === 'completed')!;
        if (Number(completed.ended_at) > at)
          violations.push(`${t.id} completed at ${completed.ended_at} after its gate at ${at}`);
      } else if (t.status === 'blocked') {
        counts.blocked++;
        if (t.blocked_reason?.startsWith('gate: ') !== true) violations.push(`${t.id} blocked for ${t.blocked_reason}`);
        if (ds.length > 0) violations.push(`${t.id} blocked by its gate but was dispatched`);
      } else if (t.status === 'dispatched') {
        counts.inFlight++;
        const active = ds.filter((d) => d.status === 'active');
        if (active.length !== 1 || Number(active[0]!.created_at) > at)
          violations.push(`${t.id} dispatched after its gate opened`);
      } else violations.push(`${t.id} ended ${t.status}`);
    }
    console.log(
      `[gates race] ${JSON.stringify(counts)}; refused completions ${claimed.reduce((n, o) => n + (o.ok ? o.value.refused : 0), 0)}`,
    );
    expect(violations).toEqual([]);
    expect(counts.done + counts.blocked + counts.inFlight).toBe(TASKS);
  }, 600_000);
}
