import { defineConfig } from 'vitest/config';

/**
 * Two projects: `unit` (files in parallel on the machine's 2 cores) and `faults` (real worker
 * processes killed, paused and cut off; files one at a time, so timing-sensitive leases are
 * not starved by other suites). `npm test` runs them one after the other.
 */
export default defineConfig({
  test: {
    globalSetup: ['./test/setup/global.ts'],
    pool: 'forks',
    testTimeout: 60_000,
    hookTimeout: 60_000,
    projects: [
      { extends: true, test: { name: 'unit', include: ['test/**/*.test.ts'], exclude: ['test/faults/**'], maxWorkers: 2 } },
      { extends: true, test: { name: 'faults', include: ['test/faults/**/*.test.ts'], fileParallelism: false } },
    ],
  },
});
