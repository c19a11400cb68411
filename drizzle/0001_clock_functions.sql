-- The movable clock. Every lease statement reads time through ratchet.db_now(), never from a
-- process: production keeps offset_ms at 0; tests move it forward to expire leases without
-- sleeping, and every connection and process sees the move at once.
INSERT INTO "ratchet"."clock" ("id", "offset_ms") VALUES (1, 0) ON CONFLICT ("id") DO NOTHING;
--> statement-breakpoint
-- Transaction time (now()) plus the offset. STABLE, so it is evaluated once per statement.
CREATE OR REPLACE FUNCTION "ratchet"."db_now"() RETURNS timestamptz
  LANGUAGE sql STABLE PARALLEL SAFE AS
$$ SELECT now() + coalesce((SELECT "offset_ms" FROM "ratchet"."clock" WHERE "id" = 1), 0) * interval '1 millisecond' $$;
--> statement-breakpoint
-- Wall-clock time plus the offset, for long transactions.
CREATE OR REPLACE FUNCTION "ratchet"."db_clock_now"() RETURNS timestamptz
  LANGUAGE sql VOLATILE PARALLEL SAFE AS
$$ SELECT clock_timestamp() + coalesce((SELECT "offset_ms" FROM "ratchet"."clock" WHERE "id" = 1), 0) * interval '1 millisecond' $$;
