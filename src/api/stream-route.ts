import type { Context } from 'hono';
import { streamSSE } from 'hono/streaming';
import type { Logger } from 'pino';
import type { Ratchet } from '../engine.js';
import type { EventHub } from '../live/hub.js';
import { openRunStream } from '../live/run-stream.js';
import { ApiError } from './errors.js';
import { eventToJson } from './present.js';

/** How long an EventSource waits before reconnecting (the SSE `retry:` field). */
export const STREAM_RETRY_MS = 1000;

export interface StreamRouteOptions {
  ratchet: Ratchet;
  hub: EventHub;
  heartbeatMs?: number;
  logger: Logger;
}

/**
 * GET /v1/runs/:id/stream (and the dashboard's cookie twin): server-sent events of the run's
 * events as they are committed. Each message is one event as JSON (the shape of GET
 * /v1/runs/:id/events) with `id:` its event id; a client reconnecting with `Last-Event-ID`
 * (or `?after=<event id>`) gets every later event once, in order. The stream ends after the
 * run's terminal event; a reconnect after that gets 204 (EventSource stops retrying). Comment
 * lines (`: heartbeat`) keep idle proxies from closing it.
 */
export function streamHandler(opts: StreamRouteOptions) {
  return async (c: Context) => {
    const runId = c.req.param('id') ?? '';
    const resume = c.req.header('last-event-id')?.trim() || c.req.query('after') || undefined;
    if (resume !== undefined && !/^\d{1,19}$/.test(resume)) {
      throw new ApiError(400, 'invalid_request', 'Last-Event-ID (or ?after) must be an event id of this run', { path: 'Last-Event-ID' });
    }
    const ac = new AbortController();
    const stream = await openRunStream(opts.ratchet.store.db, opts.hub, runId, {
      ...(resume !== undefined ? { afterEventId: resume } : {}), heartbeatMs: opts.heartbeatMs, signal: ac.signal,
    });
    if (!stream) return c.body(null, 204);
    c.header('X-Accel-Buffering', 'no'); // nginx: pass each message on as it comes
    return streamSSE(c, async (sse) => {
      sse.onAbort(() => ac.abort());
      await sse.write(`retry: ${STREAM_RETRY_MS}\n\n`);
      try {
        for await (const item of stream) {
          if (sse.aborted || sse.closed) break;
          if (item.kind === 'heartbeat') await sse.write(': heartbeat\n\n');
          else await sse.writeSSE({ id: item.event.id, data: JSON.stringify(eventToJson(item.event)) });
        }
      } catch (err) {
        if (!ac.signal.aborted) {
          opts.logger.warn({ event: 'stream_failed', runId, err: (err as Error).message }, 'a run stream ended early');
        }
      } finally {
        ac.abort();
        await stream.return(undefined);
      }
    });
  };
}
