CREATE TABLE "ratchet"."schedule_ticks" (
	"schedule" text NOT NULL,
	"tick_at" timestamp with time zone NOT NULL,
	"outcome" text NOT NULL,
	"run_id" uuid,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "schedule_ticks_schedule_tick_at_pk" PRIMARY KEY("schedule","tick_at"),
	CONSTRAINT "schedule_ticks_outcome_ck" CHECK ("ratchet"."schedule_ticks"."outcome" in ('started','skipped'))
);
--> statement-breakpoint
CREATE TABLE "ratchet"."schedules" (
	"name" text PRIMARY KEY NOT NULL,
	"cron" text NOT NULL,
	"timezone" text NOT NULL,
	"workflow" text NOT NULL,
	"input" jsonb NOT NULL,
	"overlap" text NOT NULL,
	"catch_up" integer NOT NULL,
	"source" text NOT NULL,
	"last_tick_at" timestamp with time zone NOT NULL,
	"next_tick_at" timestamp with time zone,
	"last_run_id" uuid,
	"firing_owner" text,
	"firing_until" timestamp with time zone,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "schedules_overlap_ck" CHECK ("ratchet"."schedules"."overlap" in ('skip','allow')),
	CONSTRAINT "schedules_catch_up_ck" CHECK ("ratchet"."schedules"."catch_up" >= 0),
	CONSTRAINT "schedules_source_ck" CHECK ("ratchet"."schedules"."source" in ('code','api'))
);
--> statement-breakpoint
CREATE INDEX "schedules_next_tick_idx" ON "ratchet"."schedules" USING btree ("next_tick_at");