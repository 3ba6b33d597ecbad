import { fork, type ChildProcess } from 'node:child_process';
import { compiledPath, compiledUrl } from './compiled.js';
import type { ArgsOf, ArgsOptional, Operation, OperationName, OperationSet, ResultOf } from './operations.js';

/** This file's contender, transpiled (compiled.ts): a child started through tsx's loader cost 3× the CPU. */
const CONTENDER = new URL('./contender.ts', import.meta.url).href;

/** What one contender's call came to. Errors carry their class name, `code` and own fields. */
export type Outcome<T = unknown> =
  | { readonly index: number; readonly ok: true; readonly value: T }
  | { readonly index: number; readonly ok: false; readonly error: SerializedError };

export interface SerializedError {
  readonly name: string;
  readonly message: string;
  readonly code?: string;
  readonly [field: string]: unknown;
}

export interface ContenderOptions<S extends AnyOperationSet> {
  /** Database URL every contender opens its own store (and so its own connection) on. */
  readonly url: string;
  /** The `ops` export of an `*.ops.ts` module (`defineOperations`): what the contenders can run. */
  readonly ops: S;
  /** Passed to `openStore` in each contender (e.g. `{ poolSize: 2 }`). */
  readonly storeOptions?: Record<string, unknown>;
}

type Message =
  | { type: 'ready' }
  | { type: 'prepared'; id: number }
  | { type: 'result'; id: number; ok: boolean; value?: unknown; error?: SerializedError }
  | { type: 'signal'; id: number; name: string }
  | { type: 'fatal'; error: SerializedError };

interface Child {
  readonly index: number;
  readonly process: ChildProcess;
  exited: boolean;
}

/** `race`'s arguments after the operation name: `args` may be left out when the operation needs none. */
type RaceRest<F> =
  ArgsOptional<F> extends true
    ? [args?: (index: number) => ArgsOf<F>, indexes?: readonly number[]]
    : [args: (index: number) => ArgsOf<F>, indexes?: readonly number[]];

/** `run`'s and `start`'s arguments after the operation name. */
type RunRest<F> = ArgsOptional<F> extends true ? [args?: ArgsOf<F>] : [args: ArgsOf<F>];

/**
 * N child processes, each with its own store on one database: several OS processes on one
 * SQLite file, several connections to one PostgreSQL database. `race` prepares one call in every
 * child, then releases them together (a barrier: no child starts before all are armed) and
 * collects every outcome.
 */
/** Any suite's operation set. */
type AnyOperationSet = OperationSet<Record<string, Operation>>;

/** The operations of a set. */
type Ops<S extends AnyOperationSet> = S['operations'];

export class Contenders<S extends AnyOperationSet> {
  readonly #children: Child[];
  #nextId = 1;
  readonly #waiters = new Map<string, (message: Message) => void>();
  readonly #signals: { index: number; id: number; name: string }[] = [];
  readonly #signalWaiters: (() => void)[] = [];

  private constructor(children: Child[]) {
    this.#children = children;
  }

