import { describe, expect, it } from 'vitest';
import { normalizeExpression, normalizeType, splitTopLevel } from '../../src/schema/describe.js';

describe('schema normalization', () => {
  it('maps both dialects to one set of logical types', () => {
    expect(['INTEGER', 'bigint', 'integer', 'smallint'].map(normalizeType)).toEqual([
      'integer',
      'integer',
      'integer',
      'integer',
    ]);
    expect(['TEXT', 'character varying', 'text'].map(normalizeType)).toEqual(['text', 'text', 'text']);
  });

  it('makes SQLite source text and PostgreSQL deparsed expressions compare equal', () => {
    expect(normalizeExpression(`COALESCE(target_key, ''::text)`)).toBe(normalizeExpression(`coalesce(target_key, '')`));
    expect(normalizeExpression(`(status = 'running'::text)`)).toBe(normalizeExpression(`status = 'running'`));
    expect(normalizeExpression(`'backlog'::text`)).toBe(normalizeExpression(`'backlog'`));
    expect(normalizeExpression(`(status <> ALL (ARRAY['done'::text, 'failed'::text]))`)).toBe(
      normalizeExpression(`status not in ('done', 'failed')`),
    );
    expect(normalizeExpression(`(status = ANY (ARRAY['a'::text, 'b'::text]))`)).toBe(
      normalizeExpression(`status in ('a', 'b')`),
    );
    expect(normalizeExpression(`status not in ('a')`)).not.toBe(normalizeExpression(`status in ('a')`));
  });

  it('splits index column lists on top-level commas only', () => {
    expect(splitTopLevel(`a, coalesce(b, ''), "c"`)).toEqual(['a', `coalesce(b, '')`, '"c"']);
    expect(splitTopLevel(`coalesce(x, ','), y`)).toEqual([`coalesce(x, ',')`, 'y']);
  });
});
