import { randomBytes, randomUUID } from 'node:crypto';
import type { StoreDialect } from '../dialects/types.js';
import type { LeaseAuditMode } from './shared/audit.js';

/** Epoch milliseconds; injectable so tests can move time. */
export interface Clock {
  now(): number;
}

export const systemClock: Clock = Object.freeze({ now: () => Date.now() });

/** Store-wide settings repositories read (from `openStore`'s options). */
export interface StoreSettings {
  /** Hand-outs of a message before it is dead-lettered (`maxAttempts`, default 5). */
  readonly maxAttempts: number;
  /** Which lease acts the audit trail records (`audit.leases`; see shared/audit.ts). */
  readonly auditLeases: LeaseAuditMode;
}

/** The settings of a store opened without options. */
// The trail of lease acts is off by default: on the overhead benchmark's lease cycle it cost more
// than the 10 % the issue allows (README, "Audit trail on the hot path").
export const DEFAULT_SETTINGS: StoreSettings = Object.freeze({ maxAttempts: 5, auditLeases: 'off' });

/** What every repository receives: the dialect primitives, a clock, settings and id generation. */
export interface StoreContext {
  readonly dialect: StoreDialect;
  readonly clock: Clock;
  readonly settings: StoreSettings;
  newId(): string;
  /** `<prefix>-<hex>` with 12 random hex digits, e.g. `coordinator-3f9a0c…`. */
  newHandle(prefix: string): string;
  /** 12 random hex digits (48 bits), e.g. a receipt's nonce. */
  newNonce(): string;
}

/** Bytes drawn from the system's generator at once, as Node's own `randomUUID` does. */
const POOL_BYTES = 4096;
let pool = Buffer.alloc(0);
let drawn = 0;

/**
 * `bytes` random bytes as hex, from a pool refilled by `randomBytes`: one `randomBytes(6)` costs
 * about 5 µs, a draw from the pool 0.1 µs (a receive makes one). The bytes are the generator's
 * own, each handed out once.
 */
export function randomHex(bytes: number): string {
  if (bytes > POOL_BYTES) return randomBytes(bytes).toString('hex');
  if (drawn + bytes > pool.length) {
    pool = randomBytes(POOL_BYTES);
    drawn = 0;
  }
  const hex = pool.toString('hex', drawn, drawn + bytes);
  drawn += bytes;
  return hex;
}

export function createStoreContext(
  dialect: StoreDialect,
  clock: Clock = systemClock,
  settings: StoreSettings = DEFAULT_SETTINGS,
): StoreContext {
  return Object.freeze({
    dialect,
    clock,
    settings,
    newId: () => randomUUID(),
    newHandle: (prefix: string) => `${prefix}-${randomHex(6)}`,
    newNonce: () => randomHex(6),
  });
}
