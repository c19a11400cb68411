import type { StageReady, Transport } from './transport.js';

/** The embedded default's transport: wake-ups inside one process, delayed ones on timers. */
export function createInProcessTransport(): Transport {
  const subscribers = new Map<string, Set<(ready: StageReady | null) => Promise<void>>>();
  const timers = new Set<NodeJS.Timeout>();
  const fire = (toolClass: string, ready: StageReady) => {
    for (const fn of subscribers.get(toolClass) ?? []) void fn(ready).catch(() => {});
  };
  return {
    kind: 'in-process',
    notify(toolClass, ready, delayMs = 0) {
      if (delayMs <= 0) {
        queueMicrotask(() => fire(toolClass, ready));
        return;
      }
      const t = setTimeout(
        () => {
          timers.delete(t);
          fire(toolClass, ready);
        },
        Math.min(delayMs, 2 ** 31 - 1),
      );
      t.unref();
      timers.add(t);
    },
    subscribe(toolClass, onWake) {
      let set = subscribers.get(toolClass);
      if (!set) subscribers.set(toolClass, (set = new Set()));
      set.add(onWake);
      return async () => {
        set.delete(onWake);
      };
    },
    healthy: () => true,
    async close() {
      for (const t of timers) clearTimeout(t);
      timers.clear();
      subscribers.clear();
    },
  };
}
