import { z } from 'zod';
import { ApiError, errorBodySchema } from '../api/errors.js';
import { eventPositionSchema, eventSchema, type RunJson } from '../api/schemas.js';
import { TERMINAL_EVENT_TYPES } from '../planner/states.js';
import { parseInput } from '../store/validate.js';
import type { Clock } from './clock.js';
import type { HttpOptions } from './http.js';
import { createSseParser } from './sse.js';
import { waitForRun, type WaitOptions } from './wait.js';

export type EventJson = z.infer<typeof eventSchema>;
/** A streamed piece of a model stage's answer (GET /v1/runs/:id/stream, `event: token`). */
export interface TokenJson {
  stageId: string;
  fence: string;
  attempt: number;
  /** Position within its attempt's stream: a gap means pieces were lost (they are best effort). */
  index: number;
  text: string;
}

/** Event types that end a run (its stream ends with one). */
export const TERMINAL_EVENTS = TERMINAL_EVENT_TYPES;

export const watchOptionsSchema = z
  .object({
    /** Start after this event id (as Last-Event-ID): only later events come. */
    after: eventPositionSchema.optional(),
    /** Stop watching at this absolute time or after this many ms (default 10 minutes); the run goes on. */
    deadline: z.union([z.number().int().min(0), z.date()]).optional(),
    /** A stream silent (not even a heartbeat) for this long is dropped and reopened (default 45 s: three heartbeats). */
    idleTimeoutMs: z
      .number()
      .int()
      .min(10)
      .max(2 ** 31 - 1)
      .optional(),
    /** Consecutive failed connections (nothing received) before falling back to polling (default 5). */
    maxStreamFailures: z.number().int().min(1).max(1000).optional(),
    /** The first pause before reconnecting (default 250 ms, doubling up to 5 s). */
    reconnectMs: z.number().int().min(0).max(60_000).optional(),
    /** The bounded poller's schedule when falling back to polling (initialInterval, factor, maxInterval, jitter). */
    poll: z.custom<Omit<WaitOptions, 'deadline' | 'signal' | 'onRun'>>((v) => typeof v === 'object' && v !== null).optional(),
    /**
     * Called with each streamed piece of a model answer (a model with `stream: true`), as it
     * arrives: SSE `event: token`, not an event (no id, never replayed; none while polling).
     */
    onToken: z.custom<(t: TokenJson) => void>((v) => typeof v === 'function').optional(),
    /** Called when the stream cannot be used and the watch goes on by polling (why: the error code). */
    onFallback: z.custom<(why: string) => void>((v) => typeof v === 'function').optional(),
    signal: z.custom<AbortSignal>((v) => v instanceof AbortSignal).optional(),
  })
  .strict();
export type WatchOptions = z.input<typeof watchOptionsSchema>;

/** How a watch ended: the run's terminal event came (`ended`), or the watcher stopped first. */
export interface WatchEnd {
  outcome: 'ended' | 'client_deadline_exceeded' | 'aborted';
  /** The terminal event's type when ended (run_succeeded, ...). */
  terminal: string | null;
  /** The id of the last event delivered (resume with it). */
  lastEventId: string | null;
  /** stream: server-sent events throughout; poll: fell back to the bounded poller. */
  via: 'stream' | 'poll';
  reconnects: number;
}

const DEFAULT_DEADLINE_MS = 10 * 60_000;

/**
 * Watches a run's events as they are committed: opens GET /v1/runs/:id/stream, yields each
 * event once and in order, and reconnects with Last-Event-ID when the connection drops (or
 * stays silent past idleTimeoutMs). When the server has no stream (404 not_found) or the stream
 * keeps failing without delivering anything, it goes on with the bounded poller (wait.ts),
 * reading GET /v1/runs/:id/events?streamAfter=<last id> each poll (the stream's order, so an
 * event whose transaction commits after a higher id is not skipped). Returns how it ended; the run's
 * result is one `get(id)` away.
 */
