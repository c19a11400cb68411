/**
 * The evidence about one stage's class, read in one statement by the database clock (read
 * only: explain never changes anything). $1 stage id, $2 how recently a worker must have been
 * seen (ms), $3 the class's rate window (ms; 0 when it has none). Live leases are counted as
 * the limited claim counts them (running, lease_until >= now); workers of the stage's version
 * are those that serve its class and have loaded its run's definition hash; the backlog ahead
 * is the due queued stages of the class and definition the claim would take first (ordered by
 * available_at, id).
 */
export const STAGE_EVIDENCE_SQL = `
WITH clk AS MATERIALIZED (SELECT ratchet.db_now() AS t),
st AS (SELECT id, tool_class, definition_hash, available_at, concurrency_key, concurrency_limit FROM ratchet.stages WHERE id = $1::bigint)
SELECT clk.t AS now, st.concurrency_key, st.concurrency_limit, st.definition_hash,
  (SELECT count(*)::int FROM ratchet.workers w
    WHERE st.tool_class = ANY(w.classes) AND w.last_seen_at >= clk.t - $2::int * interval '1 millisecond') AS workers_recent,
  (SELECT count(*)::int FROM ratchet.workers w
    WHERE st.tool_class = ANY(w.classes) AND st.definition_hash = ANY(w.definitions)
      AND w.last_seen_at >= clk.t - $2::int * interval '1 millisecond') AS workers_with_definition,
  (SELECT max(w.last_seen_at) FROM ratchet.workers w WHERE st.tool_class = ANY(w.classes)) AS worker_last_seen,
  (SELECT max(s.heartbeat_at) FROM ratchet.stages s WHERE s.state = 'running' AND s.tool_class = st.tool_class) AS class_last_heartbeat,
  (SELECT count(*)::int FROM ratchet.stages s
    WHERE s.state = 'running' AND s.tool_class = st.tool_class AND s.lease_until >= clk.t) AS live_leases,
  (SELECT count(*)::int FROM ratchet.stages s
    WHERE s.state = 'running' AND s.concurrency_key = st.concurrency_key AND s.lease_until >= clk.t) AS key_live_leases,
  (SELECT count(*)::int FROM ratchet.rate_claims r
    WHERE r.tool_class = st.tool_class AND r.at >= clk.t - $3::int * interval '1 millisecond') AS rate_claims,
  (SELECT min(r.at) FROM ratchet.rate_claims r
    WHERE r.tool_class = st.tool_class AND r.at >= clk.t - $3::int * interval '1 millisecond') AS rate_oldest,
  (SELECT count(*)::int FROM ratchet.stages s
    WHERE s.state = 'queued' AND s.tool_class = st.tool_class AND s.definition_hash = st.definition_hash AND s.available_at <= clk.t
      AND (s.available_at, s.id) < (st.available_at, st.id)) AS backlog_ahead
FROM st CROSS JOIN clk`;

/** The database clock alone (for the answer about an unknown or finished run). */
export const DB_NOW_SQL = `SELECT ratchet.db_now() AS now`;

/**
 * A map stage's maxParallel: the limit its items (run $1, group_seq $2, step $3) carry under the
 * map's own key (planner/map.ts mapConcurrencyKey `run:step`; a workflow's key is not it); null without one.
 */
export const MAP_LIMIT_SQL = `
SELECT max(concurrency_limit)::int AS max_parallel FROM ratchet.stages
WHERE run_id = $1::uuid AND group_seq = $2::int AND concurrency_key = $3::text`;
