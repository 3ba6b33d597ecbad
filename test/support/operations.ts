/**
 * The typed registry of the operations a suite's contenders run (see race.ts). An `*.ops.ts`
 * file ends with `export const ops = defineOperations(import.meta.url, { opA, opB })`; the suite
 * passes that `ops` to `Contenders.start`, and every `race`/`run`/`start` call is checked against
 * it at compile time: the operation's name (`keyof` the registry), its arguments, its result.
 */
import type { Store } from '../../src/index.js';
import type { ContenderTools } from './contender.js';

/** One operation a contender runs: its own store, the arguments the parent sent, its tools. */
// The arguments are each operation's own type; `any` here only lets every signature in.

export type Operation = (store: Store, args: any, tools: ContenderTools) => Promise<unknown>;

/** The registry: the module a contender imports (by URL), and the operations it names. */
export interface OperationSet<O extends Record<string, Operation>> {
  /** `import.meta.url` of the `*.ops.ts` file that defines this set (and exports it as `ops`). */
  readonly url: string;
  readonly operations: O;
}

/**
 * Names the operations of one `*.ops.ts` module. `url` must be that module's `import.meta.url`,
 * and the result must be exported as `ops`: the contender imports the module and runs
 * `ops.operations[name]`.
 */
export function defineOperations<const O extends Record<string, Operation>>(url: string, operations: O) {
  return { url, operations } as const satisfies OperationSet<O>;
}

/** An operation name of a set. */
export type OperationName<O> = keyof O & string;

/** What an operation takes as `args` (`undefined` for one that takes none). */
export type ArgsOf<F> = F extends (store: Store, ...rest: infer R) => unknown
  ? R extends readonly [infer A, ...unknown[]]
    ? A
    : R extends readonly [(infer A)?, ...unknown[]]
      ? A | undefined
      : undefined
  : never;

/** Whether `args` may be left out: the operation takes none, or `{}` satisfies them (the default sent). */
export type ArgsOptional<F> = undefined extends ArgsOf<F> ? true : object extends ArgsOf<F> ? true : false;

/**
 * A value as it arrives from a contender: results cross the process boundary as JSON (a `Date`
 * becomes its ISO string; an absent property stays absent).
 */
export type Wire<T> = T extends Date
  ? string
  : T extends readonly (infer U)[]
    ? Wire<U>[]
    : T extends object
      ? { [K in keyof T]: Wire<T[K]> }
      : T;

/** What an operation's outcome carries on success (`null` for an operation that returns nothing). */
export type ResultOf<F> = F extends (...args: never[]) => Promise<infer R>
  ? [R] extends [undefined | void]
    ? null
    : Wire<R>
  : never;
