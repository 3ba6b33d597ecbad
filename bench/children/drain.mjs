// Child process for the lifecycle benchmark: one store (its own connection) drains the run's
// ready queue with dispatchNext → completeDispatch (or chained completions, `loop: 'chained'`), starting at the shared wall-clock instant
// `startAt`, and prints how many cycles it made and when it started and ended.
import { openStore } from '../../dist/index.js';

const { url, runId, worker, startAt, loop = 'two-calls' } = JSON.parse(process.argv[2]);
const store = await openStore({ url, poolSize: 1 });
await new Promise((resolve) => setTimeout(resolve, Math.max(0, startAt - Date.now())));
const startedAt = Date.now();
let done = 0;
if (loop === 'chained') {
  // The completion claims the terminal's next task in its own transaction.
  let d = await store.dispatches.dispatchNext({ runId, terminalHandle: `term-${worker}` });
  while (d) {
    const completed = await store.dispatches.completeDispatch(d.id, {
      result: { ok: true },
      lease: d.lease ?? undefined,
      next: true,
    });
    done++;
    d = completed.next ?? null;
  }
} else
  for (;;) {
    const d = await store.dispatches.dispatchNext({ runId, terminalHandle: `term-${worker}` });
    if (!d) break;
    await store.dispatches.completeDispatch(d.id, { result: { ok: true }, lease: d.lease ?? undefined });
    done++;
  }
const endedAt = Date.now();
await store.close();
console.log(JSON.stringify({ startedAt, endedAt, done }));
