import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    globalSetup: ['./test/setup/global.ts'],
    include: ['test/**/*.test.ts'],
    pool: 'forks',
    testTimeout: 60_000,
    hookTimeout: 60_000,
    // Fault-injection suites (test/faults) declare themselves sequential; the rest share 2 cores.
    maxWorkers: 2,
  },
});
