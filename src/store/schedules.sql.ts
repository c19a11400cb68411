/**
 * Schedules' SQL (tables in ./schedules.schema.ts). Times come from ratchet.db_now(), the
 * movable database clock; cron arithmetic is the application's (src/schedules/ticks.ts), which
 * stores each schedule's next tick so "what is due" is one index range here.
 */

export const DB_NOW_SQL = `SELECT ratchet.db_now() AS now`;

/** $1 name. An existing schedule's row, locked for an upsert. */
export const LOCK_SCHEDULE_SQL = `SELECT last_tick_at FROM ratchet.schedules WHERE name = $1 FOR UPDATE`;

/**
 * $1 name, $2 cron, $3 timezone, $4 workflow, $5 input (json text), $6 overlap, $7 catch_up,
 * $8 source, $9 last_tick_at (for a new row: now), $10 next_tick_at. An existing row keeps its
 * tick history (last_tick_at, last_run_id): a changed cron never fires a tick already decided.
 */
export const UPSERT_SCHEDULE_SQL = `
INSERT INTO ratchet.schedules AS s
  (name, cron, timezone, workflow, input, overlap, catch_up, source, last_tick_at, next_tick_at, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9, $10, ratchet.db_now(), ratchet.db_now())
ON CONFLICT (name) DO UPDATE SET
  cron = EXCLUDED.cron, timezone = EXCLUDED.timezone, workflow = EXCLUDED.workflow, input = EXCLUDED.input,
  overlap = EXCLUDED.overlap, catch_up = EXCLUDED.catch_up, source = EXCLUDED.source,
  next_tick_at = EXCLUDED.next_tick_at, updated_at = ratchet.db_now()
RETURNING (xmax = 0) AS created`;

const COLUMNS = `name, cron, timezone, workflow, input, overlap, catch_up, source, last_tick_at, next_tick_at, last_run_id,
  created_at, updated_at`;

export const LIST_SCHEDULES_SQL = `SELECT ${COLUMNS} FROM ratchet.schedules ORDER BY name`;
export const GET_SCHEDULE_SQL = `SELECT ${COLUMNS} FROM ratchet.schedules WHERE name = $1`;
export const DELETE_SCHEDULE_SQL = `DELETE FROM ratchet.schedules WHERE name = $1 RETURNING name`;

/**
 * $1 owner, $2 workflows this worker can start (text[]), $3 limit, $4 lease ms. Takes the short
 * firing lease on up to $3 schedules with a tick due, whose lease is free or lapsed; a schedule
 * another worker is deciding is skipped (SKIP LOCKED, then the lease). CTE + join: an
 * `IN (... LIMIT n)` could touch more than n rows.
 */
export const LEASE_DUE_SCHEDULES_SQL = `
WITH due AS (
  SELECT name FROM ratchet.schedules
  WHERE next_tick_at <= ratchet.db_now() AND workflow = ANY($2::text[])
    AND (firing_until IS NULL OR firing_until < ratchet.db_now())
  ORDER BY next_tick_at
  LIMIT $3
  FOR UPDATE SKIP LOCKED
)
UPDATE ratchet.schedules s
SET firing_owner = $1, firing_until = ratchet.db_now() + $4 * interval '1 millisecond'
FROM due WHERE s.name = due.name
RETURNING s.name, s.cron, s.timezone, s.workflow, s.input, s.overlap, s.catch_up, s.last_tick_at, s.last_run_id,
  ratchet.db_now() AS now`;

/** $1 run id. Is the run still going (queued or running)? */
export const RUN_ACTIVE_SQL = `SELECT state IN ('queued','running') AS active FROM ratchet.runs WHERE id = $1`;

/**
 * $1 name, $2 owner, $3 tick, $4 outcome ('started' | 'skipped'), $5 run id (null when skipped).
 * Records one decided tick, only while $2 still holds the firing lease and the tick is newer
 * than the last decided one; the (schedule, tick_at) key refuses a second row for one tick.
 */
export const RECORD_TICK_SQL = `
WITH s AS (
  UPDATE ratchet.schedules
  SET last_tick_at = $3, last_run_id = coalesce($5::uuid, last_run_id), updated_at = ratchet.db_now()
  WHERE name = $1 AND firing_owner = $2 AND last_tick_at < $3
  RETURNING name
)
INSERT INTO ratchet.schedule_ticks (schedule, tick_at, outcome, run_id)
SELECT name, $3, $4, $5::uuid FROM s
ON CONFLICT (schedule, tick_at) DO NOTHING
RETURNING schedule`;

/**
 * $1 name, $2 owner, $3 latest decided tick (null: none due after all), $4 next tick (null: never).
 * Ends a firing pass: every tick up to $3 is decided (the missed ones too), the lease is freed.
 */
export const FINISH_FIRING_SQL = `
UPDATE ratchet.schedules
SET last_tick_at = greatest(last_tick_at, coalesce($3, last_tick_at)), next_tick_at = $4,
    firing_owner = NULL, firing_until = NULL, updated_at = ratchet.db_now()
WHERE name = $1 AND firing_owner = $2
RETURNING name`;

/** $1 name, $2 limit. The schedule's latest decided ticks, newest first. */
export const LIST_TICKS_SQL = `
SELECT tick_at, outcome, run_id, created_at FROM ratchet.schedule_ticks WHERE schedule = $1 ORDER BY tick_at DESC LIMIT $2`;
