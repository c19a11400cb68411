import { z } from 'zod';
import { InvalidInputError } from '../errors.js';
import { RUN_STATES, type RunState } from '../planner/states.js';
import type { Queryable } from './db.js';
import { isStorableTime, STORABLE_TIME_RANGE } from './limits.js';
import { LIST_RUNS_SQL } from './runs.sql.js';
import { parseInput } from './validate.js';

/** The largest page a list returns. */
export const MAX_LIST_LIMIT = 500;

const noNul = /^[^\u0000]*$/;

export const listRunsFilterSchema = z
  .object({
    states: z
      .array(z.enum(RUN_STATES as [RunState, ...RunState[]]))
      .min(1)
      .max(RUN_STATES.length)
      .optional(),
    workflow: z.string().min(1).max(200).regex(noNul, 'must not contain \\u0000').optional(),
    createdAfter: z.date().refine(isStorableTime, `a date-time ${STORABLE_TIME_RANGE}`).optional(),
    createdBefore: z.date().refine(isStorableTime, `a date-time ${STORABLE_TIME_RANGE}`).optional(),
    /** The `nextCursor` of the previous page. */
    cursor: z.string().min(1).max(200).optional(),
    limit: z.number().int().min(1).max(MAX_LIST_LIMIT).optional(),
  })
  .strict();
export type ListRunsFilter = z.input<typeof listRunsFilterSchema>;

export interface RunSummaryRow {
  id: string;
  workflow: string;
  state: RunState;
  deadline: Date | null;
  error: unknown;
  createdAt: Date;
  updatedAt: Date;
  finishedAt: Date | null;
}
export interface RunPage {
  runs: RunSummaryRow[];
  nextCursor: string | null;
}

const UUID = '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}';

/** A keyset cursor, opaque to callers: base64url of "<a time in UTC to the microsecond, Z>|<id>" (runs, approvals). */
export function encodeCursor(createdAt: string, id: string): string {
  return Buffer.from(`${createdAt}|${id}`, 'utf8').toString('base64url');
}

/** Reads an encodeCursor cursor whose id matches `idPattern` (a run's uuid by default); InvalidInputError otherwise. */
export function decodeCursor(cursor: string, path = 'cursor', idPattern = UUID): { createdAt: string; id: string } {
  const text = Buffer.from(cursor, 'base64url').toString('utf8');
  const m = new RegExp(`^(\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}\\.\\d{6}Z)\\|(${idPattern})$`, 'i').exec(text);
  // The shape is right; the date must be one too (no February 30th, no year 0): PostgreSQL would refuse it.
  const ms = m ? `${m[1]!.slice(0, 23)}Z` : '';
  const at = new Date(ms);
  if (!m || !isStorableTime(at) || at.toISOString() !== ms) {
    throw new InvalidInputError('not a cursor this server gave out (pass nextCursor back as it is)', path);
  }
  return { createdAt: m[1]!, id: m[2]! };
}

/**
 * One page of runs, newest first, with optional filters (states, workflow, created after /
 * before); `nextCursor` continues after the last row (keyset on created_at, id: stable while
 * runs are added).
 */
export async function listRuns(q: Queryable, filter: ListRunsFilter = {}): Promise<RunPage> {
  const f = parseInput(listRunsFilterSchema, filter, 'listRuns');
  const limit = f.limit ?? 50;
  const cursor = f.cursor ? decodeCursor(f.cursor, 'listRuns.cursor') : null;
  const rows = await q.query(LIST_RUNS_SQL, [
    f.states ?? null,
    f.workflow ?? null,
    f.createdAfter ?? null,
    f.createdBefore ?? null,
    cursor?.createdAt ?? null,
    cursor?.id ?? null,
    limit + 1,
  ]);
  const page = rows.slice(0, limit);
  const last = page.at(-1);
  return {
    runs: page.map((r) => ({
      id: r.id as string,
      workflow: r.workflow as string,
      state: r.state as RunState,
      deadline: (r.deadline as Date | null) ?? null,
      error: r.error ?? null,
      createdAt: r.created_at as Date,
      updatedAt: r.updated_at as Date,
      finishedAt: (r.finished_at as Date | null) ?? null,
    })),
    nextCursor: rows.length > limit && last ? encodeCursor(last.cursor_ts as string, last.id as string) : null,
  };
}
