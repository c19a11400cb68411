import { z } from 'zod';
import { ApiError } from '../api/errors.js';
import type { RunJson } from '../api/schemas.js';
import { resolveDuration } from '../definitions/duration.js';
import type { RunState } from '../planner/states.js';
import { TERMINAL_RUN_STATES } from '../planner/states.js';
import { parseInput } from '../store/validate.js';
import type { Clock } from './clock.js';

/**
 * The bounded poller (the Russian seed, "ритм опроса"): read the run's state, stop at a
 * terminal state, else wait and read again, each wait `factor` times the last up to
 * `maxInterval`, jittered so many watched runs spread out. Two clocks, never mixed: a read has
 * its own short `readTimeout`; the run has the caller's `deadline`, and passing it gives
 * `client_deadline_exceeded` — "no longer watching", not "dead". A read that times out or
 * fails in transit is retried as a read (never a resubmit); reads are bounded by `maxPolls`.
 */
const duration = z.union([z.number().int().min(0), z.string().min(1)]).transform((v, ctx) => {
  const r = resolveDuration(v);
  if ('problem' in r) {
    ctx.issues.push({ code: 'custom', message: r.problem, input: v });
    return z.NEVER;
  }
  return r.ms;
});

export const waitOptionsSchema = z
  .object({
    /** How long to watch: a duration ("10m", ms) from now, or an absolute Date (default 10 minutes). */
    deadline: z.union([duration, z.date()]).optional(),
    /** One status read's own timeout (default 10 s): short, it is only a read. */
    readTimeout: duration.refine((n) => n > 0, 'must be more than 0 ms').optional(),
    /** The first wait (default 1 s). */
    initialInterval: duration.refine((n) => n > 0, 'must be more than 0 ms').optional(),
    /** Each wait is the last one times this (default 1.5). */
    factor: z.number().min(1).max(10).optional(),
    /** The longest wait (default 30 s). */
    maxInterval: duration.refine((n) => n > 0, 'must be more than 0 ms').optional(),
    /** At most this many reads (default: what the schedule makes within the deadline, twice over for reads retried). */
    maxPolls: z.number().int().min(1).max(1_000_000).optional(),
    /** 0..1: each wait is drawn from [w × (1 − jitter), w] (default 0.2), so many watched runs spread out. */
    jitter: z.number().min(0).max(1).optional(),
    /** A wait before the first read (default 0; waitAll staggers the first reads of many runs with it). */
    initialDelay: duration.optional(),
    /** Called with each run read (e.g. to show stage progress). */
    onRun: z.custom<(run: RunJson) => void>((v) => typeof v === 'function').optional(),
    /** Called after each read with what was seen and decided. */
    onPoll: z.custom<(poll: PollRecord) => void>((v) => typeof v === 'function').optional(),
    signal: z.custom<AbortSignal>((v) => v instanceof AbortSignal).optional(),
  })
  .strict();
export type WaitOptions = z.input<typeof waitOptionsSchema>;

export const DEFAULT_WAIT_DEADLINE_MS = 10 * 60_000;

/** One line per read: id, state, elapsed, the wait chosen and the decision (ids and states only, never inputs or results). */
export interface PollRecord {
  runId: string;
  poll: number;
  state: RunState | null;
  elapsedMs: number;
  /** The wait before the next read, or null when the watch ends here. */
  intervalMs: number | null;
  decision: 'done' | 'wait' | 'retry_read' | 'give_up';
  /** Why the read failed, when it did (read_timeout, network_error, database_unavailable...). */
  readError: string | null;
}

export interface WaitOutcome {
  outcome: 'succeeded' | 'failed' | 'cancelled' | 'expired' | 'client_deadline_exceeded';
  /** terminal: the run ended; deadline / max_polls / aborted (the caller's signal): we stopped watching, the run may well go on. */
  reason: 'terminal' | 'deadline' | 'max_polls' | 'aborted';
  runId: string;
  /** The last state seen, null when no read succeeded. */
  state: RunState | null;
  /** The last run read. */
  run: RunJson | null;
  result: unknown;
  /** The run's error (failed, cancelled, expired), null otherwise. */
  error: unknown;
  /** The last read that failed, if the last read failed. */
  lastReadError: { code: string; message: string } | null;
  polls: number;
  elapsedMs: number;
}

