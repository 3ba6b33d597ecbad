/** The longest delay `setTimeout` honours (about 24.8 days); a longer one fires at once. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/** `ms` clamped to what `setTimeout` can wait. Waking a waiter early is harmless: it re-checks and waits again. */
export function clampTimerMs(ms: number): number {
  return Math.min(Math.max(0, ms), MAX_TIMER_MS);
}
