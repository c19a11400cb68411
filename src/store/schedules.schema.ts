import { sql } from 'drizzle-orm';
import { check, index, integer, jsonb, primaryKey, text, timestamp, uuid } from 'drizzle-orm/pg-core';
import { ratchet } from './schema.js';

/**
 * Schedules (src/schedules/): kept apart from ./schema.ts so the two files change independently;
 * drizzle.config.ts lists both. Times are the database clock's (ratchet.db_now()).
 */
const ts = (name: string) => timestamp(name, { withTimezone: true, mode: 'date' });

export const schedules = ratchet.table(
  'schedules',
  {
    name: text('name').primaryKey(),
    cron: text('cron').notNull(),
    /** An IANA time zone the cron expression is read in. */
    timezone: text('timezone').notNull(),
    workflow: text('workflow').notNull(),
    input: jsonb('input').notNull(),
    /** 'skip': a tick starts nothing while the schedule's previous run is queued or running; 'allow': it starts anyway. */
    overlap: text('overlap').notNull(),
    /** How many missed ticks (before the latest due one) fire after an outage: 0 = none. */
    catchUp: integer('catch_up').notNull(),
    /** 'code' (defineSchedule in a workflow file, written at start-up) or 'api' (POST /v1/schedules). */
    source: text('source').notNull(),
    /** Every tick up to here is decided (fired, skipped or missed); ticks after it are due when their time passes. */
    lastTickAt: ts('last_tick_at').notNull(),
    /** The first tick after last_tick_at (computed by the application from cron and time zone); null: it never fires again. */
    nextTickAt: ts('next_tick_at'),
    lastRunId: uuid('last_run_id'),
    /**
     * A short lease on deciding this schedule's ticks: one worker at a time, taken over when it lapses.
     * With no owner, firing_until is a back-off: after a failed submit no worker fires the schedule before it.
     */
    firingOwner: text('firing_owner'),
    firingUntil: ts('firing_until'),
    /** The priority of the runs it starts; null: the workflow's default. */
    priority: integer('priority'),
    /** source 'code': a hash of the definition last written by the code sync (unchanged definition, no write). */
    definitionHash: text('definition_hash'),
    /** source 'code': when a sync found its definition gone from the workflow files; a retired schedule fires nothing. */
    retiredAt: ts('retired_at'),
    /** Failed submits in a row (reset by a started or skipped tick, or by a replace); each one backs off longer. */
    failures: integer('failures').notNull().default(0),
    /** The last failed submit's error ({ code, message }), until a tick starts a run. */
    lastError: jsonb('last_error'),
    createdAt: ts('created_at').notNull().default(sql`now()`),
    updatedAt: ts('updated_at').notNull().default(sql`now()`),
  },
  (t) => [
    // The sweeper's question, "which schedules have a tick due?", read in index order.
    index('schedules_next_tick_idx').on(t.nextTickAt),
    check('schedules_overlap_ck', sql`${t.overlap} in ('skip','allow')`),
    check('schedules_catch_up_ck', sql`${t.catchUp} >= 0`),
    check('schedules_source_ck', sql`${t.source} in ('code','api')`),
  ],
);

/** One row per decided tick that started a run or was skipped: the unique key (schedule, tick) says each tick is decided once. */
export const scheduleTicks = ratchet.table(
  'schedule_ticks',
  {
    schedule: text('schedule').notNull(),
    tickAt: ts('tick_at').notNull(),
    /**
     * 'started' (run_id set), 'skipped' (overlap: the previous run was still going) or 'failed' (the
     * submit failed; the tick is not decided and is tried again after a back-off, and becomes 'started').
     */
    outcome: text('outcome').notNull(),
    runId: uuid('run_id'),
    /** The last failed submit's error for this tick ({ code, message }); kept when the tick later starts. */
    error: jsonb('error'),
    createdAt: ts('created_at').notNull().default(sql`now()`),
  },
  (t) => [
    primaryKey({ columns: [t.schedule, t.tickAt] }),
    check('schedule_ticks_outcome_ck', sql`${t.outcome} in ('started','skipped','failed')`),
  ],
);
