CREATE TABLE "ratchet"."signals" (
	"id" bigint PRIMARY KEY GENERATED ALWAYS AS IDENTITY (sequence name "ratchet"."signals_id_seq" INCREMENT BY 1 MINVALUE 1 MAXVALUE 9223372036854775807 START WITH 1 CACHE 1),
	"run_id" uuid NOT NULL,
	"name" text NOT NULL,
	"signal_id" text NOT NULL,
	"payload" jsonb NOT NULL,
	"payload_hash" text NOT NULL,
	"sent_by" text,
	"received_at" timestamp with time zone DEFAULT now() NOT NULL,
	"consumed_at" timestamp with time zone,
	"consumed_by" bigint
);
--> statement-breakpoint
CREATE TABLE "ratchet"."waits" (
	"stage_id" bigint PRIMARY KEY NOT NULL,
	"run_id" uuid NOT NULL,
	"kind" text NOT NULL,
	"signal_name" text,
	"since" timestamp with time zone NOT NULL,
	"wait_until" timestamp with time zone,
	"ended_at" timestamp with time zone,
	"outcome" text,
	"decided_by" text,
	"actor" text,
	"reason" text,
	"input_hash" text,
	"signal_id" text,
	CONSTRAINT "waits_kind_ck" CHECK ("ratchet"."waits"."kind" in ('sleep','signal','approval')),
	CONSTRAINT "waits_signal_name_ck" CHECK (("ratchet"."waits"."kind" = 'signal') = ("ratchet"."waits"."signal_name" is not null)),
	CONSTRAINT "waits_outcome_ck" CHECK ("ratchet"."waits"."outcome" is null or "ratchet"."waits"."outcome" in ('woken','signalled','timed_out','approved','rejected','cancelled')),
	CONSTRAINT "waits_ended_ck" CHECK (("ratchet"."waits"."ended_at" is null) = ("ratchet"."waits"."outcome" is null))
);
--> statement-breakpoint
ALTER TABLE "ratchet"."signals" ADD CONSTRAINT "signals_run_id_runs_id_fk" FOREIGN KEY ("run_id") REFERENCES "ratchet"."runs"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "ratchet"."waits" ADD CONSTRAINT "waits_stage_id_stages_id_fk" FOREIGN KEY ("stage_id") REFERENCES "ratchet"."stages"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "ratchet"."waits" ADD CONSTRAINT "waits_run_id_runs_id_fk" FOREIGN KEY ("run_id") REFERENCES "ratchet"."runs"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
CREATE UNIQUE INDEX "signals_run_signal_id_uq" ON "ratchet"."signals" USING btree ("run_id","signal_id");--> statement-breakpoint
CREATE INDEX "signals_kept_idx" ON "ratchet"."signals" USING btree ("run_id","name","id") WHERE consumed_at is null;--> statement-breakpoint
CREATE INDEX "waits_due_idx" ON "ratchet"."waits" USING btree ("wait_until") WHERE ended_at is null and wait_until is not null;--> statement-breakpoint
CREATE INDEX "waits_run_idx" ON "ratchet"."waits" USING btree ("run_id");--> statement-breakpoint
CREATE INDEX "waits_open_kind_idx" ON "ratchet"."waits" USING btree ("kind") WHERE ended_at is null;--> statement-breakpoint
CREATE INDEX "waits_open_approval_idx" ON "ratchet"."waits" USING btree ("since") WHERE kind = 'approval' and ended_at is null;--> statement-breakpoint
CREATE UNIQUE INDEX "waits_open_signal_uq" ON "ratchet"."waits" USING btree ("run_id","signal_name") WHERE kind = 'signal' and ended_at is null;