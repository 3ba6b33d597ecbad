import { describe, expect, it } from 'vitest';
import { CompiledQuery } from 'kysely';
import fc from 'fast-check';
import { inlineParameters } from '../../src/migrator/recording-driver.js';
import { describeWindow } from '../../src/cli/output.js';

describe('plan rendering', () => {
  it('inlines parameters as literals, leaving placeholders inside strings alone', () => {
    const sqlite = CompiledQuery.raw(`update t set a = ? where b = '?' and c = ?`, ["it's", 3]);
    expect(inlineParameters('sqlite', sqlite)).toBe(`update t set a = 'it''s' where b = '?' and c = 3`);
    const pg = CompiledQuery.raw(`select $1, '$2', $2, $10`, [1, null, ...Array(7).fill(0), 'ten']);
    expect(inlineParameters('postgres', pg)).toBe(`select 1, '$2', NULL, 'ten'`);
  });

  it('round-trips any string literal', () => {
    fc.assert(
      fc.property(fc.string(), (s) => {
        const rendered = inlineParameters('sqlite', CompiledQuery.raw('select ?', [s]));
        expect(rendered).toBe(`select '${s.replace(/'/g, "''")}'`);
      }),
    );
  });

  it('plan and status state the compatibility window in one line, narrowed or not', () => {
    expect(describeWindow({ oldestWriterRelease: '0.3.0', setByVersion: 98, newestAppliedByRelease: '0.4.1' })).toBe(
      'compatibility window: taskfence 0.3.0 or newer may write (set by 0098); older releases are refused at openStore; last migrated by taskfence 0.4.1',
    );
    expect(describeWindow({ oldestWriterRelease: null, setByVersion: null, newestAppliedByRelease: null })).toBe(
      'compatibility window: every taskfence release that knows this schema may write',
    );
  });
});
