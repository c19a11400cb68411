-- Hand-edited (before release): drizzle-kit also generated the two priority indexes here. A plain
-- CREATE INDEX on stages in the migrations' one transaction would hold this ADD COLUMN's lock for
-- the whole build; they are built CONCURRENTLY after the migrations instead (CONCURRENT_INDEXES
-- in src/store/migrate.ts). The snapshot still lists them, so drizzle-kit does not generate them again.
ALTER TABLE "ratchet"."runs" ADD COLUMN "priority" integer DEFAULT 0 NOT NULL;
--> statement-breakpoint
ALTER TABLE "ratchet"."stages" ADD COLUMN "priority" integer DEFAULT 0 NOT NULL;
