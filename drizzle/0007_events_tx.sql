-- Live streams read a run's events in (tx, id) order up to the oldest transaction still running,
-- so an event whose transaction commits after a later id's never slips past a reader. The column
-- is added without a default first (no table rewrite: rows already there keep NULL, read as 0),
-- then new rows get their transaction's id.
ALTER TABLE "ratchet"."events" ADD COLUMN "tx" xid8;
--> statement-breakpoint
ALTER TABLE "ratchet"."events" ALTER COLUMN "tx" SET DEFAULT pg_current_xact_id();
