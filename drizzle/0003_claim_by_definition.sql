-- A stage carries its run's definition hash, so a worker claims only stages of definitions it
-- has loaded, in index order (claim.sql.ts). Existing stages take their run's hash first.
DROP INDEX "ratchet"."stages_queued_claim_idx";--> statement-breakpoint
DROP INDEX "ratchet"."stages_running_lease_idx";--> statement-breakpoint
ALTER TABLE "ratchet"."stages" ADD COLUMN "definition_hash" text;--> statement-breakpoint
UPDATE "ratchet"."stages" s SET "definition_hash" = r."definition_hash" FROM "ratchet"."runs" r WHERE r."id" = s."run_id";--> statement-breakpoint
ALTER TABLE "ratchet"."stages" ALTER COLUMN "definition_hash" SET NOT NULL;--> statement-breakpoint
ALTER TABLE "ratchet"."workers" ADD COLUMN "definitions" text[] DEFAULT '{}'::text[] NOT NULL;--> statement-breakpoint
CREATE INDEX "stages_queued_key_idx" ON "ratchet"."stages" USING btree ("tool_class","concurrency_key","definition_hash","available_at","id") WHERE state = 'queued' and concurrency_key is not null;--> statement-breakpoint
CREATE INDEX "stages_queued_claim_idx" ON "ratchet"."stages" USING btree ("tool_class","definition_hash","available_at","id") WHERE state = 'queued' and concurrency_key is null;--> statement-breakpoint
CREATE INDEX "stages_running_lease_idx" ON "ratchet"."stages" USING btree ("tool_class","definition_hash","lease_until","id") WHERE state = 'running';
