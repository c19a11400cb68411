import { defineConfig } from 'vitest/config';

/**
 * Three projects: `unit` (files in parallel on the machine's 2 cores), `faults` (real worker
 * processes killed, paused and cut off; files one at a time, so timing-sensitive leases are
 * not starved by other suites) and `soak` (the seeded chaos soak of chaos/, minutes long, alone).
 * `npm test` runs them one after the other.
 */

/**
 * Run with the fault tests, one file at a time: a file that keeps a transaction open for many
 * seconds holds back every live stream on the server (a stream releases only events older than the
 * oldest transaction running on it, other databases' included: src/store/stream.sql.ts), so the
 * stream tests running beside it would wait for it.
 */
const ALONE = ['test/store/prune.test.ts'];

export default defineConfig({
  test: {
    globalSetup: ['./test/setup/global.ts'],
    pool: 'forks',
    testTimeout: 60_000,
    hookTimeout: 60_000,
    // expect.poll's own default is 1 s: thin for a page's round trip on a loaded 2-core machine.
    expect: { poll: { timeout: 10_000 } },
    projects: [
      {
        extends: true,
        test: { name: 'unit', include: ['test/**/*.test.ts'], exclude: ['test/faults/**', 'test/soak/**', ...ALONE], maxWorkers: 2 },
      },
      { extends: true, test: { name: 'faults', include: ['test/faults/**/*.test.ts', ...ALONE], fileParallelism: false } },
      { extends: true, test: { name: 'soak', include: ['test/soak/**/*.test.ts'], fileParallelism: false, testTimeout: 600_000 } },
    ],
  },
});