export async function* watchRunEvents(
  http: HttpOptions,
  id: string,
  clock: Clock,
  random: () => number,
  getRun: (id: string, timeoutMs: number, signal?: AbortSignal) => Promise<RunJson>,
  listEvents: (id: string, after: string | undefined) => Promise<{ events: EventJson[]; nextCursor: string | null }>,
  options: WatchOptions = {},
): AsyncGenerator<EventJson, WatchEnd> {
  const o = parseInput(watchOptionsSchema, options, 'watch');
  const start = clock.now();
  const deadlineAt = o.deadline instanceof Date ? o.deadline.getTime() : start + (o.deadline ?? DEFAULT_DEADLINE_MS);
  const idleMs = o.idleTimeoutMs ?? 45_000;
  let last: string | null = o.after ?? null;
  let terminal: string | null = null;
  let reconnects = 0;
  let failures = 0;
  let pause = o.reconnectMs ?? 250;
  const end = (outcome: WatchEnd['outcome'], via: WatchEnd['via']): WatchEnd => ({ outcome, terminal, lastEventId: last, via, reconnects });
  const stopped = (): WatchEnd['outcome'] | null =>
    o.signal?.aborted ? 'aborted' : clock.now() >= deadlineAt ? 'client_deadline_exceeded' : null;

  let fallback: string | null = null;
  while (fallback === null) {
    const stop = stopped();
    if (stop) return end(stop, 'stream');
    const ac = new AbortController();
    const onAbort = () => ac.abort();
    o.signal?.addEventListener('abort', onAbort);
    const deadlineTimer = setTimeout(() => ac.abort(), Math.max(0, Math.min(deadlineAt - clock.now(), 2 ** 31 - 1)));
    let idle: NodeJS.Timeout | null = null;
    const touch = () => {
      if (idle) clearTimeout(idle);
      idle = setTimeout(() => ac.abort(), idleMs);
    };
    let delivered = 0;
    try {
      const headers: Record<string, string> = { accept: 'text/event-stream' };
      if (http.token) headers.authorization = `Bearer ${http.token}`;
      if (last) headers['last-event-id'] = last;
      touch();
      const res = await http.fetch(new URL(`/v1/runs/${encodeURIComponent(id)}/stream`, http.baseUrl), { headers, signal: ac.signal });
      if (res.status === 204) return end('ended', 'stream'); // resumed after the end: nothing left
      if (!res.ok) {
        const text = await res.text().catch(() => '');
        let body: z.infer<typeof errorBodySchema> | null = null;
        try {
          body = errorBodySchema.parse(JSON.parse(text));
        } catch {
          /* not an error body */
        }
        if (res.status === 404 && body?.error.code === 'not_found') {
          fallback = 'stream_not_served';
          break;
        }
        if (body && res.status < 500 && res.status !== 429) {
          throw new ApiError(res.status, body.error.code, body.error.message, { path: body.error.path, details: body.error.details });
        }
        throw new ApiError(
          res.status,
          res.status >= 500 ? 'internal' : 'invalid_response',
          `GET /v1/runs/${id}/stream: HTTP ${res.status}`,
        );
      }
      const parser = createSseParser();
      const decoder = new TextDecoder();
      const reader = res.body!.getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        touch();
        for (const m of parser.push(decoder.decode(value, { stream: true }))) {
          if (m.event === 'token') {
            o.onToken?.(JSON.parse(m.data) as TokenJson);
            continue;
          }
          if (m.event !== 'message') continue;
          const event = eventSchema.parse(JSON.parse(m.data));
          last = m.id ?? event.id;
          delivered++;
          failures = 0;
          if (TERMINAL_EVENTS.includes(event.type)) terminal = event.type;
          else if (event.type === 'run_retried') terminal = null;
          yield event;
        }
      }
      // A clean end after a terminal event is the run's end; otherwise (server stopping) reconnect.
      if (terminal !== null) return end('ended', 'stream');
    } catch (err) {
      if (err instanceof ApiError && err.status > 0 && err.code !== 'internal' && err.code !== 'invalid_response') throw err;
      if (err instanceof z.ZodError || err instanceof SyntaxError) {
        throw new ApiError(0, 'invalid_response', `GET /v1/runs/${id}/stream: a message does not fit the event schema`, { cause: err });
      }
      // the network, a silent stream, a 5xx: reconnect below
    } finally {
      clearTimeout(deadlineTimer);
      if (idle) clearTimeout(idle);
      o.signal?.removeEventListener('abort', onAbort);
      ac.abort();
    }
    if (delivered === 0 && ++failures >= (o.maxStreamFailures ?? 5)) {
      fallback = 'stream_failing';
      break;
    }
    reconnects++;
    const stopNow = stopped();
    if (stopNow) return end(stopNow, 'stream');
    await clock.sleep(Math.min(delivered > 0 ? (o.reconnectMs ?? 250) : pause, Math.max(0, deadlineAt - clock.now())), o.signal);
    if (delivered === 0) pause = Math.min(pause * 2, 5000);
    else pause = o.reconnectMs ?? 250;
  }

  // The bounded poller: each read takes the run's state and then its events after the last one, in stream order.
  o.onFallback?.(fallback);
  const queue: EventJson[] = [];
  let wake: (() => void) | null = null;
  let finished: { state: string | null; error: unknown } | null = null;
  const drain = async () => {
    for (;;) {
      const page = await listEvents(id, last ?? undefined);
      for (const e of page.events) {
        queue.push(e);
        last = e.id;
      }
      if (!page.nextCursor) return;
    }
  };
  const polling = waitForRun(
    id,
    async (timeoutMs) => {
      const run = await getRun(id, timeoutMs, o.signal);
      await drain();
      wake?.();
      return run;
    },
    clock,
    random,
    { ...o.poll, deadline: new Date(deadlineAt), ...(o.signal ? { signal: o.signal } : {}) },
  ).then(
    (w) => {
      finished = { state: w.state, error: null };
      wake?.();
      return w;
    },
    (err: unknown) => {
      finished = { state: null, error: err };
      wake?.();
      throw err;
    },
  );
  polling.catch(() => {});
  for (;;) {
    while (queue.length > 0) {
      const e = queue.shift()!;
      if (TERMINAL_EVENTS.includes(e.type)) terminal = e.type;
      else if (e.type === 'run_retried') terminal = null;
      yield e;
    }
    if (finished) break;
    await new Promise<void>((resolve) => {
      wake = resolve;
    });
    wake = null;
  }
  const w = await polling;
  if (w.outcome === 'client_deadline_exceeded') return end(w.reason === 'aborted' ? 'aborted' : 'client_deadline_exceeded', 'poll');
  // The run is over, and its terminal event committed with that state. But a read in stream
  // order may still hold it back: it takes only events older than the oldest transaction running
  // anywhere on the database server (another database's included), and answers a held-back page
  // like the last one (no next cursor). So read until the terminal event has come.
  // A run retried meanwhile runs on for as long as it takes: then the pauses grow to the bounded
  // poller's longest interval (jittered), not 1 s.
  let pauseMs = 10;
  let retried = false;
  const longest = Math.max(typeof o.poll?.maxInterval === 'number' ? o.poll.maxInterval : 30_000, 1000);
  for (;;) {
    await drain();
    while (queue.length > 0) {
      const e = queue.shift()!;
      if (TERMINAL_EVENTS.includes(e.type)) terminal = e.type;
      else if (e.type === 'run_retried') {
        terminal = null;
        retried = true;
      }
      yield e;
    }
    if (terminal !== null) return end('ended', 'poll');
    const stop = stopped();
    if (stop) return end(stop, 'poll');
    const pause = retried ? pauseMs * (0.8 + random() * 0.4) : pauseMs;
    await clock.sleep(Math.min(pause, Math.max(0, deadlineAt - clock.now())), o.signal);
    pauseMs = Math.min(pauseMs * 2, retried ? longest : 1000);
  }
}
