import type { Logger } from 'pino';
import type { Db } from '../store/db.js';
import { IdempotencyConflictError } from '../store/runs.js';
import {
  finishFiring,
  leaseDueSchedules,
  recordFailedTick,
  recordTick,
  runIsActive,
  type LeasedSchedule,
  type ScheduleError,
} from '../store/schedules.js';
import { dueTicks, nextTick } from './ticks.js';

/** Schedules decided per pass at most (the rest wait for the next sweeper tick). */
export const SCHEDULES_PER_PASS = 50;
/** How long one worker holds a schedule while it decides its ticks; a worker that dies mid-pass is taken over after it. */
export const FIRING_LEASE_MS = 60_000;
/** After a failed submit the schedule waits this long before the tick is tried again, doubled per failure in a row, up to the max. */
export const FAILURE_BACKOFF_MS = { first: 5_000, max: 10 * 60_000 };

/** Starts a run (the engine's submit: validates, plans, persists, wakes a worker); idempotent by key. */
export type SubmitRun = (
  workflow: string,
  input: unknown,
  opts: { idempotencyKey: string; priority?: number },
) => Promise<{ id: string; created: boolean }>;

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
  /** Ticks whose submit failed (tried again after a back-off). */
  failed: number;
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
  const counts: FireCounts = { started: 0, skipped: 0, missed: 0, failed: 0 };
  const workflows = deps.workflows();
  if (workflows.length === 0) return counts;
  const leased = await leaseDueSchedules(deps.db, deps.owner, workflows, SCHEDULES_PER_PASS, FIRING_LEASE_MS);
  for (const s of leased) {
    try {
      const c = await fireOne(deps, s);
      counts.started += c.started;
      counts.skipped += c.skipped;
      counts.missed += c.missed;
      counts.failed += c.failed;
    } catch (err) {
      // The lease lapses by itself; the next pass (here or on another worker) decides the tick again, with the same run key.
      deps.logger.warn({ event: 'schedule_fire_failed', schedule: s.name, err: (err as Error).message }, 'firing a schedule failed');
    }
  }
  return counts;
}

const errorOf = (err: unknown): ScheduleError => {
  const e = err as { code?: unknown; message?: unknown } | null;
  const code = typeof e?.code === 'string' ? e.code : 'submit_failed';
  return { code, message: (typeof e?.message === 'string' ? e.message : String(err)).slice(0, 2000) };
};

/**
 * A tick could not be recorded: the lease was lost (the new holder decides; the finish below is a
 * no-op) or a replace moved the schedule on (a new cron or zone counts from the replace): the pass
 * stops and frees the lease at once, its next tick computed again by the next pass if the cron changed.
 */
async function stop(deps: FireDeps, s: LeasedSchedule, decided: Date | null, counts: FireCounts): Promise<FireCounts> {
  const spec = { cron: s.cron, timezone: s.timezone };
  await finishFiring(deps.db, s.name, deps.owner, {
    ...spec,
    latest: decided,
    next: nextTick(spec, decided ?? s.lastTickAt),
    backoffMs: FAILURE_BACKOFF_MS,
  });
  return counts;
}

async function fireOne(deps: FireDeps, s: LeasedSchedule): Promise<FireCounts> {
  const counts: FireCounts = { started: 0, skipped: 0, missed: 0, failed: 0 };
  const spec = { cron: s.cron, timezone: s.timezone };
  const due = dueTicks(spec, s.lastTickAt, s.now, s.catchUp);
  counts.missed = due.missed;
  const end = { cron: s.cron, timezone: s.timezone, backoffMs: FAILURE_BACKOFF_MS };
  let lastRun = s.lastRunId;
  let decided: Date | null = null;
  for (const tick of due.fire) {
    if (s.overlap === 'skip' && lastRun !== null && (await runIsActive(deps.db, lastRun))) {
      if (!(await recordTick(deps.db, s.name, deps.owner, tick, 'skipped', null))) return stop(deps, s, decided, counts);
      decided = tick;
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
      const run = await deps.submit(s.workflow, s.input, { idempotencyKey: key, ...(s.priority !== null ? { priority: s.priority } : {}) });
      runId = run.id;
    } catch (err) {
      if (err instanceof IdempotencyConflictError) {
        // The schedule's input changed since another worker started this tick's run: that run is the tick's.
        runId = err.runId;
      } else {
        // Not decided: the tick stays due, recorded as 'failed' with the error, and the schedule backs off (longer each time).
        const error = errorOf(err);
        counts.failed++;
        deps.logger.warn(
          { event: 'schedule_tick_failed', schedule: s.name, tick, failures: s.failures + 1, err: error },
          'a schedule could not start its run; it backs off and tries the tick again',
        );
        // Refused (the lease was lost, or a concurrent replace moved last_tick_at past the tick): end the pass as the
        // recordTick path does, so the firing lease is freed now rather than left to lapse.
        if (!(await recordFailedTick(deps.db, s.name, deps.owner, tick, error))) return stop(deps, s, decided, counts);
        await finishFiring(deps.db, s.name, deps.owner, { ...end, latest: decided, next: tick, error });
        return counts;
      }
    }
    if (!(await recordTick(deps.db, s.name, deps.owner, tick, 'started', runId))) return stop(deps, s, decided, counts);
    decided = tick;
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
  const latest = due.latest ?? s.lastTickAt;
  await finishFiring(deps.db, s.name, deps.owner, {
    ...end,
    latest: due.latest,
    next: nextTick(spec, latest > s.lastTickAt ? latest : s.lastTickAt),
  });
  return counts;
}
