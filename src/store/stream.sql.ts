/**
 * Live streams (GET /v1/runs/:id/stream): a run's events in stream order, (tx, id), where tx is
 * the writing transaction's id (events.tx; NULL, read as 0, for rows older than the column).
 *
 * Why not id order: ids are taken when a row is inserted, not when it commits, so two
 * transactions writing one run's events (parallel stages, a heartbeat beside a finish) can
 * commit id 11 before id 10. A reader that had moved past 11 would never see 10. Instead a
 * reader only takes events whose transaction is older than the oldest transaction still running
 * (pg_snapshot_xmin of the statement's own snapshot): every such transaction has ended, so no
 * event can ever appear before them in (tx, id) order, and everything after the cursor arrives
 * later in that same order. `final` marks those rows; rows not final yet are held back (the
 * reader comes again soon: the transaction in the way is running now, so it is short or stuck).
 * The cost: a transaction that has written and stays open holds every stream back until it ends,
 * another database's on the same server included (transaction ids are the server's); a read-only
 * one takes no id and holds nothing back.
 *
 * $1 run id, $2 cursor tx (xid8 as text), $3 cursor event id, $4 limit. Uses events_run_idx.
 */
export const STREAM_EVENTS_SQL = `
SELECT e.id::text AS id, e.run_id, e.stage_id::text AS stage_id, e.type, e.fence::text AS fence, e.attempt, e.at, e.data,
  coalesce(e.tx, '0'::xid8)::text AS tx,
  coalesce(e.tx, '0'::xid8) < pg_snapshot_xmin(pg_current_snapshot()) AS final
FROM ratchet.events e
WHERE e.run_id = $1::uuid AND (coalesce(e.tx, '0'::xid8), e.id) > ($2::xid8, $3::bigint)
ORDER BY coalesce(e.tx, '0'::xid8), e.id
LIMIT $4`;

/** The stream position of event $2 of run $1 (a Last-Event-ID), or no row. */
export const EVENT_POSITION_SQL = `
SELECT coalesce(e.tx, '0'::xid8)::text AS tx FROM ratchet.events e WHERE e.run_id = $1::uuid AND e.id = $2::bigint`;

/**
 * Has the stream of run $1 ended at position ($2 tx, $3 id)? The run's state, and whether a
 * run_retried event lies after that position (a failed run retried goes on: its stream does
 * too). A retry commits its event with the state change, so the two agree in one snapshot.
 * No row for an unknown run.
 */
export const END_CHECK_SQL = `
SELECT r.state, EXISTS (
  SELECT 1 FROM ratchet.events e
  WHERE e.run_id = r.id AND e.type = 'run_retried' AND (coalesce(e.tx, '0'::xid8), e.id) > ($2::xid8, $3::bigint)
) AS retried_after
FROM ratchet.runs r WHERE r.id = $1::uuid`;

/**
 * Where there is no LISTEN (embedded PGlite: one connection, transactions one at a time, so id
 * order is commit order): which of runs $2 have events after id $1, and the newest event id.
 */
export const EVENTS_SINCE_SQL = `
SELECT coalesce(max(id), $1::bigint)::text AS last_id,
  coalesce(array_agg(DISTINCT run_id::text) FILTER (WHERE run_id = ANY($2::uuid[])), '{}') AS run_ids
FROM ratchet.events WHERE id > $1::bigint`;

/** The newest event id (where a poller starts). */
export const LAST_EVENT_ID_SQL = `SELECT coalesce(max(id), 0)::text AS last_id FROM ratchet.events`;

/**
 * The dashboard's run page: the newest $2 events of run $1's final part, newest first (the caller
 * turns them round). Final is STREAM_EVENTS_SQL's: the writing transaction is older than the oldest
 * one still running. Rows come in (tx, id) order, tx first, so the final rows are a prefix of the
 * stream, and these are its end: a page showing them resumes the stream after the last one and
 * misses nothing, even an event with a lower id that a running transaction commits later.
 * $1 run id, $2 limit.
 */
export const STREAM_TAIL_SQL = `
SELECT e.id::text AS id, e.run_id, e.stage_id::text AS stage_id, e.type, e.fence::text AS fence, e.attempt, e.at, e.data,
  coalesce(e.tx, '0'::xid8)::text AS tx
FROM ratchet.events e
WHERE e.run_id = $1::uuid AND coalesce(e.tx, '0'::xid8) < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY coalesce(e.tx, '0'::xid8) DESC, e.id DESC
LIMIT $2`;

/**
 * STREAM_TAIL_SQL over the run's newest $3 events by id only (events_run_idx backwards, no sort of
 * the whole run): for views that redraw from recent events (the dashboard's panel refresh), not for
 * a resume position; an event outside that window (a transaction that took its id long before it
 * committed) is missing from it.
 */
export const STREAM_TAIL_RECENT_SQL = `
SELECT w.id, w.run_id, w.stage_id, w.type, w.fence, w.attempt, w.at, w.data, w.txv::text AS tx FROM (
  SELECT e.id::text AS id, e.run_id, e.stage_id::text AS stage_id, e.type, e.fence::text AS fence, e.attempt, e.at, e.data,
    coalesce(e.tx, '0'::xid8) AS txv, e.id AS idv
  FROM ratchet.events e WHERE e.run_id = $1::uuid ORDER BY e.id DESC LIMIT $3
) w
WHERE w.txv < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY w.txv DESC, w.idv DESC
LIMIT $2`;

/** How many of run $1's events come before position ($2 tx, $3 id) in stream order (all final: they precede a final one). */
export const STREAM_COUNT_BEFORE_SQL = `
SELECT count(*)::int AS n FROM ratchet.events e
WHERE e.run_id = $1::uuid AND (coalesce(e.tx, '0'::xid8), e.id) < ($2::xid8, $3::bigint)`;
