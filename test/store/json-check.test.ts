import { describe, expect, it } from 'vitest';
import { InvalidInputError } from '../../src/errors.js';
import { checkJson, jsonSizeBound, toJsonText } from '../../src/store/json.js';
import { MAX_JSON_BYTES, MAX_JSON_DEPTH } from '../../src/store/limits.js';

/**
 * checkJson (the finish rows' check, which does not serialise) and toJsonText against the check
 * they replace (serialise each value, then measure it): the same values accepted, the same text,
 * the same errors (message, path, details) for every value refused — not JSON, too deep, too large.
 */

// ---- the reference: toJsonText as it was before checkJson (commit e51d83d) -------------------
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;
function refText(text: string, path: string, what: string): void {
  if (text.includes('\u0000')) throw new InvalidInputError(`${what} contains \\u0000, which PostgreSQL cannot store`, path);
  if (LONE_SURROGATE.test(text)) {
    throw new InvalidInputError(`${what} contains a lone UTF-16 surrogate (not Unicode text), which PostgreSQL cannot store`, path);
  }
}
function refCheck(value: unknown, path: string, seen: Set<object>, depth: number): void {
  switch (typeof value) {
    case 'string':
      refText(value, path, 'string');
      return;
    case 'boolean':
      return;
    case 'number':
      if (!Number.isFinite(value)) throw new InvalidInputError(`number ${value} is not JSON`, path);
      return;
    case 'bigint':
      throw new InvalidInputError('BigInt is not JSON; pass it as a string', path);
    case 'undefined':
      throw new InvalidInputError('undefined is not JSON', path);
    case 'function':
    case 'symbol':
      throw new InvalidInputError(`${typeof value} is not JSON`, path);
    case 'object': {
      if (value === null) return;
      if (seen.has(value)) throw new InvalidInputError('circular reference is not JSON', path);
      if (depth >= MAX_JSON_DEPTH) {
        throw new InvalidInputError(`nested more than ${MAX_JSON_DEPTH} levels deep`, path, { limit: MAX_JSON_DEPTH });
      }
      seen.add(value);
      if (Array.isArray(value)) {
        value.forEach((item, i) => {
          refCheck(item, `${path}[${i}]`, seen, depth + 1);
        });
      } else {
        const proto = Object.getPrototypeOf(value);
        if (proto !== Object.prototype && proto !== null) {
          const name = (value as { constructor?: { name?: string } }).constructor?.name ?? 'object';
          throw new InvalidInputError(`${name} instance is not plain JSON; convert it first`, path);
        }
        for (const [key, item] of Object.entries(value)) {
          const at = `${path}.${key}`;
          refText(key, at, 'key');
          if (item === undefined) continue;
          refCheck(item, at, seen, depth + 1);
        }
      }
      seen.delete(value);
      return;
    }
  }
}
function refToJsonText(value: unknown, path = '$'): string {
  refCheck(value, path, new Set(), 0);
  const text = JSON.stringify(value);
  if (text.length > MAX_JSON_BYTES / 3 && Buffer.byteLength(text) > MAX_JSON_BYTES) {
    const bytes = Buffer.byteLength(text);
    throw new InvalidInputError(`the value is ${bytes} bytes as JSON, more than ${MAX_JSON_BYTES}`, path, { limit: MAX_JSON_BYTES });
  }
  return text;
}

// ---- what each gives: the text, or the error's every public field ----------------------------
type Outcome = { text: string } | { error: { name: string; message: string; code: unknown; path: unknown; details: unknown } };
function outcome(f: () => string | undefined): Outcome {
  try {
    return { text: f() ?? '(checked)' };
  } catch (err) {
    const e = err as InvalidInputError & { details?: unknown };
    return { error: { name: e.constructor.name, message: e.message, code: e.code, path: e.path, details: e.details } };
  }
}
const sameAsReference = (value: unknown, path = '$') => {
  const ref = outcome(() => refToJsonText(value, path));
  expect(outcome(() => toJsonText(value, path))).toEqual(ref);
  // checkJson: the same errors; accepts exactly what the reference accepts (its text is made later, by JSON.stringify).
  const checked = outcome(() => {
    checkJson(value, path);
    return JSON.stringify(value);
  });
  expect(checked).toEqual(ref);
  return ref;
};

