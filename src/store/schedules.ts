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
  RECORD_TICK_SQL,
  RUN_ACTIVE_SQL,
  UPSERT_SCHEDULE_SQL,
} from './schedules.sql.js';

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
  lastTickAt: Date;
  nextTickAt: Date | null;
  lastRunId: string | null;
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
  lastTickAt: Date;
  lastRunId: string | null;
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
}

export interface TickRow {
  tickAt: Date;
  outcome: 'started' | 'skipped';
  runId: string | null;
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
  lastTickAt: r.last_tick_at as Date,
  nextTickAt: (r.next_tick_at as Date | null) ?? null,
  lastRunId: (r.last_run_id as string | null) ?? null,
  createdAt: r.created_at as Date,
  updatedAt: r.updated_at as Date,
});

/**
 * Creates or replaces a schedule. A new one counts its ticks from the database's now (nothing
 * before its creation fires); a replaced one keeps its tick history. `nextAfter` computes the
 * first tick after a time (cron arithmetic stays out of the store).
 */
export async function upsertSchedule(db: Db, s: ScheduleWrite, nextAfter: (after: Date) => Date | null): Promise<{ created: boolean }> {
  const inputText = toJsonText(s.input, 'schedule.input');
  return db.transaction(async (tx) => {
    const [{ now }] = (await tx.query(DB_NOW_SQL)) as [{ now: Date }];
    const [existing] = await tx.query(LOCK_SCHEDULE_SQL, [s.name]);
    const last = (existing?.last_tick_at as Date | undefined) ?? now;
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
    ]);
    return { created: r?.created === true };
  });
}

export async function listSchedules(q: Queryable): Promise<ScheduleRow[]> {
  return (await q.query(LIST_SCHEDULES_SQL)).map(toRow);
}

export async function getSchedule(q: Queryable, name: string): Promise<ScheduleRow | null> {
  const [r] = await q.query(GET_SCHEDULE_SQL, [name]);
  return r ? toRow(r) : null;
}

/** True when a schedule of that name was there. Its tick rows stay (the history of runs it started). */
export async function deleteSchedule(q: Queryable, name: string): Promise<boolean> {
  return (await q.query(DELETE_SCHEDULE_SQL, [name])).length > 0;
}

export async function listTicks(q: Queryable, name: string, limit: number): Promise<TickRow[]> {
  return (await q.query(LIST_TICKS_SQL, [name, limit])).map((r) => ({
    tickAt: r.tick_at as Date,
    outcome: r.outcome as TickRow['outcome'],
    runId: (r.run_id as string | null) ?? null,
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
    lastTickAt: r.last_tick_at as Date,
    lastRunId: (r.last_run_id as string | null) ?? null,
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

export async function finishFiring(q: Queryable, name: string, owner: string, latest: Date | null, next: Date | null): Promise<boolean> {
  return (await q.query(FINISH_FIRING_SQL, [name, owner, latest, next])).length > 0;
}
