import { z } from 'zod';
import type { Queryable } from './db.js';
import { EVENT_TYPES } from './event-types.js';
import { APPEND_EVENTS_SQL, EFFECT_STARTED_SQL, RUN_STAGES_SQL, STAGE_RESULTS_SQL } from './events.sql.js';
import { toJsonText } from './json.js';
import { parseInput } from './validate.js';

const eventRow = z
  .object({
    runId: z.uuid(),
    stageId: z
      .string()
      .regex(/^\d{1,19}$/)
      .optional(),
    type: z.enum(EVENT_TYPES),
    fence: z
      .string()
      .regex(/^\d{1,19}$/)
      .optional(),
    attempt: z.number().int().min(0).optional(),
    at: z.date().optional(),
    data: z.record(z.string(), z.unknown()).optional(),
  })
  .strict();
export type NewEvent = z.input<typeof eventRow>;

/** Appends events in one statement; validates every row first (nothing written on bad input). */
export async function appendEvents(q: Queryable, events: NewEvent[]): Promise<void> {
  if (events.length === 0) return;
  const rows = events.map((e, i) => parseInput(eventRow, e, `appendEvents[${i}]`));
  await q.query(
    APPEND_EVENTS_SQL,
    [
      toJsonText(
        rows.map((r) => ({ ...r, at: r.at?.toISOString() })),
        'appendEvents',
      ),
    ],
    'ratchet_append_events',
  );
}

export async function effectStarted(q: Queryable, runId: string, stageId: string, beforeFence: string): Promise<boolean> {
  const [r] = await q.query(EFFECT_STARTED_SQL, [runId, stageId, beforeFence], 'ratchet_effect_started');
  return r?.started === true;
}

export async function stageResults(q: Queryable, runId: string): Promise<Record<string, unknown>> {
  const rows = await q.query(STAGE_RESULTS_SQL, [runId], 'ratchet_stage_results');
  return Object.fromEntries(rows.map((r) => [r.name as string, r.result]));
}

export interface RunStageRow {
  seq: number;
  name: string;
  tool: string;
  state: string;
  result: unknown;
  /** A failed tool call's error (an agent tells it to the model); absent where the history read does not carry it. */
  error?: unknown;
}

export async function runStages(q: Queryable, runId: string): Promise<RunStageRow[]> {
  const rows = await q.query(RUN_STAGES_SQL, [runId], 'ratchet_run_stages');
  return rows.map((r) => ({
    seq: r.seq as number,
    name: r.name as string,
    tool: r.tool as string,
    state: r.state as string,
    result: r.result ?? null,
  }));
}
