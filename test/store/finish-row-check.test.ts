import { describe, expect, it } from 'vitest';
import { encodeFinishRow, finishRowCheck } from '../../src/store/finish.js';

/**
 * encodeFinishRow's cheap pre-check (the engine's rows skip the zod parse) only ever accepts:
 * whatever it accepts, the zod schema accepts too and parses to the same value, so the row is
 * encoded as before; anything else goes to zod, which gives the error.
 */
const { plain, schema } = finishRowCheck;
/** The encoding, or the error of the rules after the shape (a retry needs retryDelayMs, ...). */
const encoded = (row: unknown) => {
  try {
    return encodeFinishRow(row as never);
  } catch (err) {
    return `${(err as Error).message}`;
  }
};

const engineRows: Record<string, unknown>[] = [
  {
    stageId: '1',
    fence: '2',
    outcome: 'succeeded',
    result: { a: 1 },
    data: { durationMs: 3 },
    next: { seq: 2, input: { x: 1 } },
    claimNext: true,
  },
  { stageId: '1', fence: '2', outcome: 'succeeded', result: null, data: {}, run: { state: 'succeeded', result: { r: 1 } } },
  { stageId: '1', fence: '2', outcome: 'queued', retryDelayMs: 1000, error: { code: 'x', message: 'y' }, data: { decision: 'retry' } },
  { stageId: '1', fence: '2', outcome: 'failed', error: { code: 'x' }, asValue: true, next: { seq: 3, input: null } },
  {
    stageId: '1',
    fence: '2',
    outcome: 'failed',
    error: { code: 'x' },
    run: { state: 'failed', error: { code: 'x' } },
    next: { seq: 2, input: null, error: { code: 'e' } },
  },
  { stageId: '9223372036854775807', fence: '1', outcome: 'waiting', waitFor: 3, effectKey: 'k-1' },
  { stageId: '1', fence: '2', outcome: 'skipped', next: { seq: 2, input: undefined }, nextKeepInput: true, result: undefined },
  { stageId: '1', fence: '2', outcome: 'cancelled' },
];

/** Values to put in each field: right and wrong types, edges of every range. */
const probes: unknown[] = [
  undefined,
  null,
  true,
  false,
  0,
  1,
  -1,
  1.5,
  2 ** 31 - 1,
  2 ** 31,
  Number.NaN,
  Number.POSITIVE_INFINITY,
  2 ** 53,
  '',
  '1',
  '01',
  'x',
  '12345678901234567890',
  'succeeded',
  'failed',
  'queued',
  'waiting',
  'expired',
  'bogus',
  'a\u0000b',
  'k'.repeat(500),
  'k'.repeat(501),
  [],
  [1],
  {},
  { seq: 1, input: 1 },
  { seq: 0, input: 1 },
  { seq: 1 },
  { seq: 1, input: 1, extra: 1 },
  { state: 'succeeded' },
  { state: 'bogus' },
  { state: 'failed', error: {}, other: 1 },
  new Date(0),
  Object.create(null),
  [{ seq: 1 }],
  { id: 'x' },
];
const fields = [
  'stageId',
  'fence',
  'outcome',
  'result',
  'error',
  'retryDelayMs',
  'asValue',
  'waitFor',
  'next',
  'claimNext',
  'nextKeepInput',
  'plan',
  'run',
  'child',
  'effectKey',
  'data',
  'extra',
  '__proto__',
];

describe('finish row pre-check', () => {
  it('takes the engine-built rows without zod', () => {
    for (const row of engineRows) expect(plain(row), JSON.stringify(row)).toBe(true);
  });

  it('accepts nothing the schema refuses, and what it accepts parses to the same value (so it encodes the same)', () => {
    let accepted = 0;
    let checked = 0;
    const rows: unknown[] = [null, undefined, 'x', [], new Date(0), ...engineRows];
    for (const base of engineRows) {
      for (const f of fields) {
        for (const v of probes) {
          const row = { ...base };
          if (f === '__proto__') Object.setPrototypeOf(row, v !== null && typeof v === 'object' ? v : Array.prototype);
          else row[f] = v;
          rows.push(row);
          const without = { ...base };
          delete without[f];
          rows.push(without);
        }
      }
    }
    for (const row of rows) {
      checked++;
      if (!plain(row)) continue;
      accepted++;
      const z = schema.safeParse(row);
      expect(z.success, JSON.stringify(row)).toBe(true);
      expect(z.data).toEqual(row);
      expect(encoded(row)).toEqual(encoded(z.data));
    }
    expect(accepted).toBeGreaterThan(100);
    expect(checked - accepted).toBeGreaterThan(100);
  });

  it('a row it does not take still gets zod: plans and child runs are validated, bad rows get the schema error', () => {
    expect(plain({ stageId: '1', fence: '2', outcome: 'succeeded', plan: [] })).toBe(false);
    expect(() => encodeFinishRow({ stageId: '1', fence: '2', outcome: 'succeeded', plan: [] })).toThrow(/plan/);
    expect(() => encodeFinishRow({ stageId: '1', fence: '2', outcome: 'succeeded', extra: 1 } as never)).toThrow();
    expect(() => encodeFinishRow({ stageId: 'x', fence: '2', outcome: 'succeeded' })).toThrow(/stageId/);
    expect(() => encodeFinishRow({ stageId: '1', fence: '2', outcome: 'queued', retryDelayMs: -1 })).toThrow(/retryDelayMs/);
  });
});
