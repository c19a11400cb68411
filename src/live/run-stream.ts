import { UnknownRunError } from '../errors.js';
import { TERMINAL_RUN_STATES, type RunState } from '../planner/states.js';
import type { Queryable } from '../store/db.js';
import type { EventRow } from '../store/runs.js';
import { endCheck, eventPosition, readStreamBatch, STREAM_START, type StreamPosition } from '../store/stream.js';
import { InvalidInputError } from '../errors.js';
import type { EventHub } from './hub.js';
import type { TokenDelta } from './tokens.js';

/** The events that end a run; its stream ends with one (unless the run was retried after it). */
export const TERMINAL_EVENT_TYPES = ['run_succeeded', 'run_failed', 'run_cancelled', 'run_expired'] as const;
const isTerminalEvent = (type: string) => (TERMINAL_EVENT_TYPES as readonly string[]).includes(type);
const isTerminalState = (state: string) => TERMINAL_RUN_STATES.includes(state as RunState);

export const DEFAULT_HEARTBEAT_MS = 15_000;
const BATCH = 500;
/** Held-back events (a transaction still running) are read again after this, doubling up to the max. */
const HELD_BACK_FIRST_MS = 10;
const HELD_BACK_MAX_MS = 250;

export type StreamedEvent = EventRow & { position: StreamPosition };
export type StreamItem = { kind: 'event'; event: StreamedEvent } | { kind: 'heartbeat' } | { kind: 'token'; token: TokenDelta };
/** Streamed pieces waiting for a slow watcher, at most: older ones are dropped (they are best effort). */
const MAX_PENDING_TOKENS = 1000;

export interface RunStreamOptions {
  /** Resume after this event id (Last-Event-ID): it must be an event of this run. */
  afterEventId?: string;
  /** A heartbeat item after this long without events (default 15 s); the run is also re-read then. */
  heartbeatMs?: number;
  signal?: AbortSignal;
}

/**
 * Opens run `runId`'s stream (see streamRun), or null when there is nothing left to send: the
 * run is over and the resume point is at or after its end. Throws UnknownRunError for an unknown
 * run and InvalidInputError (path Last-Event-ID) for a resume id that is not one of its events,
 * before anything is sent.
 */
export async function openRunStream(
  db: Queryable,
  hub: EventHub,
  runId: string,
  opts: RunStreamOptions = {},
): Promise<AsyncGenerator<StreamItem, void> | null> {
  let position = STREAM_START;
  if (opts.afterEventId !== undefined) {
    const p = await eventPosition(db, runId, opts.afterEventId);
    if (!p) {
      if (!(await endCheck(db, runId, STREAM_START))) throw new UnknownRunError(runId);
      throw new InvalidInputError(`event ${opts.afterEventId} is not an event of run ${runId}`, 'Last-Event-ID');
    }
    position = p;
  }
  const before = await endCheck(db, runId, position);
  if (!before) throw new UnknownRunError(runId);
  if (isTerminalState(before.state) && !before.retriedAfter) {
    const rest = await readStreamBatch(db, runId, position, 1);
    if (rest.events.length === 0 && !rest.heldBack) return null;
  }
  return streamRun(db, hub, runId, position, opts);
}

/**
 * A run's events as they are committed, in stream order ((tx, id): see src/store/stream.sql.ts),
 * each once, from `position` on; ends after the run's terminal event, or when the run is found
 * over with nothing left to send. Heartbeat items fill silences.
 */
async function* streamRun(
  db: Queryable,
  hub: EventHub,
  runId: string,
  start: StreamPosition,
  opts: RunStreamOptions,
): AsyncGenerator<StreamItem, void> {
  const heartbeatMs = opts.heartbeatMs ?? DEFAULT_HEARTBEAT_MS;
  let position = start;
  let dirty = true;
  let wakeUp: (() => void) | null = null;
  const wake = () => {
    dirty = true;
    wakeUp?.();
  };
  const unsubscribe = hub.subscribe(runId, wake);
  // Streamed model tokens: yielded as they come, between events; they wake the loop without a read.
  const tokens: TokenDelta[] = [];
  const unsubscribeTokens = hub.subscribeTokens(runId, (t) => {
    if (tokens.length >= MAX_PENDING_TOKENS) tokens.shift();
    tokens.push(t);
    wakeUp?.();
  });
  const stop = () => wakeUp?.();
  opts.signal?.addEventListener('abort', stop);
  hub.closed.addEventListener('abort', stop);
  const over = () => opts.signal?.aborted === true || hub.closed.aborted;
  try {
    let checkEnd = true; // first read, and after each quiet heartbeat: a run may be over already
    let heldBackMs = HELD_BACK_FIRST_MS;
    while (!over()) {
      while (tokens.length > 0) yield { kind: 'token', token: tokens.shift()! };
      if (dirty) {
        dirty = false;
        const at = position;
        const before = checkEnd ? await hub.shared(`end ${runId} ${at.tx} ${at.id}`, () => endCheck(db, runId, at)) : null;
        if (checkEnd && !before) throw new UnknownRunError(runId);
        const batch = await hub.shared(`read ${runId} ${at.tx} ${at.id}`, () => readStreamBatch(db, runId, at, BATCH));
        for (const e of batch.events) {
          position = e.position;
          yield { kind: 'event', event: e };
          if (isTerminalEvent(e.type)) {
            const at2 = position;
            const now = await hub.shared(`end ${runId} ${at2.tx} ${at2.id}`, () => endCheck(db, runId, at2));
            if (now && isTerminalState(now.state) && !now.retriedAfter) return;
          }
        }
        if (checkEnd && before && isTerminalState(before.state) && !before.retriedAfter && batch.events.length === 0 && !batch.heldBack)
          return;
        checkEnd = false;
        if (batch.full) dirty = true;
        if (batch.heldBack) {
          setTimeout(wake, heldBackMs).unref();
          heldBackMs = Math.min(heldBackMs * 2, HELD_BACK_MAX_MS);
        } else {
          heldBackMs = HELD_BACK_FIRST_MS;
        }
        if (dirty) continue;
      }
      const woken = await new Promise<boolean>((resolve) => {
        const t = setTimeout(() => resolve(false), heartbeatMs);
        wakeUp = () => {
          clearTimeout(t);
          resolve(true);
        };
        if (dirty || over() || tokens.length > 0) wakeUp();
      });
      wakeUp = null;
      if (!woken && !over()) {
        yield { kind: 'heartbeat' };
        dirty = true;
        checkEnd = true;
      }
    }
  } finally {
    unsubscribe();
    unsubscribeTokens();
    opts.signal?.removeEventListener('abort', stop);
    hub.closed.removeEventListener('abort', stop);
  }
}
