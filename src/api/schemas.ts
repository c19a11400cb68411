import { z } from 'zod';
import { PG_BIGINT_MAX } from '../store/validate.js';
import { PRIORITY_MAX, PRIORITY_MIN, prioritySchema } from '../definitions/priority.js';
import { EVENT_TYPES } from '../store/event-types.js';
import { RUN_STATES, STAGE_STATES, type RunState, type StageState } from '../planner/states.js';
import { MAX_LIST_LIMIT } from '../store/list-runs.js';
import { isStorableTime, STORABLE_TIME_RANGE } from '../store/limits.js';
import { explanationSchema } from '../observability/explanation.js';

/**
 * Every body and response of the task API (DESIGN.md "Task API"), in plain zod: the server
 * validates requests with them and documents them at /v1/openapi.json; the client
 * (ratchet/client) parses every answer with them. Timestamps are ISO 8601 strings.
 */
const noNul = /^[^\u0000]*$/;
const ts = z.iso.datetime({ offset: true });
/** A date-time a client sends: RFC 3339 with an offset, a real calendar date, in the range PostgreSQL stores (src/store/limits.ts). */
export const requestTimestampSchema = ts.refine((s) => isStorableTime(new Date(s)), `a date-time ${STORABLE_TIME_RANGE}`);
/**
 * An event position (an event id: `after`, `streamAfter`, a stream's Last-Event-ID, `watch
 * --after`): a decimal string 0..PG_BIGINT_MAX, so it fits PostgreSQL bigint.
 */
export const eventPositionSchema = z
  .string()
  .regex(/^\d{1,19}$/, 'an event id')
  // zod runs this even when the regex failed: only digits reach BigInt.
  .refine((s) => !/^\d+$/.test(s) || BigInt(s) <= PG_BIGINT_MAX, `an event id (at most ${PG_BIGINT_MAX})`);
/** Whether `s` is an event position (eventPositionSchema). */
export function isEventPosition(s: string): boolean {
  return eventPositionSchema.safeParse(s).success;
}
export const runStateSchema = z.enum(RUN_STATES as [RunState, ...RunState[]]).meta({ id: 'RunState' });
const stageStateSchema = z.enum(STAGE_STATES as [StageState, ...StageState[]]).meta({ id: 'StageState' });

/** A JSON value given by a caller (required: send `{}` for a workflow without input). */
const jsonValue = z.unknown().refine((v) => v !== undefined, { message: 'required (send {} for no input)' });

export const submitBodySchema = z
  .object({
    workflow: z.string().min(1).max(200).regex(noNul, 'must not contain \\u0000').describe('the workflow name'),
    input: jsonValue.describe("the run's input, checked against the workflow's schema"),
    version: z
      .number()
      .int()
      .min(1)
      .max(1_000_000)
      .optional()
      .describe('start this loaded version of the workflow (default: the newest loaded)'),
    deadline: z
      .union([ts, z.string().min(1).max(40), z.number().int().positive()])
      .optional()
      .describe(
        'when the run expires: an ISO 8601 date-time, a duration from now ("10m"), or milliseconds from now; overrides the workflow\'s',
      ),
    priority: prioritySchema
      .optional()
      .describe(
        `higher is claimed first within a tool class, ${PRIORITY_MIN}..${PRIORITY_MAX} (default: the workflow's, else 0); lower ones still run (README "Priorities")`,
      ),
  })
  .strict()
  .meta({ id: 'SubmitRun' });
export type SubmitBody = z.infer<typeof submitBodySchema>;

/** `Idempotency-Key`: the same key and body give back the same run; the same key with another body is a 409. */
export const idempotencyKeySchema = z
  .string()
  .min(1)
  .max(255)
  .regex(/^[\x20-\x7e]+$/, 'printable ASCII only');
export const submitHeadersSchema = z.object({ 'idempotency-key': idempotencyKeySchema.optional() });

