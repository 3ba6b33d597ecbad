import { describe, expect, it } from 'vitest';
import { CompiledQuery } from 'kysely';
import fc from 'fast-check';
import { inlineParameters } from '../../src/migrator/recording-driver.js';

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
});
