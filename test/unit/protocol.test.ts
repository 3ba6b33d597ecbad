/**
 * The protocol strings (src/protocol.ts), pinned byte for byte: running deployments of different
 * versions share these advisory-lock keys and wake-up topics, so a change here would let two
 * versions hold the "same" lock at once, or miss each other's wake-ups.
 */
import { describe, expect, it } from 'vitest';
import {
  barrierLockKey,
  dispatchTaskLockKey,
  dispatchTerminalLockKey,
  doctorProbeLockKey,
  inboxTopic,
  LOCK_KEY_PREFIX,
  MIGRATION_LOCK_PREFIX,
  migrationLockKey,
  ownedResourceLockKey,
  pathsLockKey,
  pathsTopic,
  resourceLockKey,
  runTargetLockKey,
  schemaLockKey,
  schemaTopic,
  semaphoreLockKey,
  semaphoreTopic,
  snapshotLockKey,
  WAKE_CHANNEL,
} from '../../src/protocol.js';

describe('lock keys', () => {
  it('are the strings deployed versions build', () => {
    expect(LOCK_KEY_PREFIX).toBe('taskfence:');
    expect(resourceLockKey('box')).toBe('taskfence:resource:box');
    expect(runTargetLockKey(null)).toBe('taskfence:run-target:');
    expect(runTargetLockKey('worktree:a')).toBe('taskfence:run-target:worktree:a');
    expect(barrierLockKey('t1')).toBe('ownership:barrier:t1');
    expect(snapshotLockKey('s1')).toBe('ownership:snapshot:s1');
    expect(ownedResourceLockKey('environment', 'e1')).toBe('ownership:environment:e1');
    expect(ownedResourceLockKey('group', 'g1')).toBe('ownership:group:g1');
    expect(dispatchTerminalLockKey('h1')).toBe('taskfence:dispatch-terminal:h1');
    expect(dispatchTaskLockKey('t1')).toBe('taskfence:dispatch-task:t1');
    expect(pathsLockKey('w1')).toBe('paths:w1');
    expect(semaphoreLockKey('builds')).toBe('taskfence:semaphore:builds');
    expect(MIGRATION_LOCK_PREFIX).toBe('taskfence:migrate:');
    expect(migrationLockKey('tenant_a')).toBe('taskfence:migrate:tenant_a');
    expect(doctorProbeLockKey('p1')).toBe('taskfence:doctor:p1');
  });

  it('carry a configured schema before the key, and nothing without one', () => {
    expect(schemaLockKey(undefined, 'paths:w1')).toBe('paths:w1');
    expect(schemaLockKey('tenant_a', 'paths:w1')).toBe('tenant_a:paths:w1');
  });
});

describe('wake-up topics', () => {
  it('are the strings deployed versions announce and listen for', () => {
    expect(WAKE_CHANNEL).toBe('taskfence_wake');
    expect(pathsTopic('w1')).toBe('paths:w1');
    expect(semaphoreTopic('builds')).toBe('semaphore:builds');
    expect(inboxTopic('h1')).toBe('inbox:h1');
  });

  it('carry a configured schema before the topic, and nothing without one', () => {
    expect(schemaTopic(undefined, 'inbox:h1')).toBe('inbox:h1');
    expect(schemaTopic('tenant_a', 'inbox:h1')).toBe('tenant_a/inbox:h1');
  });
});
