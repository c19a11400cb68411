import { Counter, Histogram, Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { createMetrics } from '../../src/observability/metrics.js';

/**
 * PERF-NOTES §15: stage_duration's observe and stages_claimed's inc count a frozen label set
 * into the cell prom-client made for it, without validating and hashing the labels again. The
 * scrape must be what plain prom-client metrics fed the same calls show, through resets,
 * removes, zero(), equal sets that are other objects, unfrozen sets and refused calls.
 */
const buckets = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];

function pair() {
  const cached = createMetrics(new Registry());
  const plainRegistry = new Registry();
  const registers = [plainRegistry];
  const plain = {
    stageDuration: new Histogram({
      name: 'ratchet_stage_duration_seconds',
      help: 'One attempt from claim to finish',
      labelNames: ['tool_class', 'workflow', 'model', 'outcome'],
      buckets,
      registers,
    }),
    stagesClaimed: new Counter({
      name: 'ratchet_stages_claimed_total',
      help: 'Attempts claimed',
      labelNames: ['tool_class', 'workflow'],
      registers,
    }),
  };
  const scrape = async () => {
    const names = ['ratchet_stage_duration_seconds', 'ratchet_stages_claimed_total'];
    const a = await Promise.all(names.map((n) => cached.registry.getSingleMetricAsString(n)));
    const b = await Promise.all(names.map((n) => plainRegistry.getSingleMetricAsString(n)));
    return { a: a.join('\n'), b: b.join('\n') };
  };
  return { cached, plain, scrape };
}

/** A frozen label set whose reads are counted (prom-client reads each label to validate and hash). */
function counted(values: Record<string, string>) {
  const reads = { n: 0 };
  const labels = {} as Record<string, string>;
  for (const [k, v] of Object.entries(values)) {
    Object.defineProperty(labels, k, {
      enumerable: true,
      get() {
        reads.n++;
        return v;
      },
    });
  }
  return { labels: Object.freeze(labels), reads };
}

describe('metric cells kept per frozen label set', () => {
  it('scrapes the same as plain prom-client, call for call', async () => {
    const { cached, plain, scrape } = pair();
    const a = Object.freeze({ tool_class: 'c', workflow: 'w', outcome: 'finished' });
    const aTwin = Object.freeze({ tool_class: 'c', workflow: 'w', outcome: 'finished' });
    const m = Object.freeze({ tool_class: 'c', workflow: 'w', model: 'gpt', outcome: 'timeout' });
    const loose = { tool_class: 'c', workflow: 'x', outcome: 'finished' };
    const claimedA = Object.freeze({ tool_class: 'c', workflow: 'w' });
    const claimedB = Object.freeze({ tool_class: 'd', workflow: 'unknown' });
    const values = [0, 0.0001, 0.05, 0.07, 0.1, 1, 2.5, 9.99, 300, 301, 1e9, 0.2];
    const both = (f: (t: { stageDuration: Histogram<string>; stagesClaimed: Counter<string> }) => void) => {
      let e1: unknown = null;
      let e2: unknown = null;
      try {
        f(cached as never);
      } catch (err) {
        e1 = (err as Error).message;
      }
      try {
        f(plain as never);
      } catch (err) {
        e2 = (err as Error).message;
      }
      expect(e1).toEqual(e2);
    };
    for (const v of values) {
      both((t) => t.stageDuration.observe(a, v));
      both((t) => t.stageDuration.observe(m, v / 3));
      both((t) => t.stageDuration.observe(aTwin, v));
      both((t) => t.stageDuration.observe(loose, v));
      both((t) => t.stagesClaimed.inc(claimedA));
      both((t) => t.stagesClaimed.inc(claimedB, 2));
    }
    let s = await scrape();
    expect(s.a).toEqual(s.b);
    expect(s.a).toContain('ratchet_stage_duration_seconds_bucket{le="0.05",tool_class="c",workflow="w",outcome="finished"}');

    // Refused calls are refused alike (and change nothing).
    both((t) => t.stageDuration.observe(a, Number.NaN));
    both((t) => t.stageDuration.observe(Object.freeze({ nope: 'x' }) as never, 1));
    both((t) => t.stagesClaimed.inc(claimedA, -1));
    both((t) => t.stagesClaimed.inc(Object.freeze({ nope: 'x' }) as never));
    // reset, remove and zero replace the cells: the next calls must land in the new ones.
    both((t) => t.stageDuration.reset());
    both((t) => t.stagesClaimed.reset());
    for (const v of values) {
      both((t) => t.stageDuration.observe(m, v));
      both((t) => t.stageDuration.observe(a, v));
      both((t) => t.stagesClaimed.inc(claimedB));
      both((t) => t.stagesClaimed.inc(claimedA));
    }
    both((t) => t.stageDuration.remove(a));
    both((t) => t.stagesClaimed.remove(claimedA));
    both((t) => t.stageDuration.zero(m));
    for (const v of values) {
      both((t) => t.stageDuration.observe(a, v));
      both((t) => t.stageDuration.observe(m, v));
      both((t) => t.stagesClaimed.inc(claimedA));
    }
    s = await scrape();
    expect(s.a).toEqual(s.b);
    expect(await cached.stagesClaimed.get()).toEqual(await plain.stagesClaimed.get());
  });

  it('a frozen label set is read once, at its first call; an unfrozen one at every call', () => {
    const metrics = createMetrics(new Registry());
    const d = counted({ tool_class: 'c', workflow: 'w', outcome: 'finished' });
    const c = counted({ tool_class: 'c', workflow: 'w' });
    metrics.stageDuration.observe(d.labels, 0.01);
    metrics.stagesClaimed.inc(c.labels);
    const afterFirst = { d: d.reads.n, c: c.reads.n };
    for (let i = 0; i < 100; i++) {
      metrics.stageDuration.observe(d.labels, 0.01);
      metrics.stagesClaimed.inc(c.labels);
    }
    expect(d.reads.n).toBe(afterFirst.d);
    expect(c.reads.n).toBe(afterFirst.c);
    const loose = { tool_class: 'c', workflow: 'w', outcome: 'finished' };
    metrics.stageDuration.observe(loose, 0.01);
    loose.outcome = 'timeout'; // an unfrozen set may change: never kept
    metrics.stageDuration.observe(loose, 0.01);
  });
});
