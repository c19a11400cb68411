import type { Attempt } from './attempt.js';

/** Bound for timers (setTimeout fires at once past 2^31-1 ms). */
const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * Runs one piece of an attempt's work under its timeout and abort signal. Past the timeout
 * the signal aborts with `timeout` and the promise rejects at once, whether or not the tool
 * settles. A lost lease, a cancel, maxDuration or shutdown also reject at once: the tool's
 * late answer is never waited for. `ownership_unknown` only informs the tool (its signal
 * aborts and beginEffect refuses); if it still answers, the fenced finish decides.
 */
export function runGuarded<T>(attempt: Attempt, work: () => Promise<T>, what: string): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const remaining = Math.min(Math.max(0, attempt.timeoutAt - performance.now()), MAX_TIMER_MS);
    const timer = setTimeout(() => attempt.abort('timeout', `${what} passed its timeout of ${attempt.stage.timeoutMs} ms`), remaining);
    const onAbort = () => {
      if (attempt.abortReason !== 'ownership_unknown') reject(attempt.signal.reason);
    };
    attempt.signal.addEventListener('abort', onAbort);
    const done = () => {
      clearTimeout(timer);
      attempt.signal.removeEventListener('abort', onAbort);
    };
    if (attempt.signal.aborted) onAbort();
    let p: Promise<T>;
    try {
      p = work();
    } catch (err) {
      p = Promise.reject(err);
    }
    p.then((v) => { done(); resolve(v); }, (e: unknown) => { done(); reject(e); });
  });
}
