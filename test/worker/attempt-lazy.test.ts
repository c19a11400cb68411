import { afterEach, describe, expect, it } from 'vitest';
import type { AbortReason } from '../../src/errors.js';
import { silentLogger } from '../../src/logger.js';
import { withTraceparent } from '../../src/observability/tracing.js';
import type { ClaimedStage } from '../../src/store/index.js';
import { monotonicNow } from '../../src/store/index.js';
import { Attempt, watchedDeadlines } from '../../src/worker/attempt.js';
import type { EventWriter } from '../../src/worker/event-writer.js';
import type { ToolContext } from '../../src/definitions/types.js';
import { claimedStage } from '../helpers/claimed-stage.js';

/**
 * PERF-NOTES §15: the attempt's AbortSignal is made at its first read (an abort before that is
 * kept and the signal made later is already aborted with it), and one timer watches every
 * attempt's confirmation deadline (never before it, promptly after). No database.
 */
const events = { push: () => {} } as unknown as EventWriter;
const stage = (id: string, confirmedInMs = 59_000): ClaimedStage => claimedStage(id, { confirmedUntil: monotonicNow() + confirmedInMs });
const made: Attempt[] = [];
const attempt = (id: string, confirmedInMs?: number) => {
  const a = new Attempt(stage(id, confirmedInMs), 1000, events, silentLogger());
  made.push(a);
  return a;
};
afterEach(() => {
  for (const a of made.splice(0)) a.end();
});
const code = (s: AbortSignal) => (s.reason as { code: string }).code;

describe('the attempt signal is made at its first read', () => {
  it('no read, no signal: aborted state, reasons and beginEffect answer without it', () => {
    const a = attempt('1');
    expect(a.signalMade).toBe(false);
    expect(a.aborted).toBe(false);
    expect(a.abortReason).toBeNull();
    expect(a.ownershipLapsed).toBe(false);
    a.beginEffect('r1');
    a.abort('cancelled', 'gone');
    expect(a.aborted).toBe(true);
    expect(a.abortReason).toBe('cancelled');
    expect(a.finalReason).toBe('cancelled');
    expect(() => a.beginEffect('r2')).toThrow(expect.objectContaining({ code: 'cancelled' }));
    a.end();
    expect(a.signalMade).toBe(false);
  });

  for (const reason of ['ownership_unknown', 'timeout', 'lease_lost', 'cancelled', 'shutdown'] as AbortReason[]) {
    it(`an abort (${reason}) before the first read: the signal is made already aborted, with that reason`, () => {
      const a = attempt('2');
      a.abort(reason, `because ${reason}`);
      expect(a.signalMade).toBe(false);
      const s = a.signal;
      expect(s.aborted).toBe(true);
      expect(code(s)).toBe(reason);
      expect((s.reason as Error).message).toBe(`because ${reason}`);
      expect(a.signal).toBe(s); // one signal
      let heard = 0;
      s.addEventListener('abort', () => heard++);
      a.abort('shutdown'); // a signal aborts once
      expect(heard).toBe(0);
      expect(code(a.signal)).toBe(reason);
    });
  }

  it('an abort after the first read reaches the listener, with its reason; the first reason stays', () => {
    const a = attempt('3');
    const s = a.signal;
    expect(s.aborted).toBe(false);
    const heard: string[] = [];
    s.addEventListener('abort', () => heard.push(`${code(s)} final=${a.finalReason} aborted=${a.aborted}`));
    a.abort('ownership_unknown');
    a.abort('lease_lost');
    expect(heard).toEqual(['ownership_unknown final=null aborted=true']);
    expect(a.ownershipLapsed).toBe(true);
    expect(a.abortReason).toBe('lease_lost');
    expect(code(a.signal)).toBe('ownership_unknown');
  });

  it('ownership_unknown then a final reason before the first read: the signal says ownership_unknown, the attempt the final one', () => {
    const a = attempt('4');
    a.abort('ownership_unknown');
    a.abort('timeout');
    expect(a.ownershipLapsed).toBe(true);
    expect(a.abortReason).toBe('timeout');
    expect(code(a.signal)).toBe('ownership_unknown');
  });
});

