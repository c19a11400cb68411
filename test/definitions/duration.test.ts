import { describe, expect, it } from 'vitest';
import { InvalidDefinitionError } from '../../src/errors.js';
import { MAX_DURATION_MS, parseDuration } from '../../src/definitions/index.js';

describe('parseDuration', () => {
  it('accepts ms strings and whole non-negative numbers of ms', () => {
    expect(parseDuration('90s', 'p')).toBe(90_000);
    expect(parseDuration('1m', 'p')).toBe(60_000);
    expect(parseDuration('250ms', 'p')).toBe(250);
    expect(parseDuration('1.5s', 'p')).toBe(1500);
    expect(parseDuration(0, 'p')).toBe(0);
    expect(parseDuration(1234, 'p')).toBe(1234);
    expect(parseDuration(MAX_DURATION_MS, 'p')).toBe(2 ** 31 - 1);
  });

  const refused: [string, string | number, RegExp][] = [
    ['a negative number', -1, /negative/],
    ['a negative string', '-5s', /negative/],
    ['NaN', Number.NaN, /not finite/],
    ['Infinity', Number.POSITIVE_INFINITY, /not finite/],
    ['an unparseable string', 'soon', /cannot parse duration "soon"/],
    ['an empty string', '', /cannot parse/],
    ['a fraction of a ms', 1.5, /whole number/],
    ['more than 2^31-1 ms', 2 ** 31, /more than 2147483647 ms/],
    ['a string past the timer limit', '30d', /more than 2147483647 ms/],
  ];
  for (const [what, value, message] of refused) {
    it(`refuses ${what}, naming the path`, () => {
      const err = (() => {
        try {
          parseDuration(value, 'toolClass[io].lease');
        } catch (e) {
          return e;
        }
      })();
      expect(err).toBeInstanceOf(InvalidDefinitionError);
      expect((err as InvalidDefinitionError).code).toBe('invalid_definition');
      expect((err as InvalidDefinitionError).path).toBe('toolClass[io].lease');
      expect((err as Error).message).toMatch(message);
      expect((err as Error).message).toContain('toolClass[io].lease');
    });
  }

  it('refuses values that are not strings or numbers', () => {
    expect(() => parseDuration(null as unknown as string, 'x')).toThrow(InvalidDefinitionError);
    expect(() => parseDuration({} as unknown as string, 'x')).toThrow(/expected a duration/);
  });
});