export const submitResponseSchema = z
  .object({
    id: z.string(),
    workflow: z.string(),
    state: runStateSchema,
    /** true: a new run (202); false: the run this key already made (200). */
    created: z.boolean(),
    idempotencyKey: z.string().nullable(),
  })
  .strict()
  .meta({ id: 'SubmittedRun' });
export type SubmitResponse = z.infer<typeof submitResponseSchema>;

export const stageViewSchema = z
  .object({
    id: z.string(),
    seq: z.number().int(),
    name: z.string(),
    tool: z.string(),
    toolClass: z.string(),
    state: stageStateSchema,
    attempt: z.number().int(),
    maxAttempts: z.number().int(),
    fence: z.string().nullable(),
    leaseUntil: ts.nullable(),
    heartbeatAt: ts.nullable(),
    /** When a queued stage may be claimed (a retry's delay ends). */
    availableAt: ts,
    lastError: z.unknown(),
    /** The stage's own idempotency key, and the key its tool derived for its effect (null: it sent the stage's own). */
    idempotencyKey: z.string(),
    effectKey: z.string().nullable(),
    /** The run graph: the seqs this stage waits for; a map item's index and its map stage's seq. */
    deps: z.array(z.number().int()).optional(),
    itemIndex: z.number().int().nullable().optional(),
    groupSeq: z.number().int().optional(),
  })
  .strict()
  .meta({ id: 'Stage' });

export const runViewSchema = z
  .object({
    id: z.string(),
    workflow: z.string(),
    state: runStateSchema,
    result: z.unknown(),
    error: z.unknown(),
    deadline: ts.nullable(),
    priority: z.number().int().optional().describe('higher is claimed first within a tool class (README "Priorities")'),
    createdAt: ts,
    updatedAt: ts,
    finishedAt: ts.nullable(),
    stages: z.array(stageViewSchema),
    /** A child run's parent run (null for a run submitted on its own). */
    parentRunId: z.string().nullable().optional(),
    /** The child runs this run's stages started. */
    children: z
      .array(
        z
          .object({
            id: z.string(),
            workflow: z.string(),
            state: runStateSchema,
            parentStageId: z.string().nullable(),
            createdAt: ts,
            finishedAt: ts.nullable(),
          })
          .strict(),
      )
      .optional(),
    /** Model tokens of the run's model stages (from the provider's usage), summed. */
    usage: z
      .object({
        inputTokens: z.number().int(),
        outputTokens: z.number().int(),
        modelCalls: z.number().int(),
        /** The sum of the model stages' costs (the model's pricing per million tokens); absent when none was priced. */
        cost: z.number().optional(),
      })
      .strict()
      .optional(),
    /** The OpenTelemetry trace id of the run's spans (README "Traces"). */
    traceId: z.string().optional(),
  })
  .strict()
  .meta({ id: 'Run' });
export type RunJson = z.infer<typeof runViewSchema>;

export const runSummarySchema = z
  .object({
    id: z.string(),
    workflow: z.string(),
    state: runStateSchema,
    error: z.unknown(),
    deadline: ts.nullable(),
    createdAt: ts,
    updatedAt: ts,
    finishedAt: ts.nullable(),
  })
  .strict()
  .meta({ id: 'RunSummary' });
export type RunSummaryJson = z.infer<typeof runSummarySchema>;

/** A workflow name to list runs by (`?workflow=`): the API's list and the dashboard's filter. */
export const workflowFilterSchema = z.string().min(1).max(200).regex(noNul, 'must not contain \\u0000');

/** `?state=failed,cancelled&workflow=w&createdAfter=...&createdBefore=...&limit=50&cursor=...` */
export const listQuerySchema = z
  .object({
    state: z
      .string()
      .regex(new RegExp(`^(${RUN_STATES.join('|')})(,(${RUN_STATES.join('|')}))*$`), `a comma-separated list of ${RUN_STATES.join(', ')}`)
      .optional(),
    workflow: workflowFilterSchema.optional(),
    createdAfter: requestTimestampSchema.optional().describe('created at or after (inclusive)'),
    createdBefore: requestTimestampSchema.optional().describe('created before (exclusive)'),
    cursor: z.string().min(1).max(200).optional().describe('nextCursor of the previous page'),
    limit: z
      .string()
      .regex(/^\d{1,4}$/, 'a whole number')
      .refine((s) => Number(s) >= 1 && Number(s) <= MAX_LIST_LIMIT, `1..${MAX_LIST_LIMIT}`)
      .optional(),
  })
  .strict();
