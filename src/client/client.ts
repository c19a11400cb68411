import { randomUUID } from 'node:crypto';
import { z } from 'zod';
import type { Explanation } from '../observability/explanation.js';
import {
  cancelResponseSchema,
  eventListSchema,
  explanationSchema,
  idempotencyKeySchema,
  retryResponseSchema,
  runListSchema,
  runViewSchema,
  submitResponseSchema,
  type CancelResponse,
  type EventListJson,
  type RetryResponse,
  type RunJson,
  type RunListJson,
  type SubmitResponse,
} from '../api/schemas.js';
import {
  scheduleDeleteResponseSchema,
  scheduleDetailSchema,
  scheduleListSchema,
  schedulePutResponseSchema,
  type ScheduleBody,
  type ScheduleDetailJson,
  type ScheduleJson,
} from '../api/schedule-schemas.js';
import {
  approvalListSchema,
  decisionResponseSchema,
  signalResponseSchema,
  type ApprovalListJson,
  type DecisionResponse,
  type SignalResponse,
} from '../api/wait-schemas.js';
import { RUN_STATES, type RunState } from '../planner/states.js';
import { parseInput } from '../store/validate.js';
import { systemClock, type Clock } from './clock.js';
import { request, type HttpOptions } from './http.js';
import { ApiError } from '../api/errors.js';
import { waitForRun, type WaitOptions, type WaitOutcome } from './wait.js';
import { watchRunEvents, type EventJson, type WatchEnd, type WatchOptions } from './watch.js';

/** The retry's answer as the client reads it: `retriedStageIds` may be missing (an older server: []), and unknown fields pass. */
const retryClientSchema = retryResponseSchema.extend({ retriedStageIds: z.array(z.string()).default([]) }).loose();

const clientOptions = z
  .object({
    /** The server, e.g. http://127.0.0.1:7700 */
    baseUrl: z.url({ protocol: /^https?$/ }),
    token: z.string().min(1).optional(),
    fetch: z.custom<typeof fetch>((v) => typeof v === 'function').optional(),
    /** now + sleep for the poller (tests inject one). */
    clock: z.custom<Clock>((v) => typeof v === 'object' && v !== null && 'now' in v && 'sleep' in v).optional(),
    /** Each request's own timeout, ms (default 10 s). */
    timeoutMs: z
      .number()
      .int()
      .min(1)
      .max(2 ** 31 - 1)
      .optional(),
    /** For jitter (tests inject one). */
    random: z.custom<() => number>((v) => typeof v === 'function').optional(),
  })
  .strict();
export type ClientOptions = z.input<typeof clientOptions>;

export interface SubmitArgs {
  /** Same key and body: the same run back (200); same key, other body: ApiError idempotency_conflict. Generated when absent. */
  idempotencyKey?: string;
  /** An ISO date-time, a duration from now ("10m"), or ms from now. */
  deadline?: string | number | Date;
  /** Start this loaded version of the workflow (default: the newest the server has loaded). */
  version?: number;
  /** Higher is claimed first within a tool class, -100..100 (default: the workflow's, else 0). */
  priority?: number;
}

export interface ListArgs {
  state?: RunState | RunState[];
  workflow?: string;
  createdAfter?: Date | string;
  createdBefore?: Date | string;
  cursor?: string;
  limit?: number;
}

