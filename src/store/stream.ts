import type { Queryable } from './db.js';
import { PG_BIGINT_MAX } from './validate.js';
import { eventOfRow, isUuid, type EventRow } from './runs.js';
import {
  EVENT_POSITION_SQL,
  EVENTS_SINCE_SQL,
  LAST_EVENT_ID_SQL,
  END_CHECK_SQL,
  STREAM_COUNT_BEFORE_SQL,
  STREAM_EVENTS_SQL,
  STREAM_TAIL_RECENT_SQL,
  STREAM_TAIL_SQL,
} from './stream.sql.js';

/** Where a live stream stands: after event `id`, whose transaction was `tx` (see stream.sql.ts). */
export interface StreamPosition {
  tx: string;
  id: string;
}
export const STREAM_START: StreamPosition = { tx: '0', id: '0' };

export interface StreamBatch {
  /** Events after the position that no running transaction can precede any more, in stream order. */
  events: (EventRow & { position: StreamPosition })[];
  /** Committed events held back behind a transaction still running: read again soon. */
  heldBack: boolean;
  /** The batch was full: more may be waiting. */
  full: boolean;
}

/** A stream read's row: the event and its stream position (tx, id). */
const streamedOfRow = (e: Record<string, unknown>): StreamBatch['events'][number] => ({
  ...eventOfRow(e),
  position: { tx: e.tx as string, id: e.id as string },
});

export async function readStreamBatch(q: Queryable, runId: string, after: StreamPosition, limit: number): Promise<StreamBatch> {
  const rows = await q.query(STREAM_EVENTS_SQL, [runId, after.tx, after.id, limit], 'ratchet_stream_events');
  const events: StreamBatch['events'] = [];
  for (const e of rows) {
    if (e.final !== true) break; // rows after the first held-back one are not final either (ordered by tx)
    events.push(streamedOfRow(e));
  }
  return { events, heldBack: events.length < rows.length, full: rows.length === limit };
}

/** The position of event `eventId` of run `runId` (a Last-Event-ID), or null when the run has no such event. */
export async function eventPosition(q: Queryable, runId: string, eventId: string): Promise<StreamPosition | null> {
  // An id past bigint is no event (PostgreSQL would refuse the cast: 22003).
  if (!isUuid(runId) || !/^\d{1,19}$/.test(eventId) || BigInt(eventId) > PG_BIGINT_MAX) return null;
  const [r] = await q.query(EVENT_POSITION_SQL, [runId, eventId], 'ratchet_event_position');
  return r ? { tx: r.tx as string, id: eventId } : null;
}

/** The run's state and whether it was retried after `at` (see END_CHECK_SQL), or null for an unknown run. */
export async function endCheck(q: Queryable, runId: string, at: StreamPosition): Promise<{ state: string; retriedAfter: boolean } | null> {
  if (!isUuid(runId)) return null;
  const [r] = await q.query(END_CHECK_SQL, [runId, at.tx, at.id], 'ratchet_stream_end_check');
  return r ? { state: r.state as string, retriedAfter: r.retried_after === true } : null;
}

/** Which of `runIds` have events after `afterId` (polling where there is no LISTEN), and the newest id. */
export async function eventsSince(q: Queryable, afterId: string, runIds: string[]): Promise<{ lastId: string; runIds: string[] }> {
  const [r] = await q.query(EVENTS_SINCE_SQL, [afterId, runIds], 'ratchet_events_since');
  return { lastId: (r?.last_id as string | undefined) ?? afterId, runIds: (r?.run_ids as string[] | undefined) ?? [] };
}

export async function lastEventId(q: Queryable): Promise<string> {
  const [r] = await q.query(LAST_EVENT_ID_SQL);
  return (r?.last_id as string | undefined) ?? '0';
}

/**
 * The newest `limit` events of run `runId` that are final (STREAM_TAIL_SQL), in stream order, and
 * whether earlier ones exist: the end of the stream's contiguous final prefix, so a reader that
 * has them resumes the stream after the last one (a dashboard page: nothing missed, nothing twice).
 * `recentOnly`: the same from the run's newest 2 x limit + 100 events by id only (STREAM_TAIL_RECENT_SQL:
 * no sort of a long run's every event), for a view redrawn from recent events, never a resume position.
 */
export async function readStreamTail(
  q: Queryable,
  runId: string,
  limit: number,
  opts: { recentOnly?: boolean } = {},
): Promise<{ events: StreamBatch['events']; earlier: boolean }> {
  if (!isUuid(runId)) return { events: [], earlier: false };
  const rows = opts.recentOnly
    ? await q.query(STREAM_TAIL_RECENT_SQL, [runId, limit + 1, 2 * limit + 100], 'ratchet_stream_tail_recent')
    : await q.query(STREAM_TAIL_SQL, [runId, limit + 1], 'ratchet_stream_tail');
  const events: StreamBatch['events'] = rows.slice(0, limit).map(streamedOfRow);
  return { events: events.reverse(), earlier: rows.length > limit };
}

/** How many of run `runId`'s events come before `before` in stream order. */
export async function countStreamBefore(q: Queryable, runId: string, before: StreamPosition): Promise<number> {
  if (!isUuid(runId)) return 0;
  const [r] = await q.query(STREAM_COUNT_BEFORE_SQL, [runId, before.tx, before.id], 'ratchet_stream_count_before');
  return (r?.n as number | undefined) ?? 0;
}
