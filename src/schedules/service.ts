import { createHash } from 'node:crypto';
import type { Logger } from 'pino';
import type { Registry } from '../definitions/registry.js';
import { InvalidDefinitionError, InvalidInputError } from '../errors.js';
import type { Db } from '../store/db.js';
import { parseInput } from '../store/validate.js';
import {
  deleteSchedule,
  getSchedule,
  listSchedules,
  listTicks,
  retireCodeSchedules,
  upsertSchedule,
  type ScheduleError,
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
  /** 'code' (a workflow file; the code sync keeps it) or 'api' (POST /v1/schedules; the code sync never touches it). */
  source: 'code' | 'api';
  /** The priority of the runs it starts (null: the workflow's default). */
  priority: number | null;
  /** Every tick up to here is decided (started, skipped, or missed). */
  lastTickAt: Date;
  /** The next tick that will fire (null: the expression has none left). */
  nextTickAt: Date | null;
  lastRunId: string | null;
  /** Set when the workflow files that defined it no longer do: kept, fires nothing (a replace brings it back). */
  retiredAt: Date | null;
  /** Failed submits in a row: the due tick is tried again after backoffUntil. */
  failures: number;
  lastError: ScheduleError | null;
  backoffUntil: Date | null;
  createdAt: Date;
  updatedAt: Date;
}

export const toScheduleView = (r: ScheduleRow): ScheduleView => ({ ...r, catchUp: countToCatchUp(r.catchUp) });

export interface ScheduleService {
  /** Creates or replaces a schedule (source 'api'): bad cron, time zone, workflow or input is InvalidInputError with nothing written. */
  put(spec: unknown): Promise<{ schedule: ScheduleView; created: boolean }>;
  list(): Promise<ScheduleView[]>;
  get(name: string): Promise<ScheduleView | null>;
  /** True when it was there. A schedule defined in code comes back when a process that defines it starts. A schedule put through
   * the API becomes source 'api' even if code defined it: the code sync no longer touches it (delete it to give it back). */
  delete(name: string): Promise<boolean>;
  /** Its latest decided ticks, newest first. */
  ticks(name: string, limit?: number): Promise<TickRow[]>;
}

/** The hash of what a code schedule says: the sync writes a code schedule again only when it changed. */
function definitionHash(spec: ScheduleSpec): string {
  const { name, cron, timezone, workflow, input, overlap, catchUp, priority } = spec;
  const canonical = JSON.stringify([name, cron, timezone, workflow, input ?? {}, overlap, catchUp, priority ?? null], (_k, v) =>
    v && typeof v === 'object' && !Array.isArray(v) ? Object.fromEntries(Object.entries(v).sort(([a], [b]) => (a < b ? -1 : 1))) : v,
  );
  return createHash('sha256').update(canonical).digest('hex').slice(0, 32);
}

async function write(db: Db, spec: ScheduleSpec, source: 'code' | 'api') {
  return upsertSchedule(
    db,
    {
      ...spec,
      input: spec.input ?? {},
      catchUp: catchUpToCount(spec.catchUp),
      source,
      priority: spec.priority ?? null,
      definitionHash: source === 'code' ? definitionHash(spec) : null,
    },
    (after) => nextTick(spec, after),
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

/**
 * Writes the schedules defined in code (each process that loads workflow files does, at start):
 * - a code schedule whose definition changed is replaced (an unchanged one is not written);
 * - a schedule of that name created or replaced through the API is never touched (the API took it over);
 * - a code schedule of a workflow this process loads that its files no longer define is retired
 *   (kept with its history, fires nothing; defining it again brings it back). Code schedules of
 *   workflows this process does not load belong to another deployment and are left alone.
 */
export async function syncCodeSchedules(
  db: Db,
  schedules: readonly Schedule[],
  loadedWorkflows: readonly string[],
  logger?: Logger,
): Promise<{ written: string[]; keptApi: string[]; retired: string[] }> {
  const written: string[] = [];
  const keptApi: string[] = [];
  for (const s of schedules) {
    const outcome = await write(db, s, 'code');
    if (outcome !== 'kept') written.push(s.name);
    else if ((await getSchedule(db, s.name))?.source === 'api') keptApi.push(s.name);
  }
  const retired = await retireCodeSchedules(
    db,
    [...loadedWorkflows],
    schedules.map((s) => s.name),
  );
  if (keptApi.length > 0)
    logger?.warn({ event: 'schedules_kept_api', schedules: keptApi }, 'schedules defined in code were taken over through the API');
  if (retired.length > 0)
    logger?.info({ event: 'schedules_retired', schedules: retired }, 'schedules no longer defined in the workflow files were retired');
  return { written, keptApi, retired };
}

export function createScheduleService(db: Db, registry: Registry): ScheduleService {
  return {
    async put(body) {
      const spec = parseInput(scheduleSpecSchema, body, 'schedule');
      const workflow = registry.require(spec.workflow);
      checkSchedule(spec, workflow, 'schedule', InvalidInputError);
      const created = (await write(db, spec, 'api')) === 'created';
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
