import { runTraceId } from '../observability/tracing.js';
import type { Ratchet } from '../engine.js';
import { RunAlreadyTerminalError, RunNotRetryableError, UnknownRunError } from '../errors.js';
import type { Explanation } from '../observability/explanation.js';
import type { RunState } from '../planner/states.js';
import { resolveDuration } from '../definitions/duration.js';
import { InvalidInputError } from '../errors.js';
import { STORABLE_TIME_RANGE } from '../store/limits.js';
import { runUsage } from '../store/usage.js';
import { eventPosition, readStreamBatch, STREAM_START } from '../store/stream.js';
import { cancelToJson, eventToJson, retryToJson, runSummaryToJson, runToJson } from './present.js';
import { requestTimestampSchema } from './schemas.js';
import type {
  CancelResponse,
  EventListJson,
  EventsQuery,
  ListQuery,
  RetryResponse,
  RunJson,
  RunListJson,
  SubmitBody,
  SubmitResponse,
} from './schemas.js';

/**
 * The task API's operations over one Ratchet, in the API's JSON shapes: the HTTP server wraps
 * them in routes, and the CLI calls them directly when no server URL is given. Failures are
 * typed errors with stable codes (unknown_run, not_retryable, already_terminal, invalid_input
 * with its path, ...); the server turns each into its HTTP status.
 */
export interface RunService {
  submit(body: SubmitBody, idempotencyKey?: string): Promise<SubmitResponse>;
  get(id: string): Promise<RunJson>;
  list(query?: ListQuery): Promise<RunListJson>;
  events(id: string, query?: EventsQuery): Promise<EventListJson>;
  explain(id: string): Promise<Explanation>;
  cancel(id: string): Promise<CancelResponse>;
  retry(id: string): Promise<RetryResponse>;
}

const RETRY_HINTS: Record<RunState | 'deadline_passed' | 'no_failed_stage' | 'parent_ended', string> = {
  queued: 'it has not ended: wait for it',
  running: 'it has not ended: wait for it',
  succeeded: 'it succeeded: there is nothing to retry',
  cancelled: 'a cancelled run is resubmitted as a new run (POST /v1/runs)',
  expired: 'an expired run is resubmitted as a new run (POST /v1/runs)',
  failed: 'submit it again as a new run',
  deadline_passed: 'its deadline has passed: resubmit it as a new run (POST /v1/runs)',
  no_failed_stage: 'no stage failed (the run failed between stages): resubmit it as a new run (POST /v1/runs)',
  parent_ended:
    'it is a child run whose parent no longer waits for it (the parent run ended, or its stage already took this run’s end): a failed parent is retried (POST /v1/runs/:parentId/retry), which retries this child with it; a cancelled or expired one is resubmitted as a new run',
};

/**
 * A deadline as the engine takes it: an ISO date-time becomes a Date (a real calendar date in
 * the range PostgreSQL stores); a duration is checked here. Either way a bad one is a 4xx with its path.
 */
function deadlineOf(d: SubmitBody['deadline']): Date | string | number | undefined {
  if (d === undefined) return undefined;
  if (typeof d === 'string' && /^[+-]?\d{4,}-/.test(d)) {
    const at = requestTimestampSchema.safeParse(d);
    if (!at.success) throw new InvalidInputError(`not a date-time ${STORABLE_TIME_RANGE} (RFC 3339, with an offset)`, 'deadline');
    return new Date(at.data);
  }
  const res = resolveDuration(d);
  if ('problem' in res || res.ms <= 0) throw new InvalidInputError('problem' in res ? res.problem : 'must be more than 0 ms', 'deadline');
  return d;
}

export function createRunService(ratchet: Ratchet): RunService {
  const requireRun = async (id: string) => {
    const run = await ratchet.store.getRun(id);
    if (!run) throw new UnknownRunError(id);
    return run;
  };
  return {
    async submit(body, idempotencyKey) {
      const deadline = deadlineOf(body.deadline);
      const r = await ratchet.submit(body.workflow, body.input, {
        ...(idempotencyKey ? { idempotencyKey } : {}),
        ...(deadline !== undefined ? { deadline } : {}),
        ...(body.version !== undefined ? { version: body.version } : {}),
        ...(body.priority !== undefined ? { priority: body.priority } : {}),
      });
      return { id: r.id, workflow: body.workflow, state: r.state, created: r.created, idempotencyKey: idempotencyKey ?? null };
    },
    async get(id) {
      const row = await requireRun(id);
      return { ...runToJson(row), usage: await runUsage(ratchet.store.db, id), traceId: runTraceId(id, row.traceparent) };
    },
    async list(q = {}) {
      const page = await ratchet.listRuns({
        ...(q.state ? { states: [...new Set(q.state.split(','))] as RunState[] } : {}),
        ...(q.workflow ? { workflow: q.workflow } : {}),
        ...(q.createdAfter ? { createdAfter: new Date(q.createdAfter) } : {}),
        ...(q.createdBefore ? { createdBefore: new Date(q.createdBefore) } : {}),
        ...(q.cursor ? { cursor: q.cursor } : {}),
        ...(q.limit ? { limit: Number(q.limit) } : {}),
      });
      return { runs: page.runs.map(runSummaryToJson), nextCursor: page.nextCursor };
    },
    async events(id, q = {}) {
      const limit = q.limit ? Number(q.limit) : 500;
      if (q.streamAfter !== undefined) {
        if (q.after !== undefined) throw new InvalidInputError('give after or streamAfter, not both', 'streamAfter');
        const db = ratchet.store.db;
        let position = STREAM_START;
        if (q.streamAfter !== '0') {
          const p = await eventPosition(db, id, q.streamAfter);
          if (!p) {
            await requireRun(id);
            throw new InvalidInputError(`event ${q.streamAfter} is not an event of run ${id}`, 'streamAfter');
          }
          position = p;
        }
        const batch = await readStreamBatch(db, id, position, limit);
        if (batch.events.length === 0) await requireRun(id);
        return {
          runId: id,
          events: batch.events.map(eventToJson),
          nextCursor: batch.full && !batch.heldBack ? batch.events.at(-1)!.id : null,
        };
      }
      const events = await ratchet.store.listEvents(id, { ...(q.after ? { after: q.after } : {}), limit });
      if (events.length === 0) await requireRun(id); // an empty page of a run that exists, or an unknown run
      return { runId: id, events: events.map(eventToJson), nextCursor: events.length === limit ? events.at(-1)!.id : null };
    },
    async explain(id) {
      const e = await ratchet.explain(id);
      if (e.verdict === 'unknown_run') throw new UnknownRunError(id);
      return e;
    },
    async cancel(id) {
      const r = await ratchet.cancel(id);
      if (!r) throw new UnknownRunError(id);
      if (!r.cancelled && r.previousState !== 'cancelled') throw new RunAlreadyTerminalError(id, r.previousState);
      return cancelToJson(id, r);
    },
    async retry(id) {
      const r = await ratchet.retry(id);
      if (!r) throw new UnknownRunError(id);
      if (!r.retried || !r.stage) {
        const reason = r.reason ?? 'not_failed';
        throw new RunNotRetryableError(
          id,
          r.previousState,
          reason,
          reason === 'not_failed' ? RETRY_HINTS[r.previousState] : RETRY_HINTS[reason],
        );
      }
      return retryToJson(id, { ...r, stage: r.stage });
    },
  };
}
