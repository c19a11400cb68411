/**
 * The history recorder: triggers on ratchet.stages and ratchet.runs that copy every INSERT and
 * UPDATE (old and new state, fence, owner, lease end; the run graph's seq, step, deps, map item
 * index and group; a run's parent) into the `chaos` schema, with the writing connection's
 * application_name (which process wrote), the writing transaction's id, its start time (now(), the clock the lease statements read through
 * ratchet.db_now(); the soak never moves the clock offset) and the write's wall time. One
 * sequence numbers the rows of both logs, so writes of a transaction can be ordered against
 * the other log's. Installed by the harness on its private database only (never a migration).
 */
export const INSTALL_HISTORY_SQL = `
CREATE SCHEMA IF NOT EXISTS chaos;
CREATE SEQUENCE IF NOT EXISTS chaos.log_seq;
CREATE TABLE IF NOT EXISTS chaos.stage_log (
  id bigint PRIMARY KEY DEFAULT nextval('chaos.log_seq'),
  at timestamptz NOT NULL DEFAULT clock_timestamp(),
  tx_at timestamptz NOT NULL DEFAULT now(),
  txid bigint NOT NULL DEFAULT txid_current(),
  op text NOT NULL,
  stage_id bigint NOT NULL, run_id uuid NOT NULL, tool text NOT NULL, tool_class text NOT NULL,
  concurrency_key text, concurrency_limit int,
  old_state text, new_state text NOT NULL, old_fence bigint, new_fence bigint, old_owner text, new_owner text,
  old_lease_until timestamptz, new_lease_until timestamptz, available_at timestamptz, attempt int NOT NULL,
  error_code text, seq int, step text, deps int[], item_index int, group_seq int, lease_ms int,
  -- Who wrote: the writing connection's application_name (each soak worker's is its name, the API's chaos-api).
  writer text DEFAULT current_setting('application_name', true)
);
CREATE TABLE IF NOT EXISTS chaos.run_log (
  id bigint PRIMARY KEY DEFAULT nextval('chaos.log_seq'),
  at timestamptz NOT NULL DEFAULT clock_timestamp(),
  tx_at timestamptz NOT NULL DEFAULT now(),
  txid bigint NOT NULL DEFAULT txid_current(),
  op text NOT NULL, run_id uuid NOT NULL, workflow text NOT NULL, old_state text, new_state text NOT NULL, parent_run_id uuid
);
CREATE OR REPLACE FUNCTION chaos.log_stage() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  INSERT INTO chaos.stage_log (op, stage_id, run_id, tool, tool_class, concurrency_key, concurrency_limit, old_state, new_state,
    old_fence, new_fence, old_owner, new_owner, old_lease_until, new_lease_until, available_at, attempt, error_code,
    seq, step, deps, item_index, group_seq, lease_ms)
  VALUES (lower(TG_OP), NEW.id, NEW.run_id, NEW.tool, NEW.tool_class, NEW.concurrency_key, NEW.concurrency_limit,
    CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END, NEW.state,
    CASE WHEN TG_OP = 'UPDATE' THEN OLD.fence END, NEW.fence,
    CASE WHEN TG_OP = 'UPDATE' THEN OLD.owner_id END, NEW.owner_id,
    CASE WHEN TG_OP = 'UPDATE' THEN OLD.lease_until END, NEW.lease_until, NEW.available_at, NEW.attempt,
    NEW.error ->> 'code', NEW.seq, coalesce(NEW.step, NEW.name), NEW.deps, NEW.item_index, NEW.group_seq, NEW.lease_ms);
  RETURN NULL;
END $fn$;
CREATE OR REPLACE FUNCTION chaos.log_run() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  IF TG_OP = 'UPDATE' AND OLD.state = NEW.state THEN RETURN NULL; END IF;
  INSERT INTO chaos.run_log (op, run_id, workflow, old_state, new_state, parent_run_id)
  VALUES (lower(TG_OP), NEW.id, NEW.workflow, CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END, NEW.state, NEW.parent_run_id);
  RETURN NULL;
END $fn$;
DROP TRIGGER IF EXISTS chaos_stage_log ON ratchet.stages;
CREATE TRIGGER chaos_stage_log AFTER INSERT OR UPDATE ON ratchet.stages FOR EACH ROW EXECUTE FUNCTION chaos.log_stage();
DROP TRIGGER IF EXISTS chaos_run_log ON ratchet.runs;
CREATE TRIGGER chaos_run_log AFTER INSERT OR UPDATE ON ratchet.runs FOR EACH ROW EXECUTE FUNCTION chaos.log_run();
`;

const ms = (col: string) => `(extract(epoch from ${col}) * 1000)::float8`;

export const READ_STAGE_LOG_SQL = `
SELECT id::float8 AS id, ${ms('at')} AS at, ${ms('tx_at')} AS tx_at, txid::text AS txid, op, stage_id::text AS stage_id,
  run_id::text AS run_id,
  tool, tool_class, concurrency_key, concurrency_limit, old_state, new_state, old_fence::text AS old_fence, new_fence::text AS new_fence,
  old_owner, new_owner, ${ms('old_lease_until')} AS old_lease_until, ${ms('new_lease_until')} AS new_lease_until,
  ${ms('available_at')} AS available_at, attempt, error_code, seq, step, deps, item_index, group_seq, lease_ms, writer
FROM chaos.stage_log ORDER BY id`;

export const READ_RUN_LOG_SQL = `
SELECT id::float8 AS id, ${ms('at')} AS at, ${ms('tx_at')} AS tx_at, txid::text AS txid, op, run_id::text AS run_id, workflow,
  old_state, new_state, parent_run_id::text AS parent_run_id
FROM chaos.run_log ORDER BY id`;

/** Final stages: a succeeded effect tool's result names the key its effect used. */
export const READ_STAGES_SQL = `
SELECT id::text AS id, run_id::text AS run_id, tool, state, result ->> 'key' AS effect_key FROM ratchet.stages ORDER BY id`;

/** The engine's own history (the checker cross-checks it against the trigger log). */
export const READ_EVENTS_SQL = `
SELECT id::float8 AS id, run_id::text AS run_id, stage_id::text AS stage_id, type, fence::text AS fence, ${ms('at')} AS at
FROM ratchet.events ORDER BY id`;
