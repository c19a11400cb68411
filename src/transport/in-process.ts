import type { Transport } from './transport.js';

/** The embedded default's transport: wake-ups inside one process, delayed ones on timers. */
export function createInProcessTransport(): Transport {
  const subscribers = new Map<string, Set<() => void>>();
  const timers = new Set<NodeJS.Timeout>();
  const fire = (toolClass: string) => {
    for (const fn of subscribers.get(toolClass) ?? []) fn();
  };
  return {
    kind: 'in-process',
    notify(toolClass, _stageId, delayMs = 0) {
      if (delayMs <= 0) {
        queueMicrotask(() => fire(toolClass));
        return;
      }
      const t = setTimeout(() => {
        timers.delete(t);
        fire(toolClass);
      }, Math.min(delayMs, 2 ** 31 - 1));
      t.unref();
      timers.add(t);
    },
    subscribe(toolClass, onWake) {
      let set = subscribers.get(toolClass);
      if (!set) subscribers.set(toolClass, (set = new Set()));
      set.add(onWake);
      return () => set.delete(onWake);
    },
    async close() {
      for (const t of timers) clearTimeout(t);
      timers.clear();
      subscribers.clear();
    },
  };
}
