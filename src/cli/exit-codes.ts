/**
 * The CLI's exit codes (documented in the README):
 *   0 ok (for `run`: the run succeeded)
 *   1 unexpected error
 *   2 bad usage or input (bad JSON, unknown workflow, input the workflow's schema refuses,
 *     a locked data directory): nothing was persisted
 *   3 unknown run
 *   4 database unavailable
 *   5 `run`: the run ended failed, cancelled or expired
 *   6 `run`: the run did not end within --timeout (it is left as it is, not cancelled)
 *   130 `run`: interrupted (SIGINT / SIGTERM) before the run ended
 */
export const EXIT = {
  ok: 0, unexpected: 1, invalidInput: 2, unknownRun: 3, databaseUnavailable: 4, runFailed: 5, runTimeout: 6, interrupted: 130,
} as const;
