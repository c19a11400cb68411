ALTER TABLE "ratchet"."stages" DROP CONSTRAINT "stages_state_ck";--> statement-breakpoint
ALTER TABLE "ratchet"."runs" ADD COLUMN "parent_run_id" uuid;--> statement-breakpoint
ALTER TABLE "ratchet"."runs" ADD COLUMN "parent_stage_id" bigint;--> statement-breakpoint
ALTER TABLE "ratchet"."runs" ADD COLUMN "sinks_left" integer;--> statement-breakpoint
ALTER TABLE "ratchet"."stages" ADD COLUMN "step" text;--> statement-breakpoint
ALTER TABLE "ratchet"."stages" ADD COLUMN "deps" integer[] DEFAULT '{}'::integer[] NOT NULL;--> statement-breakpoint
ALTER TABLE "ratchet"."stages" ADD COLUMN "next_seqs" integer[] DEFAULT '{}'::integer[] NOT NULL;--> statement-breakpoint
ALTER TABLE "ratchet"."stages" ADD COLUMN "deps_left" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "ratchet"."stages" ADD COLUMN "item_index" integer;--> statement-breakpoint
ALTER TABLE "ratchet"."stages" ADD COLUMN "group_seq" integer;--> statement-breakpoint
ALTER TABLE "ratchet"."stages" ADD COLUMN "continue_on_error" boolean DEFAULT false NOT NULL;--> statement-breakpoint
ALTER TABLE "ratchet"."stages" ADD COLUMN "sink" text;--> statement-breakpoint
ALTER TABLE "ratchet"."runs" ADD CONSTRAINT "runs_parent_run_id_runs_id_fk" FOREIGN KEY ("parent_run_id") REFERENCES "ratchet"."runs"("id") ON DELETE set null ON UPDATE no action;--> statement-breakpoint
CREATE UNIQUE INDEX "runs_parent_stage_uq" ON "ratchet"."runs" USING btree ("parent_stage_id") WHERE parent_stage_id is not null;--> statement-breakpoint
CREATE INDEX "runs_parent_idx" ON "ratchet"."runs" USING btree ("parent_run_id") WHERE parent_run_id is not null;--> statement-breakpoint
ALTER TABLE "ratchet"."stages" ADD CONSTRAINT "stages_sink_ck" CHECK ("ratchet"."stages"."sink" is null or "ratchet"."stages"."sink" in ('only','one_of'));--> statement-breakpoint
ALTER TABLE "ratchet"."stages" ADD CONSTRAINT "stages_deps_left_ck" CHECK ("ratchet"."stages"."deps_left" >= 0);--> statement-breakpoint
ALTER TABLE "ratchet"."stages" ADD CONSTRAINT "stages_state_ck" CHECK ("ratchet"."stages"."state" in ('pending','queued','running','succeeded','failed','cancelled','skipped','waiting'));--> statement-breakpoint
-- Hand-added (drizzle cannot express data changes): the backfill. Every run so far is a chain by seq (static or agent):
-- each stage's successor is seq+1 when that stage exists; a stage after the first waits for seq-1 (a pending one still
-- counts it). A static run (no model stage) has one sink, its last stage, and ends through the run's sink counter;
-- agent runs keep sinks_left null (they end explicitly). So every run, old or new, settles through the one join.
UPDATE "ratchet"."stages" s SET "next_seqs" = ARRAY[s.seq + 1]
  WHERE EXISTS (SELECT 1 FROM "ratchet"."stages" n WHERE n.run_id = s.run_id AND n.seq = s.seq + 1);--> statement-breakpoint
UPDATE "ratchet"."stages" s SET "deps" = ARRAY[s.seq - 1], "deps_left" = CASE WHEN s.state = 'pending' THEN 1 ELSE 0 END
  WHERE s.seq > 1;--> statement-breakpoint
UPDATE "ratchet"."runs" r SET "sinks_left" = CASE WHEN r.state = 'succeeded' THEN 0 ELSE 1 END
  WHERE NOT EXISTS (SELECT 1 FROM "ratchet"."stages" m WHERE m.run_id = r.id AND m.tool = '$model');--> statement-breakpoint
UPDATE "ratchet"."stages" s SET "sink" = 'only'
  WHERE s.seq = (SELECT max(x.seq) FROM "ratchet"."stages" x WHERE x.run_id = s.run_id)
    AND NOT EXISTS (SELECT 1 FROM "ratchet"."stages" m WHERE m.run_id = s.run_id AND m.tool = '$model');
