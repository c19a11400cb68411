import { InvalidDefinitionError, type InvalidInputError } from '../errors.js';
import { isWorkflow } from '../definitions/guards.js';
import type { Workflow } from '../definitions/types.js';
import { definitionPath, parseDefinition } from '../definitions/validate.js';
import { toJsonText } from '../store/json.js';
import { scheduleSpecSchema, type CatchUp, type Overlap, type ScheduleSpec } from './spec.js';
import { cronProblem } from './ticks.js';

export interface ScheduleOptions<I = unknown> {
  /** Unique per database: one row, one tick history (a letter then letters, digits, "_" or "-"). */
  name: string;
  /** Cron expression: 5 fields, or 6 with seconds first (cron-parser syntax, e.g. "30 2 * * *"). */
  cron: string;
  /** IANA time zone the cron is read in (default "UTC"). */
  timezone?: string;
  /** The workflow each tick starts: the object defineWorkflow made, or its name. */
  workflow: Workflow<I> | string;
  /** The input of every run it starts (checked against the workflow's schema). */
  input?: I;
  /** 'skip' (default): a tick starts nothing while the previous run of this schedule is queued or running. 'allow': it starts anyway. */
  overlap?: Overlap;
  /** After an outage: 'none' (default) fires only the latest due tick; N also fires the last N missed ones. */
  catchUp?: CatchUp;
  /** The priority of the runs it starts (higher claimed first within a tool class); default: the workflow's. */
  priority?: number;
}

const SCHEDULE_BRAND = Symbol.for('ratchet.definitions.schedule');

/** A schedule as defineSchedule makes it: the spec plus the workflow object when one was given. */
export interface Schedule extends ScheduleSpec {
  readonly kind: 'schedule';
  readonly workflowDefinition: Workflow | null;
  /** The file the loader found it in. */
  readonly sourceFile?: string;
}

export function isSchedule(value: unknown): value is Schedule {
  return typeof value === 'object' && value !== null && (value as Record<symbol, unknown>)[SCHEDULE_BRAND] === true;
}

/** Refuses a cron expression or time zone cron-parser cannot use, and an input the workflow's schema refuses. */
export function checkSchedule(
  spec: ScheduleSpec,
  workflow: Workflow | null,
  where: string,
  ErrorType: typeof InvalidDefinitionError | typeof InvalidInputError = InvalidDefinitionError,
): void {
  const problem = cronProblem(spec);
  if (problem) throw new ErrorType(problem.message, `${where}.${problem.path}`, { reason: `invalid_${problem.path}` });
  if (!workflow) return;
  toJsonText(spec.input ?? {}, `${where}.input`);
  const parsed = workflow.input.safeParse(spec.input ?? {});
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    throw new ErrorType(
      `the schedule's input does not fit workflow "${workflow.name}": ${issue.message}`,
      [`${where}.input`, ...issue.path.map(String)].join('.'),
      { reason: 'invalid_schedule_input' },
    );
  }
}

/** A copy that names the file it was found in (the loader's). */
export function withSourceFile(schedule: Schedule, sourceFile: string): Schedule {
  const copy = { ...schedule, sourceFile };
  Object.defineProperty(copy, SCHEDULE_BRAND, { value: true });
  return Object.freeze(copy);
}

/**
 * A cron schedule that starts `workflow` with `input` on each tick, by the database clock,
 * exactly once across every worker (see src/schedules/fire.ts). Export it from a workflow file
 * (the loader picks it up) or pass it to createRatchet({ schedules }). Bad cron, unknown time
 * zone or an input the workflow refuses: InvalidDefinitionError at once.
 */
export function defineSchedule<I>(options: ScheduleOptions<I>): Schedule {
  const where = definitionPath('schedule', (options as { name?: unknown } | null)?.name);
  const given = options as ScheduleOptions<I> | null;
  const workflow = given && isWorkflow(given.workflow) ? (given.workflow as Workflow) : null;
  const spec = parseDefinition(scheduleSpecSchema, { ...given, workflow: workflow ? workflow.name : given?.workflow }, where);
  checkSchedule(spec, workflow, where);
  const schedule = { ...spec, input: spec.input ?? {}, kind: 'schedule' as const, workflowDefinition: workflow };
  Object.defineProperty(schedule, SCHEDULE_BRAND, { value: true });
  return Object.freeze(schedule);
}