  /** Starts `n` contenders and waits until each has opened its store. */
  static async start<S extends AnyOperationSet>(n: number, options: ContenderOptions<S>): Promise<Contenders<S>> {
    const children: Child[] = [];
    const ready: Promise<void>[] = [];
    const contender = compiledPath(CONTENDER);
    const moduleUrl = compiledUrl(options.ops.url);
    for (let index = 0; index < n; index++) {
      const child = fork(contender, [], {
        execArgv: [],
        env: {
          ...process.env,
          CONTENDER_URL: options.url,
          CONTENDER_MODULE: moduleUrl,
          CONTENDER_STORE_OPTIONS: JSON.stringify(options.storeOptions ?? {}),
          CONTENDER_INDEX: String(index),
        },
        stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
      });
      const entry: Child = { index, process: child, exited: false };
      child.on('exit', () => (entry.exited = true));
      children.push(entry);
      ready.push(
        new Promise((resolve, reject) => {
          const onMessage = (m: Message) => {
            if (m.type === 'ready') {
              child.off('message', onMessage);
              resolve();
            } else if (m.type === 'fatal') reject(new Error(`contender ${index} failed to start: ${m.error.message}`));
          };
          child.on('message', onMessage);
          child.once('exit', (code) => reject(new Error(`contender ${index} exited with ${code} before it was ready`)));
        }),
      );
    }
    const contenders = new Contenders<S>(children);
    try {
      await Promise.all(ready);
    } catch (error) {
      await contenders.close();
      throw error;
    }
    for (const c of children) {
      c.process.on('message', (m: Message) => contenders.#dispatch(c.index, m));
    }
    return contenders;
  }

  get size(): number {
    return this.#children.length;
  }

  #dispatch(index: number, m: Message): void {
    if (m.type === 'signal') {
      this.#signals.push({ index, id: m.id, name: m.name });
      for (const w of this.#signalWaiters.splice(0)) w();
      return;
    }
    if (m.type === 'prepared' || m.type === 'result') {
      const waiter = this.#waiters.get(`${m.type}:${index}:${m.id}`);
      if (waiter) {
        this.#waiters.delete(`${m.type}:${index}:${m.id}`);
        waiter(m);
      }
    }
  }

  #await(type: 'prepared' | 'result', index: number, id: number): Promise<Message> {
    const child = this.#children[index]!;
    return new Promise((resolve, reject) => {
      if (child.exited) return reject(new Error(`contender ${index} has exited`));
      const onExit = (code: number | null, signal: string | null) => {
        this.#waiters.delete(`${type}:${index}:${id}`);
        reject(new ContenderExitedError(index, code, signal));
      };
      child.process.once('exit', onExit);
      this.#waiters.set(`${type}:${index}:${id}`, (m) => {
        child.process.off('exit', onExit);
        resolve(m);
      });
    });
  }

  /**
   * Arms `fn(store, args(i))` in every listed contender (default: all), releases them together,
   * and returns every outcome in contender order.
   */
  async race<K extends OperationName<Ops<S>>>(
    fn: K,
    ...rest: RaceRest<Ops<S>[K]>
  ): Promise<Outcome<ResultOf<Ops<S>[K]>>[]> {
    const [args = () => ({}), indexes] = rest as [((index: number) => unknown)?, (readonly number[])?];
    return this.#race(fn, args, indexes);
  }

  async #race<T>(fn: string, args: (index: number) => unknown, indexes?: readonly number[]): Promise<Outcome<T>[]> {
    const targets = indexes ?? this.#children.map((c) => c.index);
    const id = this.#nextId++;
    const prepared = targets.map((i) => this.#await('prepared', i, id));
    const results = targets.map((i) => this.#await('result', i, id));
    for (const i of targets) this.#children[i]!.process.send({ type: 'prepare', id, fn, args: args(i) });
    await Promise.all(prepared);
    for (const i of targets) this.#children[i]!.process.send({ type: 'go', id });
    const settled = await Promise.all(results);
    return settled.map((m, k) => {
      const r = m as Extract<Message, { type: 'result' }>;
      return r.ok
        ? { index: targets[k]!, ok: true, value: r.value as T }
        : { index: targets[k]!, ok: false, error: r.error! };
    });
  }

  /** Runs one call in one contender (no barrier). */
  async run<K extends OperationName<Ops<S>>>(
    index: number,
    fn: K,
    ...rest: RunRest<Ops<S>[K]>
  ): Promise<Outcome<ResultOf<Ops<S>[K]>>> {
    const [args = {}] = rest as [unknown?];
    const [outcome] = await this.#race<ResultOf<Ops<S>[K]>>(fn, () => args, [index]);
    return outcome!;
  }

  /**
   * Starts a call in one contender without waiting for it; the returned promise settles with
   * its outcome, or rejects with `ContenderExitedError` if the process dies first.
   */
  start<K extends OperationName<Ops<S>>>(
    index: number,
    fn: K,
    ...rest: RunRest<Ops<S>[K]>
  ): Promise<Outcome<ResultOf<Ops<S>[K]>>> {
    return this.run(index, fn, ...rest);
  }

  /** Resolves when contender `index` has called `signal(name)` from inside an operation. */
  async waitForSignal(index: number, name: string, timeoutMs = 30_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      if (this.#signals.some((s) => s.index === index && s.name === name)) return;
      if (Date.now() > deadline) throw new Error(`contender ${index} did not signal "${name}" within ${timeoutMs} ms`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, 100);
        this.#signalWaiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  /** Kills one contender with a signal (SIGKILL by default) and waits until it is gone. */
  async kill(index: number, signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    const child = this.#children[index]!;
    if (child.exited) return;
    const gone = new Promise<void>((resolve) => child.process.once('exit', () => resolve()));
    child.process.kill(signal);
    await gone;
  }

  /** Stops every contender (each closes its store first). */
  async close(): Promise<void> {
    await Promise.all(
      this.#children.map(async (c) => {
        if (c.exited) return;
        const gone = new Promise<void>((resolve) => c.process.once('exit', () => resolve()));
        c.process.send({ type: 'exit' });
        const timer = setTimeout(() => c.process.kill('SIGKILL'), 5_000);
        await gone;
        clearTimeout(timer);
      }),
    );
  }
}

export class ContenderExitedError extends Error {
  constructor(
    readonly index: number,
    readonly exitCode: number | null,
    readonly signal: string | null,
  ) {
    super(`contender ${index} exited (code ${exitCode}, signal ${signal}) before answering`);
    this.name = 'ContenderExitedError';
  }
}

/** The outcomes that succeeded, and those that failed, split. */
export function partition<T>(outcomes: readonly Outcome<T>[]) {
  const wins = outcomes.filter((o): o is Extract<Outcome<T>, { ok: true }> => o.ok);
  const losses = outcomes.filter((o): o is Extract<Outcome<T>, { ok: false }> => !o.ok);
  return { wins, losses };
}

/**
 * `npm run soak:leases` sets LEASE_SOAK_ROUNDS=1000: the path-lease and semaphore races then play
 * that many rounds per contender (their CI runs play a few dozen).
 */
export const SOAK_ROUNDS = process.env.LEASE_SOAK_ROUNDS ? Number(process.env.LEASE_SOAK_ROUNDS) : undefined;
/** A soak's race runs for as long as it takes. */
export const SOAK_TIMEOUT = SOAK_ROUNDS ? 3_600_000 : undefined;
