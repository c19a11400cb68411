/**
 * The poller's clock: `now` in milliseconds and `sleep`. Injected in tests so the intervals and
 * the deadline can be checked without real waiting; the default is the system clock.
 */
export interface Clock {
  now(): number;
  sleep(ms: number, signal?: AbortSignal): Promise<void>;
}

/** The longest delay a timer honours (2^31 - 1 ms); longer ones would fire at once. */
const MAX_TIMER_MS = 2 ** 31 - 1;

export const systemClock: Clock = {
  now: () => Date.now(),
  sleep: (ms, signal) =>
    new Promise<void>((resolve) => {
      if (signal?.aborted) return resolve();
      const done = () => {
        clearTimeout(t);
        signal?.removeEventListener('abort', done);
        resolve();
      };
      const t = setTimeout(done, Math.min(Math.max(0, ms), MAX_TIMER_MS));
      signal?.addEventListener('abort', done, { once: true });
    }),
};
