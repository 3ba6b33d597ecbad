/**
 * Call shapes quoted in prose match the API (issue 21, item 6): ARCHITECTURE.md's "path of one
 * write" names exactly the input fields of `TransferEnvironmentInput` (the record below is
 * type-checked against the interface, both ways), and store.ts's JSDoc example calls
 * `claimWorkspaceLock(workspaceId, input)`, not with one object.
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import type { TransferEnvironmentInput } from '../../src/index.js';

// The idempotency key every keyed mutation takes is not part of the transfer's own shape.
const FIELDS: Record<Exclude<keyof TransferEnvironmentInput, 'idempotencyKey'>, true> = {
  environmentId: true,
  expectedOwnerTaskId: true,
  expectedGeneration: true,
  newOwnerTaskId: true,
};

describe('ARCHITECTURE.md', () => {
  it('names the input fields transferEnvironmentOwnership really takes', () => {
    const text = readFileSync(new URL('../../ARCHITECTURE.md', import.meta.url), 'utf8');
    const call = /transferEnvironmentOwnership\(\{([^}]*)\}\)/.exec(text);
    expect(call, 'the path of one write names transferEnvironmentOwnership({ … })').not.toBeNull();
    const named = call![1]!.split(',').map((f) => f.trim());
    expect(named.sort()).toEqual(Object.keys(FIELDS).sort());
    // The steps do not name the fields of an older draft either.
    const section = text.slice(text.indexOf('## The path of one write'), text.indexOf('## Lock keys'));
    for (const stale of ['fromTaskId', 'toTaskId']) expect(section).not.toContain(stale);
  });
});

describe('store.ts JSDoc', () => {
  it('calls claimWorkspaceLock with (workspaceId, input), as the repository takes it', () => {
    const text = readFileSync(new URL('../../src/store.ts', import.meta.url), 'utf8');
    const calls = [...text.matchAll(/claimWorkspaceLock\(([^)]*)\)/g)].map((m) => m[1]!);
    expect(calls.length).toBeGreaterThan(0);
    for (const args of calls) expect(args, args).toMatch(/^\w+, \{/);
  });
});
