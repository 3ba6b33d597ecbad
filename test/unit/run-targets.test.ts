import { describe, expect, it } from 'vitest';
import {
  UnresolvedTargetError,
  resolveOrchestrationTargetKey,
  resolveOrchestrationTargetKeyAsync,
} from '../../src/index.js';
import { runTargetLockKey } from '../../src/protocol.js';

const worktrees = new Map([
  ['feature-x', 'wt-7f3a'],
  ['/repo/worktrees/feature-x', 'wt-7f3a'],
  ['main', 'wt-main'],
]);
const lookup = (selector: string) => worktrees.get(selector);

function refusal(fn: () => unknown): UnresolvedTargetError {
  try {
    fn();
  } catch (error) {
    expect(error).toBeInstanceOf(UnresolvedTargetError);
    return error as UnresolvedTargetError;
  }
  throw new Error('expected an UnresolvedTargetError');
}

describe('resolveOrchestrationTargetKey', () => {
  it('maps no selector to the shared null target', () => {
    expect(resolveOrchestrationTargetKey(undefined, lookup)).toBeNull();
    expect(resolveOrchestrationTargetKey(null, lookup)).toBeNull();
  });

  it('maps a resolving selector to worktree:<id>, the same key for every selector of one worktree', () => {
    expect(resolveOrchestrationTargetKey('feature-x', lookup)).toBe('worktree:wt-7f3a');
    expect(resolveOrchestrationTargetKey('/repo/worktrees/feature-x', lookup)).toBe('worktree:wt-7f3a');
    expect(resolveOrchestrationTargetKey('main', lookup)).toBe('worktree:wt-main');
  });

  it('refuses a selector that does not resolve instead of guessing a key', () => {
    const error = refusal(() => resolveOrchestrationTargetKey('feature-y', lookup));
    expect(error).toMatchObject({ code: 'UNRESOLVED_ORCHESTRATION_TARGET', selector: 'feature-y' });
    expect(error.message).toMatch(/Nothing was started/);
  });

  it('refuses a blank selector, a failing lookup and an unusable id', () => {
    refusal(() => resolveOrchestrationTargetKey('', lookup));
    refusal(() => resolveOrchestrationTargetKey('   ', lookup));
    const failing = refusal(() =>
      resolveOrchestrationTargetKey('x', () => {
        throw new Error('registry offline');
      }),
    );
    expect((failing.cause as Error).message).toBe('registry offline');
    refusal(() => resolveOrchestrationTargetKey('x', () => ''));
    refusal(() => resolveOrchestrationTargetKey('x', () => ' wt-1'));
    refusal(() => resolveOrchestrationTargetKey('x', () => null));
    refusal(() => resolveOrchestrationTargetKey('x', () => 42 as unknown as string));
  });

  it('applies the same rules to asynchronous lookups', async () => {
    await expect(resolveOrchestrationTargetKeyAsync(undefined, async () => 'never')).resolves.toBeNull();
    await expect(resolveOrchestrationTargetKeyAsync('main', async (s) => worktrees.get(s))).resolves.toBe(
      'worktree:wt-main',
    );
    await expect(resolveOrchestrationTargetKeyAsync('nope', async (s) => worktrees.get(s))).rejects.toBeInstanceOf(
      UnresolvedTargetError,
    );
    await expect(
      resolveOrchestrationTargetKeyAsync('main', async () => {
        throw new Error('down');
      }),
    ).rejects.toBeInstanceOf(UnresolvedTargetError);
  });
});

describe('runTargetLockKey', () => {
  it('gives the null target and each target key a lock key of its own', () => {
    expect(runTargetLockKey(null)).toBe(runTargetLockKey(null));
    expect(runTargetLockKey('worktree:a')).not.toBe(runTargetLockKey('worktree:b'));
    expect(runTargetLockKey(null)).not.toBe(runTargetLockKey('worktree:a'));
  });
});
