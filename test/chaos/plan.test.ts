import { describe, expect, it } from 'vitest';
import { ENSURE_WITHIN_MS, planStream } from '../../chaos/driver.js';
import { heldRequest, planFaults, RANDOM_FAULTS } from '../../chaos/faults.js';
import { Prng } from '../../chaos/prng.js';
import { plannedKinds, SOAK_CONFIG } from '../../chaos/soak.js';

/** The seed's plan (chaos/prng.ts): the same seed plans the same faults and submits; items do not shift each other. */
describe('chaos plan', () => {
  it('one seed, one schedule of faults and submits; another seed, another', () => {
    const plan = (seed: number) => ({
      faults: planFaults(new Prng(seed).fork('faults'), 180_000),
      submits: planStream(new Prng(seed).fork('driver').fork('stream'), seed, 180_000, 3),
    });
    expect(plan(13)).toEqual(plan(13));
    expect(plan(14)).not.toEqual(plan(13));
    const p = plan(13);
    expect(p.submits.length).toBeGreaterThan(400);
    expect(p.submits.every((s, i) => s.id === String(i + 1) && s.key === `chaos-13-${i + 1}`)).toBe(true);
  });

  it('a shuffled round of every kind first, floods capped and early, every fault inside the duration', () => {
    for (const seed of [1, 7, 13, 30]) {
      const { faults, deployAtMs } = planFaults(new Prng(seed).fork('faults'), 180_000);
      expect(new Set(faults.slice(0, RANDOM_FAULTS.length).map((f) => f.kind))).toEqual(new Set(RANDOM_FAULTS));
      const floods = faults.filter((f) => f.kind === 'tenant_flood');
      expect(floods.length).toBeLessThanOrEqual(2);
      for (const f of floods.slice(1)) expect(f.atMs).toBeLessThanOrEqual(90_000);
      expect(faults.every((f, i) => f.k === i && f.atMs < 180_000 && (i === 0 || f.atMs > faults[i - 1]!.atMs))).toBe(true);
      expect(deployAtMs).toBeGreaterThanOrEqual(54_000);
      expect(deployAtMs).toBeLessThanOrEqual(108_000);
    }
  });

  it('a longer soak plans the same first faults (each from its own fork)', () => {
    const short = planFaults(new Prng(5).fork('faults'), 60_000).faults;
    const long = planFaults(new Prng(5).fork('faults'), 600_000).faults;
    expect(long.slice(0, short.length)).toEqual(short);
  });

  it('every seed plans an early cancel of a pipeline, a duplicate submit and a flaky run; coverage asks only the kinds planned', () => {
    for (const seed of [1, 7, 13, 30, 99]) {
      const submits = planStream(new Prng(seed).fork('driver').fork('stream'), seed, 180_000, 3);
      const early = submits.filter((p) => p.atMs < ENSURE_WITHIN_MS);
      expect(early.some((p) => p.workflow === 'chaos_pipeline' && p.cancelAfterMs !== null && p.cancelAfterMs <= 500)).toBe(true);
      expect(early.some((p) => p.againAfterMs !== null || p.twiceAtOnce)).toBe(true);
      expect(early.some((p) => p.workflow === 'chaos_flaky')).toBe(true);
    }
    const kinds = (seed: number, durationMs: number) => {
      const { faults, deployAtMs } = planFaults(new Prng(seed).fork('faults'), durationMs);
      return plannedKinds(faults, deployAtMs, planStream(new Prng(seed).fork('driver').fork('stream'), seed, durationMs, 3), durationMs);
    };
    // The CI soak (seed 13, 180 s) is asked for every kind, the driver's included.
    expect(new Set(kinds(13, 180_000))).toEqual(new Set(SOAK_CONFIG.coverage!.faultKinds));
    expect(SOAK_CONFIG.coverage!.faultKinds).toEqual(expect.arrayContaining(['retry', 'cancel', 'duplicate_submit']));
    // A 20 s soak plans fewer kinds and is asked only for those.
    const short = kinds(13, 20_000);
    expect(short.length).toBeLessThan(SOAK_CONFIG.coverage!.faultKinds.length);
    const planned = new Set(planFaults(new Prng(13).fork('faults'), 20_000).faults.map((f) => f.kind));
    for (const k of RANDOM_FAULTS) expect(short.includes(k)).toBe(planned.has(k));
  });

  it('heldRequest: the key and fence of a held effect request, nothing for a partial or other request', () => {
    const req = 'POST /effect HTTP/1.1\r\nhost: x\r\nidempotency-key: case:s7-51-a\r\nx-execution-fence: 109\r\n\r\n{"ref":1}';
    expect(heldRequest(Buffer.from(req))).toEqual({ key: 'case:s7-51-a', fence: '109' });
    expect(heldRequest(Buffer.from(req.slice(0, 40)))).toBeNull();
    expect(heldRequest(Buffer.from('POST /flaky HTTP/1.1\r\nhost: x\r\n\r\n{}'))).toBeNull();
  });
});
