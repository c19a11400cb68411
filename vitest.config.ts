import { defineConfig } from 'vitest/config';

/**
 * Three projects: `unit` (files in parallel on the machine's 2 cores), `faults` (real worker
 * processes killed, paused and cut off; files one at a time, so timing-sensitive leases are
 * not starved by other suites) and `soak` (the seeded chaos soak of chaos/, minutes long, alone).
 * `npm test` runs them one after the other.
 */
export default defineConfig({
  test: {
    globalSetup: ['./test/setup/global.ts'],
    pool: 'forks',
    testTimeout: 60_000,
    hookTimeout: 60_000,
    projects: [
      { extends: true, test: { name: 'unit', include: ['test/**/*.test.ts'], exclude: ['test/faults/**', 'test/soak/**'], maxWorkers: 2 } },
      { extends: true, test: { name: 'faults', include: ['test/faults/**/*.test.ts'], fileParallelism: false } },
      { extends: true, test: { name: 'soak', include: ['test/soak/**/*.test.ts'], fileParallelism: false, testTimeout: 600_000 } },
    ],
  },
});