/** Read failures worth another read: no answer, or the server (or its database) briefly away. */
function retryableRead(err: unknown): err is ApiError {
  return (
    err instanceof ApiError &&
    (err.code === 'read_timeout' ||
      err.code === 'network_error' ||
      err.code === 'database_unavailable' ||
      err.status >= 500 ||
      err.status === 429)
  );
}

/** How many reads the schedule makes within `deadlineMs` at its shortest waits (the first read included). */
export function plannedPolls(deadlineMs: number, initial: number, factor: number, max: number, jitter: number): number {
  let t = 0;
  let n = 1;
  let iv = initial;
  while (t < deadlineMs && n < 1_000_000) {
    t += Math.max(1, iv * (1 - jitter));
    n++;
    iv = Math.min(iv * factor, max);
  }
  return n;
}

export async function waitForRun(
  id: string,
  read: (timeoutMs: number) => Promise<RunJson>,
  clock: Clock,
  random: () => number,
  options: WaitOptions = {},
): Promise<WaitOutcome> {
  const o = parseInput(waitOptionsSchema, options, 'wait');
  const initial = o.initialInterval ?? 1000;
  const factor = o.factor ?? 1.5;
  const maxInterval = Math.max(o.maxInterval ?? 30_000, initial);
  const jitter = o.jitter ?? 0.2;
  const readTimeout = o.readTimeout ?? 10_000;
  const start = clock.now();
  const deadlineAt = o.deadline instanceof Date ? o.deadline.getTime() : start + (o.deadline ?? DEFAULT_WAIT_DEADLINE_MS);
  const maxPolls = o.maxPolls ?? 2 * plannedPolls(Math.max(0, deadlineAt - start), initial, factor, maxInterval, jitter);

  let interval = initial;
  let polls = 0;
  let last: RunJson | null = null;
  let lastReadError: WaitOutcome['lastReadError'] = null;
  const end = (outcome: WaitOutcome['outcome'], reason: WaitOutcome['reason']): WaitOutcome => ({
    outcome,
    reason,
    runId: id,
    state: last?.state ?? null,
    run: last,
    result: last?.state === 'succeeded' ? last.result : null,
    error: last && last.state !== 'succeeded' ? (last.error ?? null) : null,
    lastReadError,
    polls,
    elapsedMs: clock.now() - start,
  });
  const record = (r: Omit<PollRecord, 'runId' | 'poll' | 'elapsedMs' | 'state'>) =>
    o.onPoll?.({ runId: id, poll: polls, state: last?.state ?? null, elapsedMs: clock.now() - start, ...r });

  if (o.initialDelay) await clock.sleep(Math.min(o.initialDelay, Math.max(0, deadlineAt - start)), o.signal);
  for (;;) {
    polls++;
    let readFailed: ApiError | null = null;
    try {
      last = await read(readTimeout);
      lastReadError = null;
      o.onRun?.(last);
    } catch (err) {
      if (!retryableRead(err)) throw err; // unknown_run, unauthorized...: not something another read fixes
      readFailed = err;
      lastReadError = { code: err.code, message: err.message };
    }
    if (last && !readFailed && TERMINAL_RUN_STATES.includes(last.state)) {
      record({ intervalMs: null, decision: 'done', readError: null });
      return end(last.state as Exclude<WaitOutcome['outcome'], 'client_deadline_exceeded'>, 'terminal');
    }
    const now = clock.now();
    const stop = now >= deadlineAt ? 'deadline' : polls >= maxPolls ? 'max_polls' : o.signal?.aborted ? 'aborted' : null;
    if (stop) {
      record({ intervalMs: null, decision: 'give_up', readError: readFailed?.code ?? null });
      return end('client_deadline_exceeded', stop);
    }
    let wait = Math.max(1, Math.round(interval * (1 - jitter * Math.min(1, Math.max(0, random())))));
    if (readFailed?.retryAfterMs) wait = Math.max(wait, Math.min(readFailed.retryAfterMs, maxInterval));
    wait = Math.min(wait, deadlineAt - now);
    record({ intervalMs: wait, decision: readFailed ? 'retry_read' : 'wait', readError: readFailed?.code ?? null });
    await clock.sleep(wait, o.signal);
    interval = Math.min(interval * factor, maxInterval);
  }
}
