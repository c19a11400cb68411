-- Live streams (GET /v1/runs/:id/stream): every statement that writes events also sends one
-- NOTIFY per run on channel ratchet_events (payload: the run id), from the same transaction, so a
-- listener hears about events exactly when they are committed and reads them from the table by
-- id (the notification carries no event data and is only a wake-up). A statement-level trigger
-- with a transition table: one pass over the inserted rows, whatever the batch size; identical
-- payloads in one transaction are folded into one notification by PostgreSQL.
CREATE OR REPLACE FUNCTION "ratchet"."notify_events"() RETURNS trigger
  LANGUAGE plpgsql AS
$$
DECLARE
  r uuid;
BEGIN
  FOR r IN SELECT DISTINCT run_id FROM new_events LOOP
    PERFORM pg_notify('ratchet_events', r::text);
  END LOOP;
  RETURN NULL;
END
$$;
--> statement-breakpoint
DROP TRIGGER IF EXISTS "events_notify" ON "ratchet"."events";
--> statement-breakpoint
CREATE TRIGGER "events_notify" AFTER INSERT ON "ratchet"."events"
  REFERENCING NEW TABLE AS new_events FOR EACH STATEMENT EXECUTE FUNCTION "ratchet"."notify_events"();