export interface RatchetClient {
  readonly baseUrl: string;
  /** Starts a run. Returns its id and the idempotency key used (resubmit with it after a lost answer: the same run comes back). */
  submit(workflow: string, input: unknown, args?: SubmitArgs): Promise<SubmitResponse & { idempotencyKey: string; status: 200 | 202 }>;
  get(id: string, opts?: { timeoutMs?: number; signal?: AbortSignal }): Promise<RunJson>;
  list(args?: ListArgs): Promise<RunListJson>;
  /** `after`: id order; `streamAfter`: the stream's order (an event id as Last-Event-ID, '0' for the start), committed transactions only. */
  events(id: string, args?: { after?: string; streamAfter?: string; limit?: number }): Promise<EventListJson>;
  cancel(id: string): Promise<CancelResponse>;
  retry(id: string): Promise<RetryResponse>;
  explain(id: string): Promise<Explanation>;
  /** Creates or replaces a cron schedule (POST /v1/schedules): `created` false when the name existed. */
  putSchedule(spec: ScheduleBody): Promise<{ schedule: ScheduleJson; created: boolean }>;
  listSchedules(): Promise<ScheduleJson[]>;
  /** One schedule with its latest decided ticks; ApiError `unknown_schedule` (404) for an unknown name. */
  getSchedule(name: string): Promise<ScheduleDetailJson>;
  deleteSchedule(name: string): Promise<{ name: string; deleted: true }>;
  /**
   * Sends a signal to a run (POST /v1/runs/:id/signals/:name): delivered to its waiting stage, or
   * kept until the wait starts. `signalId` (the Signal-Id header; generated when absent): the same
   * id sent again is delivered once — resend with it after a lost answer.
   */
  signal(id: string, name: string, payload: unknown, args?: { signalId?: string }): Promise<SignalResponse & { httpStatus: 200 | 202 }>;
  /** Approves a gated tool call (optionally with an edited input): ApiError already_decided when another decision came first. */
  approve(id: string, args?: { stageId?: string; input?: unknown; reason?: string; by?: string }): Promise<DecisionResponse>;
  /** Rejects a gated tool call with a reason: an agent hears it as the tool's answer; a static run fails with approval_rejected. */
  reject(id: string, args?: { stageId?: string; reason?: string; by?: string }): Promise<DecisionResponse>;
  /** Stages waiting for a person, oldest first (GET /v1/approvals). */
  approvals(args?: { runId?: string; limit?: number }): Promise<ApprovalListJson>;
  /** Polls until the run ends, the deadline passes or polls run out (src/client/wait.ts). */
  wait(id: string, opts?: WaitOptions): Promise<WaitOutcome>;
  /**
   * The run's events as they are committed (server-sent events; reconnects with Last-Event-ID;
   * falls back to the bounded poller), each once, in order, until its terminal event
   * (src/client/watch.ts). The iterator's return value says how the watch ended.
   */
  watch(id: string, opts?: WatchOptions): AsyncGenerator<EventJson, WatchEnd>;
  /** Watches many runs with this one client; their first reads are spread over the first interval. */
  waitAll(ids: string[], opts?: WaitOptions): Promise<WaitOutcome[]>;
}

const enc = encodeURIComponent;
/**
 * Path segments for what the server looks up by name. An empty one would make the path another
 * route's (`/v1/runs/` is the list), so it is answered here as the server answers any name it
 * does not hold: 404 with the lookup's own code.
 */
function segment(
  value: string,
  code: 'unknown_run' | 'unknown_schedule' | 'unknown_stage',
  message: string,
  field: string,
  path: string | null,
) {
  if (value === '') throw new ApiError(404, code, message, { path, details: { [field]: value } });
  return enc(value);
}
const runSeg = (id: string) => segment(id, 'unknown_run', 'no run with id ""', 'runId', null);
const scheduleSeg = (name: string) => segment(name, 'unknown_schedule', 'no schedule named ""', 'name', 'name');
const stageSeg = (stageId: string) => segment(stageId, 'unknown_stage', 'no stage with id ""', 'stageId', 'stageId');

/**
 * The task API's client (`ratchet/client`). Every answer is parsed with the server's own zod
 * schemas; every failure is an ApiError with a stable code (`unknown_run` for an unknown id).
 */
