/** Cron schedules: define, fire exactly once per tick (by the database clock), manage through the API. */
export { defineSchedule, isSchedule, type Schedule, type ScheduleOptions } from './define.js';
export { scheduleSpecSchema, SCHEDULE_NAME, MAX_CATCH_UP, type CatchUp, type Overlap, type ScheduleSpec } from './spec.js';
export { dueTicks, nextTick, cronProblem, type CronSpec, type DueTicks } from './ticks.js';
export { fireDueSchedules, tickRunKey, FIRING_LEASE_MS, type FireCounts, type SubmitRun } from './fire.js';
export {
  createScheduleService,
  checkCodeSchedules,
  syncCodeSchedules,
  toScheduleView,
  type ScheduleService,
  type ScheduleView,
} from './service.js';
