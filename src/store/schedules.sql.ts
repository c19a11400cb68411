/**
 * Schedules' SQL (tables in ./schedules.schema.ts). Times come from ratchet.db_now(), the
 * movable database clock; cron arithmetic is the application's (src/schedules/ticks.ts), which
 * stores each schedule's next tick so "what is due" is one index range here.
 */

export const DB_NOW_SQL = `SELECT ratchet.db_now() AS now`;

/** $1 name. An existing schedule's row, locked for an upsert: what a replace compares (cron, zone) and the code sync checks. */
export const LOCK_SCHEDULE_SQL = `
SELECT last_tick_at, cron, timezone, source, definition_hash, retired_at FROM ratchet.schedules WHERE name = $1 FOR UPDATE`;

/**
 * $1 name, $2 cron, $3 timezone, $4 workflow, $5 input (json text), $6 overlap, $7 catch_up,
 * $8 source, $9 last_tick_at, $10 next_tick_at, $11 priority, $12 definition hash. An existing
 * row keeps its tick history (last_run_id; last_tick_at as the caller computed it: a changed cron
 * or zone counts from now, never firing a tick of the past). A replace is a fresh start: it
 * un-retires, forgets the failures and ends a back-off (a lease a worker holds stays).
 */
export const UPSERT_SCHEDULE_SQL = `
INSERT INTO ratchet.schedules AS s
  (name, cron, timezone, workflow, input, overlap, catch_up, source, last_tick_at, next_tick_at, priority, definition_hash,
   created_at, updated_at)
VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9, $10, $11, $12, ratchet.db_now(), ratchet.db_now())
ON CONFLICT (name) DO UPDATE SET
  cron = EXCLUDED.cron, timezone = EXCLUDED.timezone, workflow = EXCLUDED.workflow, input = EXCLUDED.input,
  overlap = EXCLUDED.overlap, catch_up = EXCLUDED.catch_up, source = EXCLUDED.source,
  last_tick_at = EXCLUDED.last_tick_at, next_tick_at = EXCLUDED.next_tick_at, priority = EXCLUDED.priority,
  definition_hash = EXCLUDED.definition_hash, retired_at = NULL, failures = 0, last_error = NULL,
  firing_until = CASE WHEN s.firing_owner IS NULL THEN NULL ELSE s.firing_until END,
  updated_at = ratchet.db_now()
RETURNING (xmax = 0) AS created`;

/**
 * $1 workflows the syncing process loads (text[]), $2 the code schedules it defines (names).
 * Retires the code schedules of those workflows that its files no longer define: kept (with their
 * history), fire nothing. Schedules of other workflows (another deployment's) and API ones are left alone.
 */
export const RETIRE_CODE_SCHEDULES_SQL = `
UPDATE ratchet.schedules SET retired_at = ratchet.db_now(), updated_at = ratchet.db_now()
WHERE source = 'code' AND retired_at IS NULL AND workflow = ANY($1::text[]) AND NOT (name = ANY($2::text[]))
RETURNING name`;

const COLUMNS = `name, cron, timezone, workflow, input, overlap, catch_up, source, priority, last_tick_at, next_tick_at, last_run_id,
  retired_at, failures, last_error, CASE WHEN firing_owner IS NULL THEN firing_until END AS backoff_until, created_at, updated_at`;

export const LIST_SCHEDULES_SQL = `SELECT ${COLUMNS} FROM ratchet.schedules ORDER BY name`;
export const GET_SCHEDULE_SQL = `SELECT ${COLUMNS} FROM ratchet.schedules WHERE name = $1`;
/** $1 name. The schedule and its tick rows (its runs stay, each with the schedule's idempotency key `schedule:<name>:<tick>`). */
export const DELETE_SCHEDULE_SQL = `
WITH s AS (DELETE FROM ratchet.schedules WHERE name = $1 RETURNING name),
t AS (DELETE FROM ratchet.schedule_ticks WHERE schedule IN (SELECT name FROM s))
SELECT name FROM s`;

/**
 * $1 owner, $2 workflows this worker can start (text[]), $3 limit, $4 lease ms. Takes the short
 * firing lease on up to $3 schedules with a tick due, not retired, whose lease (or back-off) is
 * free or lapsed; a schedule another worker is deciding is skipped (SKIP LOCKED, then the lease).
 * CTE + join: an `IN (... LIMIT n)` could touch more than n rows.
 */
