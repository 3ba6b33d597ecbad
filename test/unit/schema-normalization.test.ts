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
  });

  it('splits index column lists on top-level commas only', () => {
    expect(splitTopLevel(`a, coalesce(b, ''), "c"`)).toEqual(['a', `coalesce(b, '')`, '"c"']);
    expect(splitTopLevel(`coalesce(x, ','), y`)).toEqual([`coalesce(x, ',')`, 'y']);
  });
});
