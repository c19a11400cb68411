/**
 * `ratchet/client`: the task API's client — submit, get, list, events, cancel, retry,
 * explain, and a bounded poller (`wait`) with a typed outcome.
 */
export { createClient } from './client.js';
export type { ClientOptions, ListArgs, RatchetClient, SubmitArgs } from './client.js';
export { waitForRun, plannedPolls, DEFAULT_WAIT_DEADLINE_MS } from './wait.js';
export type { PollRecord, WaitOptions, WaitOutcome } from './wait.js';
export { watchRunEvents, TERMINAL_EVENTS } from './watch.js';
export type { EventJson, TokenJson, WatchEnd, WatchOptions } from './watch.js';
export { systemClock } from './clock.js';
export type { Clock } from './clock.js';
export { ApiError, API_ERROR_CODES, hasCode } from '../api/errors.js';
export type { ApiErrorCode } from '../api/errors.js';
export type { CancelResponse, EventListJson, RetryResponse, RunJson, RunListJson, RunSummaryJson, SubmitResponse } from '../api/schemas.js';
export type { Explanation, Verdict } from '../observability/explanation.js';
export type { ScheduleBody, ScheduleDetailJson, ScheduleJson } from '../api/schedule-schemas.js';
