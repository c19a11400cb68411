ALTER TABLE "ratchet"."schedule_ticks" DROP CONSTRAINT "schedule_ticks_outcome_ck";--> statement-breakpoint
ALTER TABLE "ratchet"."schedule_ticks" ADD COLUMN "error" jsonb;--> statement-breakpoint
ALTER TABLE "ratchet"."schedules" ADD COLUMN "priority" integer;--> statement-breakpoint
ALTER TABLE "ratchet"."schedules" ADD COLUMN "definition_hash" text;--> statement-breakpoint
ALTER TABLE "ratchet"."schedules" ADD COLUMN "retired_at" timestamp with time zone;--> statement-breakpoint
ALTER TABLE "ratchet"."schedules" ADD COLUMN "failures" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "ratchet"."schedules" ADD COLUMN "last_error" jsonb;--> statement-breakpoint
ALTER TABLE "ratchet"."schedule_ticks" ADD CONSTRAINT "schedule_ticks_outcome_ck" CHECK ("ratchet"."schedule_ticks"."outcome" in ('started','skipped','failed'));