import { describe, expect, it } from 'vitest';
import type { AbortReason } from '../../src/errors.js';
import { silentLogger } from '../../src/logger.js';
import type { ClaimedStage } from '../../src/store/index.js';
import { Attempt } from '../../src/worker/attempt.js';
import type { EventWriter } from '../../src/worker/event-writer.js';
import { runGuarded } from '../../src/worker/run-guarded.js';
import { claimedStage } from '../helpers/claimed-stage.js';

/**
 * Aborts escalate (issue 9, item 5), on the Attempt and runGuarded alone: after
 * ownership_unknown, each reason that ends an attempt still ends it — the call stops being
 * waited for, beginEffect refuses with the final reason — while the signal keeps its first.
 * (The same on real PostgreSQL and worker processes: escalation.test.ts, worker-runtime.test.ts.)
 */
const events = { push: () => {} } as unknown as EventWriter;
const stage = (id: string): ClaimedStage => claimedStage(id);
const never = () => new Promise<never>(() => {}); // a tool deaf to its signal

describe('Attempt: aborts escalate past ownership_unknown', () => {
  for (const reason of ['timeout', 'lease_lost', 'cancelled', 'stage_duration_exceeded', 'run_deadline'] as AbortReason[]) {
    it(`${reason} after ownership_unknown ends the attempt: the call is no longer waited for`, async () => {
      const a = new Attempt(stage('1'), 1000, events, silentLogger());
      try {
        const call = runGuarded(a, never, 'the tool', 60_000).then(
          () => null,
          (e: unknown) => e,
        );
        a.abort('ownership_unknown');
        expect(a.finalReason).toBeNull(); // only informs the tool
        expect(a.timedOut()).toBe(false);
        a.abort(reason, `ended: ${reason}`);
        expect(await call).toMatchObject({ code: reason });
        expect(a.finalReason).toBe(reason);
        expect(a.abortReason).toBe(reason);
        expect((a.signal.reason as { code: string }).code).toBe('ownership_unknown'); // a signal aborts once
        expect(a.ownershipLapsed).toBe(true);
        expect(() => a.beginEffect('late')).toThrow(expect.objectContaining({ code: reason }));
        // A later call is refused without starting; a second final reason changes nothing.
        let started = false;
        await expect(
          runGuarded(
            a,
            async () => {
              started = true;
            },
            'later',
            60_000,
          ),
        ).rejects.toMatchObject({ code: reason });
        expect(started).toBe(false);
        a.abort('shutdown');
        expect(a.finalReason).toBe(reason);
      } finally {
        a.end();
      }
    });
  }

  it('each call has its own time limit: a call past it ends the attempt with timeout, the keeper sees it timed out', async () => {
    const a = new Attempt(stage('2'), 1000, events, silentLogger());
    try {
      await runGuarded(a, () => new Promise((r) => setTimeout(r, 60)), 'reconcile', 100); // within its limit
      expect(a.timedOut()).toBe(false); // between calls: no call deadline
      const finals: string[] = [];
      a.onFinal((e) => finals.push(e.reason));
      const t0 = performance.now();
      await expect(runGuarded(a, never, 'run', 100)).rejects.toMatchObject({
        code: 'timeout',
        message: 'run passed its time limit of 100 ms',
      });
      expect(performance.now() - t0).toBeGreaterThanOrEqual(95);
      expect(finals).toEqual(['timeout']);
    } finally {
      a.end();
    }
  });
});
