import { InvalidArgumentError } from '../errors.js';

/** A non-empty string, or an `InvalidArgumentError` naming the field. */
export function requireText(field: string, value: unknown): string {
  if (typeof value !== 'string' || value.trim() === '') throw new InvalidArgumentError(field, 'must be a non-empty string');
  return value;
}

/** A positive integer number of milliseconds. */
export function requirePositiveMs(field: string, value: unknown): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value <= 0) {
    throw new InvalidArgumentError(field, 'must be a positive integer number of milliseconds');
  }
  return value;
}

/** A boolean the caller must decide explicitly. */
export function requireBoolean(field: string, value: unknown): boolean {
  if (typeof value !== 'boolean') throw new InvalidArgumentError(field, 'is required and must be true or false');
  return value;
}