export type ListQuery = z.infer<typeof listQuerySchema>;

export const runListSchema = z
  .object({
    runs: z.array(runSummarySchema),
    /** Pass back as `cursor` for the next (older) page; null on the last page. */
    nextCursor: z.string().nullable(),
  })
  .strict()
  .meta({ id: 'RunList' });
export type RunListJson = z.infer<typeof runListSchema>;

export const eventsQuerySchema = z
  .object({
    after: eventPositionSchema.optional().describe('only events after this event id (id order)'),
    streamAfter: eventPositionSchema
      .optional()
      .describe(
        'stream order instead of id order: events after this event id (a Last-Event-ID; 0 for the start) as GET /v1/runs/:id/stream sends them, committed transactions only',
      ),
    limit: z
      .string()
      .regex(/^\d{1,5}$/, 'a whole number')
      .refine((s) => Number(s) >= 1 && Number(s) <= 1000, '1..1000')
      .optional(),
  })
  .strict();
export type EventsQuery = z.infer<typeof eventsQuerySchema>;

export const eventSchema = z
  .object({
    id: z.string(),
    runId: z.string(),
    stageId: z.string().nullable(),
    /** One of EVENT_TYPES (a string here, so a client keeps working when a newer server adds a type). */
    type: z.string().describe(`an event type: ${EVENT_TYPES.join(', ')}`),
    fence: z.string().nullable(),
    attempt: z.number().int().nullable(),
    at: ts,
    data: z.unknown(),
  })
  .strict()
  .meta({ id: 'Event' });

export const eventListSchema = z
  .object({
    runId: z.string(),
    events: z.array(eventSchema),
    /** Pass back as `after` for the next page; null when this page was the last so far. */
    nextCursor: z.string().nullable(),
  })
  .strict()
  .meta({ id: 'EventList' });
export type EventListJson = z.infer<typeof eventListSchema>;

export const cancelResponseSchema = z
  .object({
    id: z.string(),
    state: runStateSchema,
    /** false when the run was already cancelled (nothing changed). */
    cancelled: z.boolean(),
    previousState: runStateSchema,
    /** Stages that were running: a request they already sent cannot be recalled. */
    runningStageIds: z.array(z.string()),
    note: z.string(),
  })
  .strict()
  .meta({ id: 'CancelledRun' });
export type CancelResponse = z.infer<typeof cancelResponseSchema>;

export const retryResponseSchema = z
  .object({
    id: z.string(),
    state: runStateSchema,
    previousState: runStateSchema,
    /** The failed stage the run goes on from, with a fresh attempt budget. */
    stage: z
      .object({
        id: z.string(),
        seq: z.number().int(),
        name: z.string(),
        tool: z.string(),
        toolClass: z.string(),
        attemptsUsed: z.number().int(),
        error: z.unknown(),
      })
      .strict(),
    /**
     * Every failed stage queued again, in seq order, `stage` first (one statement can fail several: a join waits for all
     * of them). The client reads it as optional (a server from before it was added).
     */
    retriedStageIds: z.array(z.string()),
    note: z.string(),
  })
  .strict()
  .meta({ id: 'RetriedRun' });
export type RetryResponse = z.infer<typeof retryResponseSchema>;

export { explanationSchema };

export const runIdParamsSchema = z.object({ id: z.string().min(1).max(100) });

export const healthSchema = z
  .object({ ok: z.literal(true) })
  .strict()
  .meta({ id: 'Health' });
export const readySchema = z
  .object({ ok: z.boolean(), database: z.enum(['up', 'down']) })
  .strict()
  .meta({ id: 'Readiness' });
