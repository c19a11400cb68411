CREATE SCHEMA "ratchet";
--> statement-breakpoint
CREATE SEQUENCE "ratchet"."fence_seq" INCREMENT BY 1 MINVALUE 1 MAXVALUE 9223372036854775807 START WITH 1 CACHE 1;--> statement-breakpoint
CREATE TABLE "ratchet"."clock" (
	"id" integer PRIMARY KEY DEFAULT 1 NOT NULL,
	"offset_ms" bigint DEFAULT 0 NOT NULL,
	CONSTRAINT "clock_single_row_ck" CHECK ("ratchet"."clock"."id" = 1)
);
--> statement-breakpoint
CREATE TABLE "ratchet"."events" (
	"id" bigint PRIMARY KEY GENERATED ALWAYS AS IDENTITY (sequence name "ratchet"."events_id_seq" INCREMENT BY 1 MINVALUE 1 MAXVALUE 9223372036854775807 START WITH 1 CACHE 1),
	"run_id" uuid NOT NULL,
	"stage_id" bigint,
	"type" text NOT NULL,
	"fence" bigint,
	"attempt" integer,
	"at" timestamp with time zone DEFAULT now() NOT NULL,
	"data" jsonb
);
--> statement-breakpoint
CREATE TABLE "ratchet"."rate_claims" (
	"id" bigint PRIMARY KEY GENERATED ALWAYS AS IDENTITY (sequence name "ratchet"."rate_claims_id_seq" INCREMENT BY 1 MINVALUE 1 MAXVALUE 9223372036854775807 START WITH 1 CACHE 1),
	"tool_class" text NOT NULL,
	"at" timestamp with time zone NOT NULL
);
--> statement-breakpoint
CREATE TABLE "ratchet"."runs" (
	"id" uuid PRIMARY KEY NOT NULL,
	"workflow" text NOT NULL,
	"definition_hash" text NOT NULL,
	"input" jsonb NOT NULL,
	"state" text NOT NULL,
	"deadline" timestamp with time zone,
	"idempotency_key" text,
	"request_hash" text,
	"result" jsonb,
	"error" jsonb,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	"finished_at" timestamp with time zone,
	CONSTRAINT "runs_state_ck" CHECK ("ratchet"."runs"."state" in ('queued','running','succeeded','failed','cancelled','expired'))
);
--> statement-breakpoint
CREATE TABLE "ratchet"."stages" (
	"id" bigint PRIMARY KEY GENERATED ALWAYS AS IDENTITY (sequence name "ratchet"."stages_id_seq" INCREMENT BY 1 MINVALUE 1 MAXVALUE 9223372036854775807 START WITH 1 CACHE 1),
	"run_id" uuid NOT NULL,
	"seq" integer NOT NULL,
	"name" text NOT NULL,
	"tool" text NOT NULL,
	"tool_class" text NOT NULL,
	"state" text NOT NULL,
	"owner_id" text,
	"fence" bigint,
	"lease_ms" integer NOT NULL,
	"timeout_ms" integer NOT NULL,
	"max_duration_ms" integer NOT NULL,
	"lease_until" timestamp with time zone,
	"heartbeat_at" timestamp with time zone,
	"claimed_at" timestamp with time zone,
	"first_claimed_at" timestamp with time zone,
	"attempt" integer DEFAULT 0 NOT NULL,
	"max_attempts" integer NOT NULL,
	"available_at" timestamp with time zone DEFAULT now() NOT NULL,
	"idempotency_key" text NOT NULL,
	"input" jsonb,
	"concurrency_key" text,
	"concurrency_limit" integer,
	"result" jsonb,
	"error" jsonb,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	"finished_at" timestamp with time zone,
	CONSTRAINT "stages_state_ck" CHECK ("ratchet"."stages"."state" in ('pending','queued','running','succeeded','failed','cancelled')),
	CONSTRAINT "stages_durations_ck" CHECK ("ratchet"."stages"."lease_ms" > 0 and "ratchet"."stages"."timeout_ms" > 0 and "ratchet"."stages"."max_duration_ms" > 0 and "ratchet"."stages"."max_attempts" > 0)
);
--> statement-breakpoint
CREATE TABLE "ratchet"."workers" (
	"owner_id" text PRIMARY KEY NOT NULL,
	"classes" text[] NOT NULL,
	"started_at" timestamp with time zone NOT NULL,
	"last_seen_at" timestamp with time zone NOT NULL
);
--> statement-breakpoint
ALTER TABLE "ratchet"."stages" ADD CONSTRAINT "stages_run_id_runs_id_fk" FOREIGN KEY ("run_id") REFERENCES "ratchet"."runs"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "events_run_idx" ON "ratchet"."events" USING btree ("run_id","id");--> statement-breakpoint
CREATE INDEX "rate_claims_class_at_idx" ON "ratchet"."rate_claims" USING btree ("tool_class","at");--> statement-breakpoint
CREATE UNIQUE INDEX "runs_idempotency_key_uq" ON "ratchet"."runs" USING btree ("idempotency_key");--> statement-breakpoint
CREATE INDEX "runs_state_created_idx" ON "ratchet"."runs" USING btree ("state","created_at");--> statement-breakpoint
CREATE INDEX "runs_workflow_created_idx" ON "ratchet"."runs" USING btree ("workflow","created_at");--> statement-breakpoint
CREATE INDEX "runs_created_id_idx" ON "ratchet"."runs" USING btree ("created_at","id");--> statement-breakpoint
CREATE UNIQUE INDEX "stages_idempotency_key_uq" ON "ratchet"."stages" USING btree ("idempotency_key");--> statement-breakpoint
CREATE UNIQUE INDEX "stages_run_seq_uq" ON "ratchet"."stages" USING btree ("run_id","seq");--> statement-breakpoint
CREATE INDEX "stages_queued_claim_idx" ON "ratchet"."stages" USING btree ("tool_class","available_at","id") WHERE state = 'queued';--> statement-breakpoint
CREATE INDEX "stages_running_lease_idx" ON "ratchet"."stages" USING btree ("tool_class","lease_until","id") WHERE state = 'running';--> statement-breakpoint
CREATE INDEX "stages_running_key_idx" ON "ratchet"."stages" USING btree ("concurrency_key") WHERE state = 'running' and concurrency_key is not null;--> statement-breakpoint
CREATE INDEX "workers_last_seen_idx" ON "ratchet"."workers" USING btree ("last_seen_at");