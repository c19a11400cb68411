import { describe, expect, it } from 'vitest';
import { bestByVariant, cpuPerStage, type MatrixResult, moreProcsChecks, parseConcurrencies } from '../bench/matrix.js';

const r = (mode: string, procs: number, concurrency: number, stagesPerS: number, allOk = true): MatrixResult => ({
  mode,
  procs,
  concurrency,
  base: `${mode === 'fast' ? 'fast_path' : 'bullmq'},procs=${procs}`,
  stagesPerS,
  allOk,
});

describe('bench matrix (bench/matrix.ts)', () => {
  it('parses a concurrency list in order, without duplicates, and rejects anything else', () => {
    expect(parseConcurrencies('10')).toEqual([10]);
    expect(parseConcurrencies('10, 50,10,100')).toEqual([10, 50, 100]);
    for (const bad of ['', '10,', '0', '10,x', '2.5', '-4']) expect(() => parseConcurrencies(bad), bad).toThrow(/--concurrency/);
  });

  it("picks each variant's best concurrency, preferring runs that all succeeded", () => {
    const best = bestByVariant([r('fast', 4, 10, 2100), r('fast', 4, 50, 4600), r('fast', 4, 100, 4400), r('fast', 1, 10, 1500)]);
    expect(best.get('fast_path,procs=4')?.concurrency).toBe(50);
    expect(best.get('fast_path,procs=1')?.concurrency).toBe(10);
    const failed = bestByVariant([r('queue', 1, 10, 1000), r('queue', 1, 50, 9000, false)]);
    expect(failed.get('bullmq,procs=1')?.concurrency).toBe(10);
    expect(bestByVariant([r('queue', 4, 10, 1000, false)]).has('bullmq,procs=4')).toBe(false); // no run all succeeded: no best
  });

  it('checks that more processes are never slower, per mode and concurrency', () => {
    const checks = moreProcsChecks([
      r('fast', 1, 10, 1000),
      r('fast', 4, 10, 2000),
      r('fast', 1, 100, 5300),
      r('fast', 4, 100, 4433),
      r('queue', 1, 10, 900),
      { ...r('queue', 4, 10, 100), base: 'bullmq,procs=4,nograce' },
    ]);
    expect(checks.map((c) => [c.mode, c.concurrency, c.ok, c.ratios])).toEqual([
      ['fast', 10, true, [2]],
      ['fast', 100, false, [0.836]],
    ]);
  });

  it('gives CPU ms per stage split into workers and PostgreSQL', () => {
    expect(cpuPerStage({ ratchet_workers: 4660, postgres_this_db: 5520, postgres: 6000 }, 20_000)).toEqual({
      workers: 0.233,
      postgres: 0.276,
      total: 0.509,
    });
    expect(cpuPerStage({}, 0)).toEqual({ workers: 0, postgres: 0, total: 0 });
  });
});
