import { describe, expect, it } from 'vitest';
import { parseArgs } from '../../src/cli.js';

describe('CLI arguments', () => {
  it('parses versions written either way', () => {
    expect(parseArgs(['migrate', '--to', '0052', '--db', 'sqlite:x.db'])).toMatchObject({
      command: 'migrate',
      to: 52,
      db: 'sqlite:x.db',
    });
    expect(parseArgs(['migrate', '--baseline=5'])).toMatchObject({ baseline: 5 });
    expect(parseArgs(['status', '--json'])).toMatchObject({ command: 'status', json: true });
    expect(parseArgs([])).toMatchObject({ command: 'help' });
  });

  it('rejects options that do not belong to the command', () => {
    expect(() => parseArgs(['plan', '--baseline', '5'])).toThrow(/not an option of plan/);
    expect(() => parseArgs(['status', '--lock-timeout', '5'])).toThrow(/not an option of status/);
  });
});
