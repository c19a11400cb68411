import type { AttemptAbortedError } from '../errors.js';
import { monotonicNow } from '../store/index.js';
import type { Attempt } from './attempt.js';

/** Bound for timers (setTimeout fires at once past 2^31-1 ms). */
const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * Runs one call of an attempt (its reconcile, its run, a model call) under the call's own time
 * limit and the attempt's abort signal. Past `limitMs` the attempt is aborted with `timeout`
 * and the promise rejects at once, whether or not the call settles. Any abort that ends the
 * attempt (timeout, a lost lease, a cancel, maxDuration, the run's deadline, shutdown) rejects
 * at once too — also one that comes after `ownership_unknown`: the tool's late answer is never
 * waited for. `ownership_unknown` alone only informs the tool (its signal aborts and
 * beginEffect refuses); if it still answers, the fenced finish decides. A call asked for on an
 * attempt that has already ended is refused without starting.
 */
export function runGuarded<T>(attempt: Attempt, work: () => Promise<T>, what: string, limitMs: number): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let settled = false;
    let timer: NodeJS.Timeout | undefined;
    let offFinal = () => {};
    const settle = () => {
      settled = true;
      clearTimeout(timer);
      offFinal();
      attempt.endCall();
    };
    const ended = (err: AttemptAbortedError) => {
      if (settled) return;
      settle();
      reject(err);
    };
    if (attempt.finalError) return ended(attempt.finalError);
    const deadline = attempt.beginCall(limitMs);
    timer = setTimeout(
      () => attempt.abort('timeout', `${what} passed its time limit of ${limitMs} ms`),
      Math.min(Math.max(0, deadline - monotonicNow()), MAX_TIMER_MS),
    );
    offFinal = attempt.onFinal(ended);
    let p: Promise<T>;
    try {
      p = work();
    } catch (err) {
      p = Promise.reject(err);
    }
    p.then(
      (v) => {
        if (settled) return;
        settle();
        resolve(v);
      },
      (e: unknown) => {
        if (settled) return;
        settle();
        reject(e);
      },
    );
  });
}