// ---- values: a seeded generator of JSON and not-quite-JSON ------------------------------------
function rng(seed: number) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const f64 = new Float64Array(1);
const u32 = new Uint32Array(f64.buffer);
const CHARS = [
  'a',
  'Z',
  '0',
  ' ',
  '"',
  '\\',
  '/',
  '\n',
  '\t',
  '\b',
  '\u0001',
  '\u001f',
  '\u007f',
  'é',
  '\u0800',
  '€',
  '😀',
  '\ud83d',
  '\ude00',
  '\u2028',
  '\u0000',
];

function generator(seed: number, bad: number) {
  const r = rng(seed);
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
  const str = (max: number) => {
    let s = '';
    const n = Math.floor(r() * max);
    for (let i = 0; i < n; i++) {
      const c = pick(CHARS);
      // lone surrogates and NUL only with probability `bad` per string
      if ((c === '\ud83d' || c === '\ude00' || c === '\u0000') && r() > bad) continue;
      s += c;
    }
    return s;
  };
  const num = () => {
    switch (Math.floor(r() * 6)) {
      case 0:
        return Math.floor(r() * 1000) - 500;
      case 1:
        return -0;
      case 2: {
        u32[0] = Math.floor(r() * 2 ** 32);
        u32[1] = Math.floor(r() * 2 ** 32);
        return f64[0]; // any double, NaN and Infinity included
      }
      case 3:
        return (r() - 0.5) * 10 ** Math.floor(r() * 40 - 20);
      case 4:
        return pick([Number.MAX_VALUE, -Number.MIN_VALUE, -1.2345678901234567e-308, -0.0000012345678901234567, -123456789012345680000]);
      default:
        return r();
    }
  };
  const oddities = (): unknown =>
    pick([
      undefined,
      () => 1,
      Symbol('s'),
      10n,
      Number.NaN,
      Number.NEGATIVE_INFINITY,
      new Date(0),
      new Map(),
      Object.create(null),
      Object.assign(Object.create(null), { a: 1 }),
      new (class Point {
        x = 1;
      })(),
    ]);
  const value = (depth: number): unknown => {
    const k = r();
    if (k < bad / 4) return oddities();
    if (depth > 4 || k < 0.45) {
      const p = r();
      return p < 0.35 ? str(12) : p < 0.7 ? num() : p < 0.85 ? r() < 0.5 : null;
    }
    if (k < 0.7) {
      const n = Math.floor(r() * 6);
      const a: unknown[] = [];
      for (let i = 0; i < n; i++) a.push(value(depth + 1));
      if (r() < 0.1) a.length += 2; // holes
      if (r() < 0.05) delete a[0];
      return a;
    }
    const o: Record<string, unknown> = {};
    const n = Math.floor(r() * 6);
    for (let i = 0; i < n; i++) o[r() < 0.2 ? str(6) : `k${i}`] = r() < 0.1 ? undefined : value(depth + 1);
    return o;
  };
  return value;
}

const nest = (depth: number, leaf: unknown): unknown => {
  let v = leaf;
  for (let i = 0; i < depth; i++) v = i % 2 === 0 ? [v] : { d: v };
  return v;
};

