import { z } from 'zod';
import { prioritySchema } from '../definitions/priority.js';

/** Schedule names appear in URLs, CLI arguments and run idempotency keys. */
export const SCHEDULE_NAME = /^[A-Za-z][A-Za-z0-9_-]{0,99}$/;
export const SCHEDULE_NAME_RULE = 'must be a letter then up to 99 letters, digits, "_" or "-"';
/** The most missed ticks one outage may fire per schedule. */
export const MAX_CATCH_UP = 1000;

export type Overlap = 'skip' | 'allow';
export type CatchUp = 'none' | number;

/** What a schedule says, whether from defineSchedule or POST /v1/schedules (the workflow by name). */
export const scheduleSpecSchema = z.strictObject({
  name: z.string().regex(SCHEDULE_NAME, SCHEDULE_NAME_RULE),
  /** 5 fields (minute hour day-of-month month day-of-week), or 6 with seconds first; read by cron-parser. */
  cron: z.string().min(1).max(200),
  /** IANA time zone the cron is read in (default UTC). */
  timezone: z.string().min(1).max(100).default('UTC'),
  workflow: z.string().min(1).max(64),
  input: z.unknown().optional(),
  /** Default 'skip': a tick starts nothing while the schedule's previous run is queued or running. */
  overlap: z.enum(['skip', 'allow']).default('skip'),
  /** Missed ticks fired after an outage, besides the latest: 'none' (default) or the last N. */
  catchUp: z.union([z.literal('none'), z.int().min(1).max(MAX_CATCH_UP)]).default('none'),
  /** The priority of the runs it starts (README "Priorities"); default: the workflow's. */
  priority: prioritySchema.optional(),
});
export type ScheduleSpec = z.output<typeof scheduleSpecSchema>;

export const catchUpToCount = (c: CatchUp): number => (c === 'none' ? 0 : c);
export const countToCatchUp = (n: number): CatchUp => (n === 0 ? 'none' : n);
