import type { Logger } from 'pino';
import type { Db } from '../store/db.js';
import { IdempotencyConflictError } from '../store/runs.js';
import { finishFiring, leaseDueSchedules, recordTick, runIsActive, type LeasedSchedule } from '../store/schedules.js';
import { dueTicks, nextTick } from './ticks.js';

/** Schedules decided per pass at most (the rest wait for the next sweeper tick). */
export const SCHEDULES_PER_PASS = 50;
/** How long one worker holds a schedule while it decides its ticks; a worker that dies mid-pass is taken over after it. */
export const FIRING_LEASE_MS = 60_000;

/** Starts a run (the engine's submit: validates, plans, persists, wakes a worker); idempotent by key. */
export type SubmitRun = (workflow: string, input: unknown, opts: { idempotencyKey: string }) => Promise<{ id: string; created: boolean }>;

export interface FireDeps {
  db: Db;
  owner: string;
  /** The workflows this process can start (loaded): schedules of others are left to workers that have them. */
  workflows: () => string[];
  submit: SubmitRun;
  logger: Logger;
}

export interface FireCounts {
  started: number;
  skipped: number;
  missed: number;
}

/** The run idempotency key of one tick: the same on every worker, so one tick is one run. */
export const tickRunKey = (schedule: string, tick: Date) => `schedule:${schedule}:${tick.toISOString()}`;

/**
 * One firing pass, called from each worker's sweeper (src/worker/sweeper.ts). Exactly once per
 * tick across any number of workers, by three locks that each suffice for a different failure:
 * - a short firing lease per schedule (LEASE_DUE_SCHEDULES_SQL): one worker decides a
 *   schedule's ticks at a time, so the overlap check and the tick record do not race;
 * - the run's idempotency key derived from (schedule, tick): a worker that took over a lapsed
 *   lease and submits a tick again gets the run the first one made, never a second;
 * - the (schedule, tick) primary key of schedule_ticks and `last_tick_at < tick`: a tick is
 *   recorded once, and only by the lease holder.
 * Time is the database's (the lease statement returns ratchet.db_now()).
 */
export async function fireDueSchedules(deps: FireDeps): Promise<FireCounts> {
  const counts: FireCounts = { started: 0, skipped: 0, missed: 0 };
  const workflows = deps.workflows();
  if (workflows.length === 0) return counts;
  const leased = await leaseDueSchedules(deps.db, deps.owner, workflows, SCHEDULES_PER_PASS, FIRING_LEASE_MS);
  for (const s of leased) {
    try {
      const c = await fireOne(deps, s);
      counts.started += c.started;
      counts.skipped += c.skipped;
      counts.missed += c.missed;
    } catch (err) {
      // The lease lapses by itself; the next pass (here or on another worker) decides the tick again, with the same run key.
      deps.logger.warn({ event: 'schedule_fire_failed', schedule: s.name, err: (err as Error).message }, 'firing a schedule failed');
    }
  }
  return counts;
}

async function fireOne(deps: FireDeps, s: LeasedSchedule): Promise<FireCounts> {
  const counts: FireCounts = { started: 0, skipped: 0, missed: 0 };
  const spec = { cron: s.cron, timezone: s.timezone };
  const due = dueTicks(spec, s.lastTickAt, s.now, s.catchUp);
  counts.missed = due.missed;
  let lastRun = s.lastRunId;
  for (const tick of due.fire) {
    if (s.overlap === 'skip' && lastRun !== null && (await runIsActive(deps.db, lastRun))) {
      if (!(await recordTick(deps.db, s.name, deps.owner, tick, 'skipped', null))) return counts; // lease lost: stop
      counts.skipped++;
      deps.logger.info(
        { event: 'schedule_tick_skipped', schedule: s.name, tick, runId: lastRun },
        'tick skipped: the previous run is still going',
      );
      continue;
    }
    const key = tickRunKey(s.name, tick);
    let runId: string;
    try {
      const run = await deps.submit(s.workflow, s.input, { idempotencyKey: key });
      runId = run.id;
    } catch (err) {
      // The schedule's input changed since another worker started this tick's run: that run is the tick's.
      if (!(err instanceof IdempotencyConflictError)) throw err;
      runId = err.runId;
    }
    if (!(await recordTick(deps.db, s.name, deps.owner, tick, 'started', runId))) return counts;
    lastRun = runId;
    counts.started++;
    deps.logger.info({ event: 'schedule_tick_started', schedule: s.name, tick, runId }, 'schedule started a run');
  }
  if (due.missed > 0) {
    deps.logger.warn(
      { event: 'schedule_ticks_missed', schedule: s.name, missed: due.missed, catchUp: s.catchUp },
      'missed ticks dropped (catchUp)',
    );
  }
  const decided = due.latest ?? s.lastTickAt;
  await finishFiring(deps.db, s.name, deps.owner, due.latest, nextTick(spec, decided > s.lastTickAt ? decided : s.lastTickAt));
  return counts;
}
