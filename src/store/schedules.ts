import type { Db, Queryable } from './db.js';
import { toJsonText } from './json.js';
import {
  DB_NOW_SQL,
  DELETE_SCHEDULE_SQL,
  FINISH_FIRING_SQL,
  GET_SCHEDULE_SQL,
  LEASE_DUE_SCHEDULES_SQL,
  LIST_SCHEDULES_SQL,
  LIST_TICKS_SQL,
  LOCK_SCHEDULE_SQL,
  RECORD_FAILED_TICK_SQL,
  RECORD_TICK_SQL,
  RETIRE_CODE_SCHEDULES_SQL,
  RUN_ACTIVE_SQL,
  UPSERT_SCHEDULE_SQL,
} from './schedules.sql.js';

/** A failed submit as a schedule and its tick keep it. */
export interface ScheduleError {
  code: string;
  message: string;
}

/** A schedule's row as it leaves the database. */
export interface ScheduleRow {
  name: string;
  cron: string;
  timezone: string;
  workflow: string;
  input: unknown;
  overlap: 'skip' | 'allow';
  catchUp: number;
  source: 'code' | 'api';
  /** The priority of the runs it starts (null: the workflow's default). */
  priority: number | null;
  lastTickAt: Date;
  nextTickAt: Date | null;
  lastRunId: string | null;
  /** Set when the code that defined it no longer does: it fires nothing. */
  retiredAt: Date | null;
  /** Failed submits in a row. */
  failures: number;
  lastError: ScheduleError | null;
  /** After a failure, no tick is tried before this. */
  backoffUntil: Date | null;
  createdAt: Date;
  updatedAt: Date;
}

/** A schedule leased for one firing pass. */
export interface LeasedSchedule {
  name: string;
  cron: string;
  timezone: string;
  workflow: string;
  input: unknown;
  overlap: 'skip' | 'allow';
  catchUp: number;
  priority: number | null;
  lastTickAt: Date;
  lastRunId: string | null;
  failures: number;
  now: Date;
}

export interface ScheduleWrite {
  name: string;
  cron: string;
  timezone: string;
  workflow: string;
  input: unknown;
  overlap: 'skip' | 'allow';
  catchUp: number;
  source: 'code' | 'api';
  priority: number | null;
  /** source 'code': the definition's hash (an unchanged one is not written again). */
  definitionHash: string | null;
}

export interface TickRow {
  tickAt: Date;
  outcome: 'started' | 'skipped' | 'failed';
  runId: string | null;
  /** 'failed': why; 'started' after failures: the last failure's. */
  error: ScheduleError | null;
  createdAt: Date;
}

const toRow = (r: Record<string, unknown>): ScheduleRow => ({
  name: r.name as string,
  cron: r.cron as string,
  timezone: r.timezone as string,
  workflow: r.workflow as string,
  input: r.input,
  overlap: r.overlap as ScheduleRow['overlap'],
  catchUp: r.catch_up as number,
  source: r.source as ScheduleRow['source'],
  priority: (r.priority as number | null) ?? null,
  lastTickAt: r.last_tick_at as Date,
  nextTickAt: (r.next_tick_at as Date | null) ?? null,
  lastRunId: (r.last_run_id as string | null) ?? null,
  retiredAt: (r.retired_at as Date | null) ?? null,
  failures: (r.failures as number | null) ?? 0,
  lastError: (r.last_error as ScheduleError | null) ?? null,
  backoffUntil: (r.backoff_until as Date | null) ?? null,
  createdAt: r.created_at as Date,
  updatedAt: r.updated_at as Date,
});

/** What an upsert did: 'kept' when the code sync left the row alone (an API schedule, or the same definition). */
export type UpsertOutcome = 'created' | 'replaced' | 'kept';

/**
 * Creates or replaces a schedule. A new one counts its ticks from the database's now (nothing
 * before its creation fires); a replaced one keeps its tick history, but a changed cron or time
 * zone, or a retired schedule brought back, counts from max(last decided tick, now): the new
 * expression (or the returning schedule) never fires a tick of the past. `nextAfter` computes the first tick after a time (cron arithmetic stays out of the store).
 * The code sync (source 'code') never touches an API schedule, nor a code one whose definition
 * hash is unchanged (and not retired).
 */
export async function upsertSchedule(db: Db, s: ScheduleWrite, nextAfter: (after: Date) => Date | null): Promise<UpsertOutcome> {
  const inputText = toJsonText(s.input, 'schedule.input');
  return db.transaction(async (tx) => {
    const [{ now }] = (await tx.query(DB_NOW_SQL)) as [{ now: Date }];
    const [existing] = await tx.query(LOCK_SCHEDULE_SQL, [s.name]);
    if (existing && s.source === 'code') {
      if (existing.source !== 'code') return 'kept';
      if (existing.definition_hash === s.definitionHash && existing.retired_at === null) return 'kept';
    }
    let last = (existing?.last_tick_at as Date | undefined) ?? now;
    // A changed cron or zone, or a retired schedule brought back: count from max(last decided tick, now), so no tick of
    // the past (the time it was retired included) fires.
    const fresh = existing && (existing.cron !== s.cron || existing.timezone !== s.timezone || existing.retired_at !== null);
    if (fresh && now > last) last = now;
    const [r] = await tx.query(UPSERT_SCHEDULE_SQL, [
      s.name,
      s.cron,
      s.timezone,
      s.workflow,
      inputText,
      s.overlap,
      s.catchUp,
      s.source,
      last,
      nextAfter(last),
      s.priority,
      s.definitionHash,
    ]);
    return r?.created === true ? 'created' : 'replaced';
  });
}