describe('checkJson / toJsonText against the serialise-then-measure check', () => {
  it('the same text and the same errors over 20,000 generated values (JSON and not)', () => {
    let accepted = 0;
    let refused = 0;
    for (let seed = 1; seed <= 20_000; seed++) {
      const value = generator(seed, seed % 3 === 0 ? 0.3 : 0.01)(0);
      const ref = sameAsReference(value, seed % 2 === 0 ? '$' : 'finish.result');
      if ('text' in ref) {
        accepted++;
        // the size bound the walk counts is never below the real size
        expect(jsonSizeBound(value)).toBeGreaterThanOrEqual(Buffer.byteLength(ref.text));
      } else refused++;
    }
    expect(accepted).toBeGreaterThan(5_000);
    expect(refused).toBeGreaterThan(1_000);
  });

  it('bounds the worst cases: every escaped character, the longest numbers, holes', () => {
    const worst: unknown[] = [
      '\u0001'.repeat(100),
      '"'.repeat(50),
      '€😀'.repeat(30),
      [-1.2345678901234567e-308, -0.0000012345678901234567, -123456789012345680000, -Number.MIN_VALUE],
      new Array(10),
      { ['\u001f'.repeat(10)]: '\u0002', '': null, '😀': [true, false] },
    ];
    for (const v of worst) {
      sameAsReference(v);
      expect(jsonSizeBound(v)).toBeGreaterThanOrEqual(Buffer.byteLength(JSON.stringify(v)));
    }
  });

  it('depth: 128 levels pass, 129 are refused at the same path', () => {
    expect('text' in sameAsReference(nest(MAX_JSON_DEPTH, 1))).toBe(true);
    expect(sameAsReference(nest(MAX_JSON_DEPTH + 1, 1))).toMatchObject({ error: { details: { limit: MAX_JSON_DEPTH } } });
    expect(sameAsReference({ x: nest(MAX_JSON_DEPTH, 'a\u0000') })).toMatchObject({
      error: { message: expect.stringMatching(/levels deep/) },
    });
  });

  it('circular and shared references', () => {
    const a: Record<string, unknown> = { n: 1 };
    a.self = [{ back: a }];
    expect(sameAsReference(a)).toMatchObject({ error: { path: '$.self[0].back' } });
    const shared = { s: [1] };
    expect(sameAsReference([shared, { again: shared }])).toEqual({ text: '[{"s":[1]},{"again":{"s":[1]}}]' });
  });

  it('size: just under and just over MAX_JSON_BYTES, ASCII, escaped and multi-byte, and where the bound passes the limit but the text does not', () => {
    const cases: unknown[] = [];
    const M = MAX_JSON_BYTES;
    // JSON text = 2 quotes + content: exactly M bytes, then M + 1
    cases.push('a'.repeat(M - 2), 'a'.repeat(M - 1));
    // 3-byte characters: M - 2 = 3k + rest
    cases.push(
      `${'€'.repeat(Math.floor((M - 2) / 3))}${'a'.repeat((M - 2) % 3)}`,
      `${'€'.repeat(Math.floor((M - 2) / 3))}${'a'.repeat(((M - 2) % 3) + 1)}`,
    );
    // escapes: "\n" is 2 bytes of text for 1 unit; the array's text is 2k + 8 bytes
    cases.push(['\n'.repeat((M - 8) / 2), 'a'], ['\n'.repeat((M - 8) / 2), 'aa']);
    // the walk's bound is over the limit (6 bytes per unit), the text well under it: accepted, as before
    cases.push({ s: 'a'.repeat(Math.floor(M / 4)) });
    // many small values whose sum passes the limit
    cases.push(Array.from({ length: 600_000 }, (_, i) => `v${i}-${'x'.repeat(20)}`));
    let over = 0;
    for (const v of cases) {
      const ref = sameAsReference(v, 'finish.result');
      if ('error' in ref) {
        over++;
        expect(ref.error.details).toEqual({ path: 'finish.result', limit: M });
      }
    }
    expect(over).toBe(3 + 1); // the three "+1" cases and the 600,000 strings
  });

  it('the error paths spell keys and indexes as before', () => {
    expect(sameAsReference({ a: [0, { 'b.c': [1n] }] }, 'finish.next.input')).toMatchObject({
      error: { path: 'finish.next.input.a[1].b.c[0]' },
    });
    expect(sameAsReference({ 'k\u0000': 1 })).toMatchObject({ error: { path: '$.k\u0000', message: expect.stringMatching(/^key/) } });
    expect(sameAsReference(['\ud800x'])).toMatchObject({ error: { path: '$[0]', message: expect.stringMatching(/surrogate/) } });
  });
});
