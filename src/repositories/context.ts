import { randomBytes, randomUUID } from 'node:crypto';
import type { StoreDialect } from '../dialects/types.js';

/** Epoch milliseconds; injectable so tests can move time. */
export interface Clock {
  now(): number;
}

export const systemClock: Clock = Object.freeze({ now: () => Date.now() });

/** What every repository receives: the dialect primitives, a clock and id generation. */
export interface StoreContext {
  readonly dialect: StoreDialect;
  readonly clock: Clock;
  newId(): string;
  /** `<prefix>-<hex>` with 12 random hex digits, e.g. `coordinator-3f9a0c…`. */
  newHandle(prefix: string): string;
}

export function createStoreContext(dialect: StoreDialect, clock: Clock = systemClock): StoreContext {
  return Object.freeze({
    dialect,
    clock,
    newId: () => randomUUID(),
    newHandle: (prefix: string) => `${prefix}-${randomBytes(6).toString('hex')}`,
  });
}
