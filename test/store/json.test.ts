import { describe, expect, it } from 'vitest';
import { InvalidInputError } from '../../src/errors.js';
import { toJsonText } from '../../src/store/json.js';

describe('toJsonText', () => {
  it('passes plain JSON through', () => {
    expect(toJsonText({ a: [1, 'x', null, true, { b: 2.5 }], skip: undefined })).toBe('{"a":[1,"x",null,true,{"b":2.5}]}');
    const shared = { s: 1 };
    expect(toJsonText([shared, shared])).toBe('[{"s":1},{"s":1}]'); // shared, not circular
  });
  it.each([
    ['BigInt', { a: 1n }, '$.a'],
    ['NaN', [Number.NaN], '$[0]'],
    ['Infinity', { x: { y: Infinity } }, '$.x.y'],
    ['function', { f: () => 1 }, '$.f'],
    ['symbol', [Symbol('s')], '$[0]'],
    ['undefined in an array', [undefined], '$[0]'],
    ['NUL in a string', { s: 'a\u0000' }, '$.s'],
    ['NUL in a key', { ['k\u0000']: 1 }, '$.k\u0000'],
    ['Map', { m: new Map() }, '$.m'],
  ])('refuses %s with the path', (_what, value, path) => {
    expect(() => toJsonText(value)).toThrow(InvalidInputError);
    try {
      toJsonText(value);
    } catch (e) {
      expect((e as InvalidInputError).path).toBe(path);
    }
  });
  it('refuses a circular reference', () => {
    const a: Record<string, unknown> = {};
    a.b = { c: a };
    expect(() => toJsonText(a)).toThrow(/circular/);
  });
});