export const LEASE_DUE_SCHEDULES_SQL = `
WITH due AS (
  SELECT name FROM ratchet.schedules
  WHERE next_tick_at <= ratchet.db_now() AND workflow = ANY($2::text[]) AND retired_at IS NULL
    AND (firing_until IS NULL OR firing_until < ratchet.db_now())
  ORDER BY next_tick_at
  LIMIT $3
  FOR UPDATE SKIP LOCKED
)
UPDATE ratchet.schedules s
SET firing_owner = $1, firing_until = ratchet.db_now() + $4 * interval '1 millisecond'
FROM due WHERE s.name = due.name
RETURNING s.name, s.cron, s.timezone, s.workflow, s.input, s.overlap, s.catch_up, s.priority, s.last_tick_at, s.last_run_id,
  s.failures, ratchet.db_now() AS now`;

/** $1 run id. Is the run still going (queued or running)? */
export const RUN_ACTIVE_SQL = `SELECT state IN ('queued','running') AS active FROM ratchet.runs WHERE id = $1`;

/**
 * $1 name, $2 owner, $3 tick, $4 outcome ('started' | 'skipped'), $5 run id (null when skipped).
 * Records one decided tick, only while $2 still holds the firing lease and the tick is newer
 * than the last decided one; the (schedule, tick_at) key refuses a second row for one tick
 * (a 'failed' row of the tick, from an earlier attempt, becomes the decided one, its error kept).
 */
export const RECORD_TICK_SQL = `
WITH s AS (
  UPDATE ratchet.schedules
  SET last_tick_at = $3, last_run_id = coalesce($5::uuid, last_run_id), updated_at = ratchet.db_now()
  WHERE name = $1 AND firing_owner = $2 AND last_tick_at < $3
  RETURNING name
)
INSERT INTO ratchet.schedule_ticks AS t (schedule, tick_at, outcome, run_id)
SELECT name, $3, $4, $5::uuid FROM s
ON CONFLICT (schedule, tick_at) DO UPDATE SET outcome = EXCLUDED.outcome, run_id = EXCLUDED.run_id WHERE t.outcome = 'failed'
RETURNING schedule`;

/**
 * $1 name, $2 owner, $3 tick, $4 error (json text). A tick whose submit failed: recorded as
 * 'failed' (not decided: last_tick_at does not move, the tick is tried again after the back-off),
 * only while $2 holds the lease.
 */
export const RECORD_FAILED_TICK_SQL = `
INSERT INTO ratchet.schedule_ticks AS t (schedule, tick_at, outcome, error)
SELECT name, $3, 'failed', $4::jsonb FROM ratchet.schedules WHERE name = $1 AND firing_owner = $2 AND last_tick_at < $3
ON CONFLICT (schedule, tick_at) DO UPDATE SET error = EXCLUDED.error, created_at = ratchet.db_now() WHERE t.outcome = 'failed'
RETURNING schedule`;

/**
 * $1 name, $2 owner, $3 latest decided tick (null: none), $4 next tick (null: never), $5 cron and
 * $6 time zone the pass computed $4 with, $7 error (json text; null: the pass went well), $8 the
 * first back-off (ms), $9 the longest. Ends a firing pass and frees the lease: every tick up to
 * $3 is decided (the missed ones too). A replace that changed the cron or the zone during the pass
 * wins: next_tick_at becomes now (the next pass computes it from the new expression) instead of $4.
 * A failed pass counts the failure and backs off (firing_until with no owner): $8 doubled per
 * failure in a row, at most $9.
 */
export const FINISH_FIRING_SQL = `
UPDATE ratchet.schedules
SET last_tick_at = greatest(last_tick_at, coalesce($3, last_tick_at)),
    next_tick_at = CASE WHEN cron = $5 AND timezone = $6 THEN $4 ELSE ratchet.db_now() END,
    failures = CASE WHEN $7::jsonb IS NULL THEN 0 ELSE failures + 1 END,
    last_error = $7::jsonb,
    firing_owner = NULL,
    firing_until = CASE WHEN $7::jsonb IS NULL THEN NULL
      ELSE ratchet.db_now() + least($9::float8, $8::float8 * power(2, least(failures, 30))) * interval '1 millisecond' END,
    updated_at = ratchet.db_now()
WHERE name = $1 AND firing_owner = $2
RETURNING name`;

/** $1 name, $2 limit. The schedule's latest ticks, newest first. */
export const LIST_TICKS_SQL = `
SELECT tick_at, outcome, run_id, error, created_at FROM ratchet.schedule_ticks WHERE schedule = $1 ORDER BY tick_at DESC LIMIT $2`;
