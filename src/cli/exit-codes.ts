/**
 * The CLI's exit codes (documented in the README):
 *   0 ok (for `run`: the run succeeded)
 *   1 unexpected error
 *   2 bad usage or input (bad JSON, unknown workflow, input the workflow's schema refuses,
 *     a locked data directory): nothing was persisted
 *   3 unknown run (or schedule, stage, signal name)
 *   4 database unavailable
 *   5 `run`: the run ended failed, cancelled or expired
 *   6 `run`: the run did not end within --timeout (it is left as it is, not cancelled)
 *   7 the request does not fit the run's state: retry of a run that is not failed, cancel of a
 *     run that already ended another way, an idempotency key used with another input, a decision on
 *     an approval already decided (or on a stage that awaits none), a Signal-Id reused with another payload
 *   8 the server refused the token (401)
 *   9 the server did not answer (unreachable, or no answer within the request timeout)
 *   130 `run`: interrupted (SIGINT / SIGTERM) before the run ended
 * (`run --url ... --wait`: 6 also when the client's deadline passed before the run ended.)
 */
export const EXIT = {
  ok: 0,
  unexpected: 1,
  invalidInput: 2,
  unknownRun: 3,
  databaseUnavailable: 4,
  runFailed: 5,
  runTimeout: 6,
  interrupted: 130,
  conflict: 7,
  unauthorized: 8,
  serverUnreachable: 9,
} as const;

/** The exit code for an error code (a RatchetError's or the task API's: they share names). */
export function exitCodeFor(code: string): number {
  switch (code) {
    case 'invalid_input':
    case 'invalid_definition':
    case 'data_dir_locked':
    case 'invalid_request':
    case 'invalid_json':
    case 'unknown_workflow':
    case 'body_too_large':
    case 'unsupported_media_type':
      return EXIT.invalidInput;
    case 'unknown_run':
    case 'unknown_schedule':
    case 'unknown_stage':
    case 'unknown_signal':
      return EXIT.unknownRun;
    case 'database_unavailable':
    case 'transaction_conflict':
      return EXIT.databaseUnavailable;
    case 'not_retryable':
    case 'already_terminal':
    case 'idempotency_conflict':
    case 'illegal_transition':
    case 'already_decided':
    case 'not_awaiting_approval':
    case 'signal_id_conflict':
      return EXIT.conflict;
    case 'unauthorized':
      return EXIT.unauthorized;
    case 'network_error':
    case 'read_timeout':
      return EXIT.serverUnreachable;
    default:
      return EXIT.unexpected;
  }
}
