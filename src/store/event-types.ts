/**
 * Event names: the same words in the events table, the pino logs and the metrics.
 * One list, so a writer cannot invent a spelling.
 */
export const EVENT_TYPES = [
  'run_submitted',
  'run_succeeded',
  'run_failed',
  'run_cancelled',
  'run_expired',
  'run_retried',
  'job_claimed',
  'lease_reclaimed',
  'lease_released',
  'lease_expired_at_startup',
  'heartbeat_ok',
  'heartbeat_lost',
  'attempts_exhausted',
  'stage_duration_exceeded',
  'stage_succeeded',
  'stage_failed',
  'stage_cancelled',
  'stage_skipped',
  'stage_waiting',
  'child_run_started',
  'child_run_detached',
  'retry_scheduled',
  'result_rejected',
  'finish_replayed',
  'ownership_unknown',
  'tool_request_started',
  'outcome_unknown',
  'stages_planned',
  'actions_refused',
  'reconciled',
  // waits (issue 10): a stage that waits without a lease, and how its wait ends
  'wait_started',
  'wait_ended',
  'signal_received',
  'signal_kept',
  'approval_requested',
  'approval_granted',
  'approval_rejected',
  'approval_timed_out',
  // a run retry revived a stage whose call was approved: it runs again without asking (the approval stands for the stage)
  'approval_reused',
] as const;
export type EventType = (typeof EVENT_TYPES)[number];