export function createClient(options: ClientOptions): RatchetClient {
  const o = parseInput(clientOptions, options, 'createClient');
  const http: HttpOptions = { baseUrl: o.baseUrl, token: o.token, fetch: o.fetch ?? globalThis.fetch };
  const clock = o.clock ?? systemClock;
  const random = o.random ?? Math.random;
  const timeoutMs = o.timeoutMs ?? 10_000;

  /** Without a stage id: the run's one stage awaiting approval (read first, as a person would); none or several is not_awaiting_approval. */
  const gatedStageId = async (id: string, stageId: string | undefined): Promise<string> => {
    runSeg(id); // an empty id is unknown_run before any read (the approvals filter would ignore it)
    if (stageId !== undefined) return stageId;
    const ids = (await client.approvals({ runId: id })).approvals.map((a) => a.stageId);
    if (ids.length !== 1) {
      throw new ApiError(
        409,
        'not_awaiting_approval',
        ids.length === 0 ? `run ${id}: no stage awaits approval` : `run ${id}: ${ids.length} stages await approval; name one (stageId)`,
        { details: { runId: id, stageIds: ids } },
      );
    }
    return ids[0]!;
  };
  const client: RatchetClient = {
    baseUrl: o.baseUrl,
    async submit(workflow, input, args = {}) {
      const idempotencyKey = parseInput(idempotencyKeySchema, args.idempotencyKey ?? randomUUID(), 'submit.idempotencyKey');
      const deadline = args.deadline instanceof Date ? args.deadline.toISOString() : args.deadline;
      const { status, data } = await request(http, {
        method: 'POST',
        path: '/v1/runs',
        schema: submitResponseSchema,
        timeoutMs,
        headers: { 'idempotency-key': idempotencyKey },
        body: {
          workflow,
          input,
          ...(deadline !== undefined ? { deadline } : {}),
          ...(args.version !== undefined ? { version: args.version } : {}),
          ...(args.priority !== undefined ? { priority: args.priority } : {}),
        },
      });
      return { ...data, idempotencyKey, status: status === 202 ? 202 : 200 };
    },
    async get(id, opts = {}) {
      return (
        await request(http, {
          method: 'GET',
          path: `/v1/runs/${runSeg(id)}`,
          schema: runViewSchema,
          timeoutMs: opts.timeoutMs ?? timeoutMs,
          signal: opts.signal,
        })
      ).data;
    },
    async list(args = {}) {
      const q = new URLSearchParams();
      const states = args.state === undefined ? [] : Array.isArray(args.state) ? args.state : [args.state];
      states.forEach((s, i) => parseInput(z.enum(RUN_STATES as [RunState, ...RunState[]]), s, `list.state[${i}]`));
      if (states.length > 0) q.set('state', states.join(','));
      if (args.workflow) q.set('workflow', args.workflow);
      const iso = (d: Date | string) => (d instanceof Date ? d.toISOString() : d);
      if (args.createdAfter) q.set('createdAfter', iso(args.createdAfter));
      if (args.createdBefore) q.set('createdBefore', iso(args.createdBefore));
      if (args.cursor) q.set('cursor', args.cursor);
      if (args.limit !== undefined) q.set('limit', String(args.limit));
      const qs = q.toString();
      return (await request(http, { method: 'GET', path: `/v1/runs${qs ? `?${qs}` : ''}`, schema: runListSchema, timeoutMs })).data;
    },
    async events(id, args = {}) {
      const q = new URLSearchParams();
      if (args.after) q.set('after', args.after);
      if (args.streamAfter) q.set('streamAfter', args.streamAfter);
      if (args.limit !== undefined) q.set('limit', String(args.limit));
      const qs = q.toString();
      return (
        await request(http, {
          method: 'GET',
          path: `/v1/runs/${runSeg(id)}/events${qs ? `?${qs}` : ''}`,
          schema: eventListSchema,
          timeoutMs,
        })
      ).data;
    },
    async cancel(id) {
      return (await request(http, { method: 'POST', path: `/v1/runs/${runSeg(id)}/cancel`, schema: cancelResponseSchema, timeoutMs })).data;
    },
    async retry(id) {
      // Loose: the retry has happened by the time the answer is read, so a field a newer server adds, or one an older
      // server lacks, must not fail it.
      return (await request(http, { method: 'POST', path: `/v1/runs/${runSeg(id)}/retry`, schema: retryClientSchema, timeoutMs })).data;
    },
    async explain(id) {
      return (await request(http, { method: 'GET', path: `/v1/runs/${runSeg(id)}/explain`, schema: explanationSchema, timeoutMs })).data;
    },
    async putSchedule(spec) {
      return (await request(http, { method: 'POST', path: '/v1/schedules', schema: schedulePutResponseSchema, timeoutMs, body: spec }))
        .data;
    },
    async listSchedules() {
      return (await request(http, { method: 'GET', path: '/v1/schedules', schema: scheduleListSchema, timeoutMs })).data.schedules;
    },
    async getSchedule(name) {
      return (await request(http, { method: 'GET', path: `/v1/schedules/${scheduleSeg(name)}`, schema: scheduleDetailSchema, timeoutMs }))
        .data;
    },
    async deleteSchedule(name) {
      return (
        await request(http, {
          method: 'DELETE',
          path: `/v1/schedules/${scheduleSeg(name)}`,
          schema: scheduleDeleteResponseSchema,
          timeoutMs,
        })
      ).data;
    },
    async signal(id, name, payload, args = {}) {
      const signalId = parseInput(idempotencyKeySchema, args.signalId ?? randomUUID(), 'signal.signalId');
      const { status, data } = await request(http, {
        method: 'POST',
        path: `/v1/runs/${runSeg(id)}/signals/${enc(name)}`,
        schema: signalResponseSchema,
        timeoutMs,
        headers: { 'signal-id': signalId },
        body: payload === undefined ? null : payload,
      });
      return { ...data, httpStatus: status === 202 ? 202 : 200 };
    },
    async approve(id, args = {}) {
      const stageId = await gatedStageId(id, args.stageId);
      const body = {
        ...(args.input !== undefined ? { input: args.input } : {}),
        ...(args.reason !== undefined ? { reason: args.reason } : {}),
        ...(args.by !== undefined ? { by: args.by } : {}),
      };
      return (
        await request(http, {
          method: 'POST',
          path: `/v1/runs/${runSeg(id)}/stages/${stageSeg(stageId)}/approve`,
          schema: decisionResponseSchema,
          timeoutMs,
          body,
        })
      ).data;
    },
    async reject(id, args = {}) {
      const stageId = await gatedStageId(id, args.stageId);
      const body = { ...(args.reason !== undefined ? { reason: args.reason } : {}), ...(args.by !== undefined ? { by: args.by } : {}) };
      return (
        await request(http, {
          method: 'POST',
          path: `/v1/runs/${runSeg(id)}/stages/${stageSeg(stageId)}/reject`,
          schema: decisionResponseSchema,
          timeoutMs,
          body,
        })
      ).data;
    },
    async approvals(args = {}) {
      const q = new URLSearchParams();
      if (args.runId) q.set('runId', args.runId);
      if (args.limit !== undefined) q.set('limit', String(args.limit));
      const qs = q.toString();
      return (await request(http, { method: 'GET', path: `/v1/approvals${qs ? `?${qs}` : ''}`, schema: approvalListSchema, timeoutMs }))
        .data;
    },
    wait(id, opts = {}) {
      return waitForRun(id, (readTimeout) => client.get(id, { timeoutMs: readTimeout, signal: opts.signal }), clock, random, opts);
    },
    watch(id, opts = {}) {
      return watchRunEvents(
        http,
        id,
        clock,
        random,
        (runId, t, signal) => client.get(runId, { timeoutMs: t, signal }),
        (runId, after) => client.events(runId, { streamAfter: after ?? '0', limit: 1000 }),
        opts,
      );
    },
    waitAll(ids, opts = {}) {
      const first = typeof opts.initialInterval === 'number' ? opts.initialInterval : 1000;
      return Promise.all(ids.map((id) => client.wait(id, { ...opts, initialDelay: opts.initialDelay ?? Math.floor(random() * first) })));
    },
  };
  return client;
}
