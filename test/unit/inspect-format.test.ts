import { describe, expect, it } from 'vitest';
import { buildPathTree } from '../../src/inspect/tree.js';
import { describeDuration, describeLeft, fit } from '../../src/inspect/format.js';

const lease = (holder: string) => ({ holder, taskId: null, expiresAt: 10, leftMs: 5 });

describe('the path-lease tree', () => {
  it('puts each lease at its node, with its ancestors as the nodes above, children sorted', () => {
    const tree = buildPathTree([
      { path: 'src/ui/button.ts', lease: lease('b') },
      { path: 'src', lease: lease('a') },
      { path: '', lease: lease('whole') },
      { path: 'docs', lease: lease('c') },
    ]);
    expect(tree.leases.map((l) => l.holder)).toEqual(['whole']);
    expect(tree.children.map((c) => c.name)).toEqual(['docs', 'src']);
    const src = tree.children[1]!;
    expect(src).toMatchObject({ path: 'src', leases: [lease('a')] });
    expect(src.children[0]).toMatchObject({ name: 'ui', path: 'src/ui', leases: [] });
    expect(src.children[0]!.children[0]).toMatchObject({ path: 'src/ui/button.ts', leases: [lease('b')] });
  });
});

describe('durations and widths', () => {
  it('says durations the way an operator reads them', () => {
    expect(describeDuration(850)).toBe('850 ms');
    expect(describeDuration(42_400)).toBe('42 s');
    expect(describeDuration(185_000)).toBe('3 min 5 s');
    expect(describeDuration(7_800_000)).toBe('2 h 10 min');
    expect(describeDuration(-3_000)).toBe('3 s');
    expect(describeLeft(3_000)).toBe('in 3 s');
    expect(describeLeft(-3_000)).toBe('EXPIRED 3 s ago');
  });
  it('cuts a line to the width with an ellipsis, counting characters, not bytes', () => {
    expect(fit('└─ abcdef', 6)).toBe('└─ ab…');
    expect(fit('short', 6)).toBe('short');
  });
});
