/**
 * The README's state-machine tables are the code's: `TASK_TRANSITIONS` and
 * `DISPATCH_TRANSITIONS` rendered between the `lifecycle:` markers. A transition added or
 * removed in src/repositories/shared/lifecycle.ts without the README fails here; the expected
 * text is printed, paste it in.
 */
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { DISPATCH_TRANSITIONS, TASK_TRANSITIONS, type Transition } from '../../src/index.js';

const README = fileURLToPath(new URL('../../README.md', import.meta.url));

/** One markdown table: from, to, the call. */
function renderTransitions(rows: readonly Transition<string>[]): string {
  return [
    '| from | to | made by |',
    '|---|---|---|',
    ...rows.map((r) => `| \`${r.from}\` | \`${r.to}\` | \`${r.call}\` |`),
  ].join('\n');
}

function between(text: string, name: string): string {
  const start = `<!-- lifecycle:${name} -->`;
  const end = `<!-- /lifecycle:${name} -->`;
  const i = text.indexOf(start);
  const j = text.indexOf(end);
  if (i < 0 || j < i) throw new Error(`README.md has no ${start} … ${end} block`);
  return text.slice(i + start.length, j).trim();
}

describe('README state-machine tables', () => {
  const readme = readFileSync(README, 'utf8');
  it('lists every task transition and the call that makes it, as TASK_TRANSITIONS does', () => {
    expect(between(readme, 'task-transitions')).toBe(renderTransitions(TASK_TRANSITIONS));
  });
  it('lists every dispatch transition, as DISPATCH_TRANSITIONS does', () => {
    expect(between(readme, 'dispatch-transitions')).toBe(renderTransitions(DISPATCH_TRANSITIONS));
  });
});