describe("tracing's ctx copy keeps the signal getter", () => {
  it('copies like a spread, but an accessor as an accessor: the signal is made at the tool’s read, not at the copy', () => {
    const a = attempt('5');
    const sym = Symbol('s');
    const ctx = {
      get signal() {
        return a.signal;
      },
      fence: '5',
      idempotencyKey: 'k',
      attempt: 1,
      runId: 'r',
      stageId: '5',
      heartbeat() {},
      beginEffect() {},
      log: silentLogger(),
      traceparent: 'old',
      [sym]: 1,
    } as unknown as ToolContext;
    Object.defineProperty(ctx, 'hidden', { value: 1, enumerable: false });
    const copy = withTraceparent(ctx, 'new');
    expect(a.signalMade).toBe(false);
    expect(Object.keys(copy).sort()).toEqual(Object.keys(ctx).sort()); // what a spread copies (not made here: it reads the getter)
    expect((copy as unknown as Record<symbol, unknown>)[sym]).toBe(1);
    expect('hidden' in copy).toBe(false);
    expect(copy.traceparent).toBe('new');
    expect(ctx.traceparent).toBe('old');
    expect(copy.fence).toBe('5');
    expect(copy.heartbeat).toBe(ctx.heartbeat);
    a.abort('cancelled');
    expect(a.signalMade).toBe(false);
    expect(code(copy.signal)).toBe('cancelled');
    expect(copy.signal).toBe(a.signal);
  });
});

describe('one timer watches every confirmation deadline', () => {
  /** Resolves with the monotonic time the signal aborted. */
  const abortedAt = (a: Attempt) =>
    new Promise<number>((resolve) => {
      const s = a.signal;
      if (s.aborted) resolve(-1);
      else s.addEventListener('abort', () => resolve(monotonicNow()), { once: true });
    });
  // Timer lateness allowed after the deadline (a loaded 2-core machine runs the tests: a GC or a busy
  // sibling fork can hold the event loop for hundreds of ms). "Not before" is the exact bound.
  const LATE_MS = 2000;

  it('each attempt aborts ownership_unknown not before its deadline and soon after, whatever the order they came in', async () => {
    const before = watchedDeadlines();
    const later = attempt('w1', 300);
    const sooner = attempt('w2', 120); // earlier than the armed one: re-arms
    const middle = attempt('w3', 200);
    const ended = attempt('w4', 100);
    const confirmed = attempt('w5', 150);
    expect(watchedDeadlines()).toBe(before + 5);
    ended.end();
    expect(watchedDeadlines()).toBe(before + 4);
    confirmed.confirm(monotonicNow() + 400, new Date(Date.now() + 1000)); // moved later before its deadline
    const all = [later, sooner, middle, confirmed];
    const times = await Promise.all(all.map(abortedAt));
    for (const [i, a] of all.entries()) {
      expect(times[i]).toBeGreaterThanOrEqual(a.confirmedUntil);
      expect(times[i]).toBeLessThan(a.confirmedUntil + LATE_MS);
      expect(code(a.signal)).toBe('ownership_unknown');
    }
    expect(ended.aborted).toBe(false);
    expect(watchedDeadlines()).toBe(before);
  });

  it('an attempt that ends before its deadline is never aborted; a confirmation keeps it alive', async () => {
    const a = attempt('w6', 80);
    const b = attempt('w7', 80);
    // Confirmed every 20 ms, each for 500 ms: a stalled event loop does not let it lapse between two.
    const keep = setInterval(() => b.confirm(monotonicNow() + 500, new Date(Date.now() + 1000)), 20);
    a.end();
    await new Promise((r) => setTimeout(r, 300));
    clearInterval(keep);
    expect(a.aborted).toBe(false);
    expect(b.aborted).toBe(false);
    const at = await abortedAt(b);
    expect(at).toBeGreaterThanOrEqual(b.confirmedUntil);
    expect(at).toBeLessThan(b.confirmedUntil + LATE_MS);
  });

  it('beginEffect checks the clock itself (the timer may be late)', () => {
    const a = attempt('w8', 0);
    expect(() => a.beginEffect('x')).toThrow(expect.objectContaining({ code: 'ownership_unknown' }));
    expect(a.ownershipLapsed).toBe(true);
  });
});