/** Retires the code schedules of `workflows` whose names are not in `defined`; returns their names. */
export async function retireCodeSchedules(q: Queryable, workflows: string[], defined: string[]): Promise<string[]> {
  return (await q.query(RETIRE_CODE_SCHEDULES_SQL, [workflows, defined])).map((r) => r.name as string);
}

export async function listSchedules(q: Queryable): Promise<ScheduleRow[]> {
  return (await q.query(LIST_SCHEDULES_SQL)).map(toRow);
}

export async function getSchedule(q: Queryable, name: string): Promise<ScheduleRow | null> {
  const [r] = await q.query(GET_SCHEDULE_SQL, [name]);
  return r ? toRow(r) : null;
}

/**
 * True when a schedule of that name was there. Its tick rows go with it: a schedule created again
 * under the name starts with no history, not a stranger's (the runs it started stay, their
 * idempotency keys `schedule:<name>:<tick>` say which tick). The retention pass sweeps any left.
 */
export async function deleteSchedule(q: Queryable, name: string): Promise<boolean> {
  return (await q.query(DELETE_SCHEDULE_SQL, [name])).length > 0;
}

export async function listTicks(q: Queryable, name: string, limit: number): Promise<TickRow[]> {
  return (await q.query(LIST_TICKS_SQL, [name, limit])).map((r) => ({
    tickAt: r.tick_at as Date,
    outcome: r.outcome as TickRow['outcome'],
    runId: (r.run_id as string | null) ?? null,
    error: (r.error as ScheduleError | null) ?? null,
    createdAt: r.created_at as Date,
  }));
}

export async function leaseDueSchedules(
  q: Queryable,
  owner: string,
  workflows: string[],
  limit: number,
  leaseMs: number,
): Promise<LeasedSchedule[]> {
  const rows = await q.query(LEASE_DUE_SCHEDULES_SQL, [owner, workflows, limit, leaseMs]);
  return rows.map((r) => ({
    name: r.name as string,
    cron: r.cron as string,
    timezone: r.timezone as string,
    workflow: r.workflow as string,
    input: r.input,
    overlap: r.overlap as LeasedSchedule['overlap'],
    catchUp: r.catch_up as number,
    priority: (r.priority as number | null) ?? null,
    lastTickAt: r.last_tick_at as Date,
    lastRunId: (r.last_run_id as string | null) ?? null,
    failures: (r.failures as number | null) ?? 0,
    now: r.now as Date,
  }));
}

export async function runIsActive(q: Queryable, runId: string): Promise<boolean> {
  const [r] = await q.query(RUN_ACTIVE_SQL, [runId]);
  return r?.active === true;
}

/** False when the lease was lost (another worker took over) or the tick was already decided. */
export async function recordTick(
  q: Queryable,
  name: string,
  owner: string,
  tick: Date,
  outcome: 'started' | 'skipped',
  runId: string | null,
): Promise<boolean> {
  return (await q.query(RECORD_TICK_SQL, [name, owner, tick, outcome, runId])).length > 0;
}

/** A tick whose submit failed (not decided); false when the lease was lost. */
export async function recordFailedTick(q: Queryable, name: string, owner: string, tick: Date, error: ScheduleError): Promise<boolean> {
  return (await q.query(RECORD_FAILED_TICK_SQL, [name, owner, tick, JSON.stringify(error)])).length > 0;
}

export interface FiringEnd {
  /** The latest decided tick (null: none). */
  latest: Date | null;
  /** The next tick, computed with `cron` and `timezone` (null: never). */
  next: Date | null;
  /** The expression `next` was computed with: a replace that changed it meanwhile wins. */
  cron: string;
  timezone: string;
  /** Set when a submit failed: counted, kept, and the schedule backs off. */
  error?: ScheduleError;
  backoffMs: { first: number; max: number };
}

/** Ends a firing pass and frees the lease; false when the lease was lost. */
export async function finishFiring(q: Queryable, name: string, owner: string, end: FiringEnd): Promise<boolean> {
  const params = [
    name,
    owner,
    end.latest,
    end.next,
    end.cron,
    end.timezone,
    end.error ? JSON.stringify(end.error) : null,
    end.backoffMs.first,
    end.backoffMs.max,
  ];
  return (await q.query(FINISH_FIRING_SQL, params)).length > 0;
}
