import { once } from 'node:events';
import type { ServerResponse } from 'node:http';
import { RESPONSE_ALREADY_SENT } from '@hono/node-server/utils/response';
import type { Context } from 'hono';
import { streamSSE } from 'hono/streaming';
import type { Logger } from 'pino';
import type { Ratchet } from '../engine.js';
import type { EventHub } from '../live/hub.js';
import { openRunStreamChunks, type StreamChunk, type StreamedEvent } from '../live/run-stream.js';
import type { TokenDelta } from '../live/tokens.js';
import { ApiError } from './errors.js';
import { eventToJson } from './present.js';
import { isEventPosition } from './schemas.js';

/** How long an EventSource waits before reconnecting (the SSE `retry:` field). */
export const STREAM_RETRY_MS = 1000;

/**
 * One event's SSE message, made once however many watchers send it (their reads are shared,
 * so they hold the same event objects).
 */
const messages = new WeakMap<StreamedEvent, string>();
function messageOf(e: StreamedEvent): string {
  let m = messages.get(e);
  if (m === undefined) {
    m = `id: ${e.id}\ndata: ${JSON.stringify(eventToJson(e))}\n\n`;
    messages.set(e, m);
  }
  return m;
}
/**
 * A piece of the response body, and the same in HTTP/1.1 chunked framing (size line, bytes, CRLF),
 * made once for every watcher that sends it.
 */
interface Frame {
  body: Buffer;
  framed: Buffer;
}
const CRLF = Buffer.from('\r\n', 'latin1');
const frame = (body: Buffer): Frame => ({
  body,
  framed: Buffer.concat([Buffer.from(`${body.length.toString(16)}\r\n`, 'latin1'), body, CRLF]),
});
const HEARTBEAT = frame(Buffer.from(': heartbeat\n\n'));
/**
 * One chunk of events, encoded and framed once: the watchers that took the same events from the
 * run's feed hold the same array (RunFeed.take), so 50 watchers of one read cost one encoding.
 */
const chunkFrames = new WeakMap<readonly StreamedEvent[], Frame>();
function frameOf(c: StreamChunk): Frame {
  if (c.kind === 'heartbeat') return HEARTBEAT;
  if (c.kind === 'token') return frame(Buffer.from(tokenMessage(c.token)));
  let f = chunkFrames.get(c.events);
  if (f === undefined) {
    f = frame(Buffer.from(c.events.length === 1 ? messageOf(c.events[0]!) : c.events.map(messageOf).join('')));
    chunkFrames.set(c.events, f);
  }
  return f;
}
/**
 * A streamed piece of a model answer: its own SSE event type (`token`) and NO `id:` field, so a
 * client's Last-Event-ID stays the last event's and resumption stays exact (pieces are not replayed).
 */
const tokenMessage = (t: TokenDelta) =>
  `event: token\ndata: ${JSON.stringify({ stageId: t.stageId, fence: t.fence, attempt: t.attempt, index: t.index, text: t.text })}\n\n`;
const textOf = (c: StreamChunk): string =>
  c.kind === 'heartbeat' ? ': heartbeat\n\n' : c.kind === 'token' ? tokenMessage(c.token) : c.events.map(messageOf).join('');

/**
 * Writes the stream straight to Node's response (no web-stream layers between), one write per
 * chunk (a read's events together: one syscall per watcher per read), waiting for 'drain' when a
 * watcher reads slowly, so a slow watcher holds only its own stream back. Once the head is out
 * with chunked framing, a chunk goes to the socket already framed (the response's own framing cost
 * as much CPU per write as the syscall, times 50 watchers per read); otherwise (an HTTP/1.0
 * client, no socket yet) through the response. The response still ends the body (out.end).
 */
async function pipeToNode(out: ServerResponse, stream: AsyncGenerator<StreamChunk, void>, ac: AbortController): Promise<void> {
  out.on('close', () => ac.abort());
  out.writeHead(200, {
    'content-type': 'text/event-stream',
    'cache-control': 'no-cache',
    connection: 'keep-alive',
    'x-accel-buffering': 'no',
  });
  out.write(`retry: ${STREAM_RETRY_MS}\n\n`);
  try {
    for await (const chunk of stream) {
      if (ac.signal.aborted) break;
      const f = frameOf(chunk);
      if (f.body.length === 0) continue; // an empty chunk framed would be `0\r\n\r\n`: the end of the body
      const socket = out.socket;
      if (socket && out.headersSent && out.chunkedEncoding) {
        if (!socket.write(f.framed)) await once(socket, 'drain', { signal: ac.signal }).catch(() => {});
      } else if (!out.write(f.body)) await once(out, 'drain', { signal: ac.signal }).catch(() => {});
    }
  } finally {
    ac.abort();
    await stream.return(undefined);
    out.end();
  }
}

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
 * lines (`: heartbeat`) keep idle proxies from closing it. A streaming model's pieces come as
 * `event: token` messages without an id (src/live/tokens.ts): never stored, never replayed.
 */
export function streamHandler(opts: StreamRouteOptions) {
  return async (c: Context) => {
    const runId = c.req.param('id') ?? '';
    const resume = c.req.header('last-event-id')?.trim() || c.req.query('after') || undefined;
    if (resume !== undefined && !isEventPosition(resume)) {
      throw new ApiError(400, 'invalid_request', 'Last-Event-ID (or ?after) must be an event id of this run', { path: 'Last-Event-ID' });
    }
    const ac = new AbortController();
    const stream = await openRunStreamChunks(opts.ratchet.store.db, opts.hub, runId, {
      ...(resume !== undefined ? { afterEventId: resume } : {}),
      heartbeatMs: opts.heartbeatMs,
      signal: ac.signal,
    });
    if (!stream) return c.body(null, 204);
    const outgoing = (c.env as { outgoing?: ServerResponse } | undefined)?.outgoing;
    if (outgoing) {
      pipeToNode(outgoing, stream, ac).catch((err: unknown) => {
        if (!ac.signal.aborted)
          opts.logger.warn({ event: 'stream_failed', runId, err: (err as Error).message }, 'a run stream ended early');
      });
      return RESPONSE_ALREADY_SENT;
    }
    // Another runtime than Node: hono's own SSE helper.
    c.header('X-Accel-Buffering', 'no'); // nginx: pass each message on as it comes
    return streamSSE(c, async (sse) => {
      sse.onAbort(() => ac.abort());
      await sse.write(`retry: ${STREAM_RETRY_MS}\n\n`);
      try {
        for await (const chunk of stream) {
          if (sse.aborted || sse.closed) break;
          await sse.write(textOf(chunk));
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
