/**
 * One contender process of the race helper (see race.ts). It opens its own store, imports the
 * operations module, and runs the calls the parent arms and releases.
 */
import { openStore, type Store } from '../../src/index.js';
import type { Operation, OperationSet } from './operations.js';

/** What an operation gets besides the store and its args. */
export interface ContenderTools {
  /** This contender's index (0-based). */
  readonly index: number;
  /** Tells the parent a point was reached (see `Contenders.waitForSignal`). */
  signal(name: string): void;
  /** The database URL this contender opened. */
  readonly url: string;
}

function serializeError(error: unknown) {
  if (error instanceof Error) {
    const fields: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(error)) {
      try {
        JSON.stringify(v);
        fields[k] = v;
      } catch {
        // not serializable: drop it
      }
    }
    return { ...fields, name: error.name, message: error.message, code: (error as { code?: string }).code };
  }
  return { name: 'NonError', message: String(error) };
}

async function main() {
  const url = process.env.CONTENDER_URL!;
  const index = Number(process.env.CONTENDER_INDEX);
  let store: Store;
  let ops: Record<string, Operation>;
  try {
    store = await openStore({ ...JSON.parse(process.env.CONTENDER_STORE_OPTIONS ?? '{}'), url });
    const moduleUrl = process.env.CONTENDER_MODULE!;
    const set = ((await import(moduleUrl)) as { ops?: OperationSet<Record<string, Operation>> }).ops;
    if (set?.url !== moduleUrl || typeof set.operations !== 'object')
      throw new Error(`${moduleUrl} does not export its operations as \`ops = defineOperations(import.meta.url, …)\``);
    ops = set.operations;
  } catch (error) {
    process.send!({ type: 'fatal', error: serializeError(error) });
    process.exit(1);
  }
  const armed = new Map<number, { fn: string; args: unknown }>();
  // eslint-disable-next-line @typescript-eslint/no-misused-promises -- an error escaping the handler crashes this contender, which the harness reports as a failure
  process.on('message', async (m: { type: string; id: number; fn: string; args: unknown }) => {
    if (m.type === 'exit') {
      await store.close().catch(() => {});
      process.exit(0);
    }
    if (m.type === 'prepare') {
      armed.set(m.id, { fn: m.fn, args: m.args });
      process.send!({ type: 'prepared', id: m.id });
      return;
    }
    if (m.type === 'go') {
      const call = armed.get(m.id)!;
      armed.delete(m.id);
      const op = Object.hasOwn(ops, call.fn) ? ops[call.fn] : undefined;
      const tools: ContenderTools = { index, url, signal: (name) => process.send!({ type: 'signal', id: m.id, name }) };
      try {
        if (typeof op !== 'function') throw new Error(`the operations module has no operation "${call.fn}"`);
        const value = await op(store, call.args, tools);
        process.send!({ type: 'result', id: m.id, ok: true, value: value ?? null });
      } catch (error) {
        process.send!({ type: 'result', id: m.id, ok: false, error: serializeError(error) });
      }
    }
  });
  process.on('disconnect', () => process.exit(0));
  process.send!({ type: 'ready' });
}

void main();
