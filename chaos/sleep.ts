/** Resolves after `ms` (the harness's one timer wait: driver, injector, soak). */
export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
