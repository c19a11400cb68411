import { z } from 'zod';
import { PRIORITY_MAX, PRIORITY_MIN } from '../definitions/priority.js';
import { MAX_CATCH_UP, SCHEDULE_NAME, SCHEDULE_NAME_RULE } from '../schedules/spec.js';
import type { ScheduleView } from '../schedules/service.js';
import type { TickRow } from '../store/schedules.js';

/** Bodies and answers of /v1/schedules, in plain zod (the client parses answers with them; the routes are in ./schedules.ts). */
const ts = z.iso.datetime({ offset: true });
const errorSchema = z.object({ code: z.string(), message: z.string() });
const catchUpSchema = z.union([z.literal('none'), z.number().int().min(1).max(MAX_CATCH_UP)]);

export const scheduleBodySchema = z
  .object({
    name: z
      .string()
      .regex(SCHEDULE_NAME, SCHEDULE_NAME_RULE)
      .describe('unique; creating an existing name replaces it (its tick history stays)'),
    cron: z.string().min(1).max(200).describe('5 fields (minute hour day-of-month month day-of-week), or 6 with seconds first'),
    timezone: z.string().min(1).max(100).optional().describe('IANA time zone the cron is read in (default UTC)'),
    workflow: z.string().min(1).max(64).describe('the workflow each tick starts (a loaded one)'),
    input: z.unknown().optional().describe("each run's input, checked against the workflow's schema (default {})"),
    overlap: z.enum(['skip', 'allow']).optional().describe("'skip' (default): a tick starts nothing while the previous run is going"),
    catchUp: catchUpSchema.optional().describe("missed ticks fired after an outage besides the latest: 'none' (default) or the last N"),
    priority: z
      .int()
      .min(PRIORITY_MIN)
      .max(PRIORITY_MAX)
      .optional()
      .describe("the priority of the runs it starts (higher claimed first); default: the workflow's"),
  })
  .strict()
  .meta({ id: 'ScheduleSpec' });
export type ScheduleBody = z.input<typeof scheduleBodySchema>;

export const scheduleViewSchema = z
  .object({
    name: z.string(),
    cron: z.string(),
    timezone: z.string(),
    workflow: z.string(),
    input: z.unknown(),
    overlap: z.enum(['skip', 'allow']),
    catchUp: catchUpSchema,
    source: z.enum(['code', 'api']),
    priority: z.number().int().nullable(),
    lastTickAt: ts,
    nextTickAt: ts.nullable(),
    lastRunId: z.string().nullable(),
    retiredAt: ts.nullable().describe('set when the workflow files that defined it no longer do: it fires nothing'),
    failures: z.number().int().describe('failed submits in a row; the due tick is tried again after backoffUntil'),
    lastError: errorSchema.nullable(),
    backoffUntil: ts.nullable(),
    createdAt: ts,
    updatedAt: ts,
  })
  .strict()
  .meta({ id: 'Schedule' });
export type ScheduleJson = z.infer<typeof scheduleViewSchema>;

const tickSchema = z
  .object({ tickAt: ts, outcome: z.enum(['started', 'skipped', 'failed']), runId: z.string().nullable(), error: errorSchema.nullable() })
  .strict();
export const scheduleDetailSchema = scheduleViewSchema
  .extend({ recentTicks: z.array(tickSchema) })
  .strict()
  .meta({ id: 'ScheduleDetail' });
export type ScheduleDetailJson = z.infer<typeof scheduleDetailSchema>;
export const scheduleListSchema = z
  .object({ schedules: z.array(scheduleViewSchema) })
  .strict()
  .meta({ id: 'ScheduleList' });
export const schedulePutResponseSchema = z.object({ schedule: scheduleViewSchema, created: z.boolean() }).strict();
export const scheduleDeleteResponseSchema = z.object({ name: z.string(), deleted: z.literal(true) }).strict();

export const scheduleToJson = (s: ScheduleView): ScheduleJson => ({
  ...s,
  lastTickAt: s.lastTickAt.toISOString(),
  nextTickAt: s.nextTickAt?.toISOString() ?? null,
  retiredAt: s.retiredAt?.toISOString() ?? null,
  backoffUntil: s.backoffUntil?.toISOString() ?? null,
  createdAt: s.createdAt.toISOString(),
  updatedAt: s.updatedAt.toISOString(),
});
export const tickToJson = (t: TickRow) => ({ tickAt: t.tickAt.toISOString(), outcome: t.outcome, runId: t.runId, error: t.error });
