import type { Registry } from '../definitions/registry.js';
import { InvalidDefinitionError, InvalidInputError } from '../errors.js';
import type { Db } from '../store/db.js';
import { parseInput } from '../store/validate.js';
import {
  deleteSchedule,
  getSchedule,
  listSchedules,
  listTicks,
  upsertSchedule,
  type ScheduleRow,
  type TickRow,
} from '../store/schedules.js';
import { checkSchedule, type Schedule } from './define.js';
import { catchUpToCount, countToCatchUp, scheduleSpecSchema, type CatchUp, type ScheduleSpec } from './spec.js';
import { nextTick } from './ticks.js';

/** A schedule as the API, the client and the CLI show it. */
export interface ScheduleView {
  name: string;
  cron: string;
  timezone: string;
  workflow: string;
  input: unknown;
  overlap: 'skip' | 'allow';
  catchUp: CatchUp;
  source: 'code' | 'api';
  /** Every tick up to here is decided (started, skipped, or missed). */
  lastTickAt: Date;
  /** The next tick that will fire (null: the expression has none left). */
  nextTickAt: Date | null;
  lastRunId: string | null;
  createdAt: Date;
  updatedAt: Date;
}

export const toScheduleView = (r: ScheduleRow): ScheduleView => ({ ...r, catchUp: countToCatchUp(r.catchUp) });

export interface ScheduleService {
  /** Creates or replaces a schedule (source 'api'): bad cron, time zone, workflow or input is InvalidInputError with nothing written. */
  put(spec: unknown): Promise<{ schedule: ScheduleView; created: boolean }>;
  list(): Promise<ScheduleView[]>;
  get(name: string): Promise<ScheduleView | null>;
  /** True when it was there. A schedule defined in code comes back when a process that defines it starts. */
  delete(name: string): Promise<boolean>;
  /** Its latest decided ticks, newest first. */
  ticks(name: string, limit?: number): Promise<TickRow[]>;
}

async function write(db: Db, spec: ScheduleSpec, source: 'code' | 'api'): Promise<{ created: boolean }> {
  return upsertSchedule(db, { ...spec, input: spec.input ?? {}, catchUp: catchUpToCount(spec.catchUp), source }, (after) =>
    nextTick(spec, after),
  );
}

/**
 * Schedules of workflow files must name a loaded workflow and give it an input it accepts;
 * checked when the engine starts, before anything is written.
 */
export function checkCodeSchedules(schedules: readonly Schedule[], registry: Registry): void {
  const names = new Map<string, Schedule>();
  for (const s of schedules) {
    const where = `schedule[${s.name}]`;
    const twin = names.get(s.name);
    if (twin && twin !== s) {
      throw new InvalidDefinitionError(
        `schedule name "${s.name}" is declared twice${twin.sourceFile ? ` (${twin.sourceFile}, ${s.sourceFile})` : ''}`,
        where,
      );
    }
    names.set(s.name, s);
    const workflow = registry.get(s.workflow);
    if (!workflow)
      throw new InvalidDefinitionError(`schedule "${s.name}" starts workflow "${s.workflow}", which is not loaded`, `${where}.workflow`);
    checkSchedule(s, workflow, where);
  }
}

/** Writes the schedules defined in code (each process that loads them does; the same definition rewrites the same row). */
export async function syncCodeSchedules(db: Db, schedules: readonly Schedule[]): Promise<void> {
  for (const s of schedules) await write(db, s, 'code');
}

export function createScheduleService(db: Db, registry: Registry): ScheduleService {
  return {
    async put(body) {
      const spec = parseInput(scheduleSpecSchema, body, 'schedule');
      const workflow = registry.require(spec.workflow);
      checkSchedule(spec, workflow, 'schedule', InvalidInputError);
      const { created } = await write(db, spec, 'api');
      const row = await getSchedule(db, spec.name);
      return { schedule: toScheduleView(row!), created };
    },
    list: async () => (await listSchedules(db)).map(toScheduleView),
    async get(name) {
      const row = await getSchedule(db, name);
      return row ? toScheduleView(row) : null;
    },
    delete: (name) => deleteSchedule(db, name),
    ticks: (name, limit = 20) => listTicks(db, name, limit),
  };
}
