import type { Command } from 'commander';
import type { GlobalOptions } from '../api/options.js';
import type { ScheduleBody, ScheduleJson } from '../../api/schedule-schemas.js';

interface ScheduleFlags extends GlobalOptions {
  workflowsDir?: string;
}
interface AddFlags extends ScheduleFlags {
  cron: string;
  workflow: string;
  timezone?: string;
  input?: string;
  overlap?: string;
  catchUp?: string;
  priority?: string;
}

/** What the schedules commands need, from a server (--url) or from the store directly. */
interface ScheduleBackend {
  list(): Promise<ScheduleJson[]>;
  put(body: ScheduleBody): Promise<{ schedule: ScheduleJson; created: boolean }>;
  delete(name: string): Promise<{ name: string; deleted: true }>;
  close(): Promise<void>;
}

async function openScheduleBackend(o: ScheduleFlags, withWorkflows: boolean): Promise<ScheduleBackend> {
  const { serverUrl, bearerToken, storeTarget, workflowsDir, cliLogger } = await import('../api/options.js');
  const url = serverUrl(o);
  if (url) {
    const { createClient } = await import('../../client/client.js');
    const client = createClient({ baseUrl: url, token: bearerToken(o) });
    return {
      list: () => client.listSchedules(),
      put: (b) => client.putSchedule(b),
      delete: (n) => client.deleteSchedule(n),
      close: async () => {},
    };
  }
  const [{ existsSync }, { loadWorkflows }, { createRatchet }, { scheduleToJson }, { ApiError }] = await Promise.all([
    import('node:fs'),
    import('../../definitions/loader.js'),
    import('../../engine.js'),
    import('../../api/schedule-schemas.js'),
    import('../../api/errors.js'),
  ]);
  const dir = workflowsDir(o.workflowsDir);
  const workflows = withWorkflows && existsSync(dir) ? await loadWorkflows(dir) : [];
  const r = await createRatchet({ ...storeTarget(o), workflows, logger: cliLogger() });
  return {
    list: async () => (await r.schedules.list()).map(scheduleToJson),
    put: async (b) => {
      const res = await r.schedules.put(b);
      return { schedule: scheduleToJson(res.schedule), created: res.created };
    },
    delete: async (name) => {
      if (!(await r.schedules.delete(name))) throw new ApiError(404, 'unknown_schedule', `no schedule named "${name}"`, { path: 'name' });
      return { name, deleted: true as const };
    },
    close: () => r.close(),
  };
}

async function withSchedules<T>(o: ScheduleFlags, withWorkflows: boolean, fn: (b: ScheduleBackend) => Promise<T>): Promise<T> {
  const b = await openScheduleBackend(o, withWorkflows);
  try {
    return await fn(b);
  } finally {
    await b.close();
  }
}

/** ok; retired (no longer in the workflow files); failing: the last submit's error, and when the tick is tried again. */
function status(s: ScheduleJson): string {
  if (s.retiredAt) return `retired ${s.retiredAt}`;
  if (s.failures > 0 && s.lastError) {
    const message = s.lastError.message.length > 80 ? `${s.lastError.message.slice(0, 77)}...` : s.lastError.message;
    return `failing x${s.failures} (${s.lastError.code}: ${message})${s.backoffUntil ? ` retry after ${s.backoffUntil}` : ''}`;
  }
  return 'ok';
}

function formatSchedules(list: ScheduleJson[]): string {
  if (list.length === 0) return 'no schedules';
  const rows = list.map((s) => [
    s.name,
    `${s.cron} (${s.timezone})`,
    s.workflow,
    s.nextTickAt ?? 'never',
    `overlap=${s.overlap} catchUp=${s.catchUp}${s.priority !== null ? ` priority=${s.priority}` : ''}`,
    s.source,
    status(s),
  ]);
  const head = ['NAME', 'CRON', 'WORKFLOW', 'NEXT TICK', 'POLICY', 'SOURCE', 'STATUS'];
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  return [head, ...rows]
    .map((r) =>
      r
        .map((c, i) => c.padEnd(widths[i]!))
        .join('  ')
        .trimEnd(),
    )
    .join('\n');
}

/** `ratchet schedules`: list cron schedules; `schedules add` creates or replaces one; `schedules delete` removes one. */
export function registerSchedulesCommand(program: Command): void {
  const schedules = program
    .command('schedules')
    .description('cron schedules: list them (add / delete below); ticks fire in workers')
    .action(async (_o: unknown, cmd: Command) => {
      const { printer } = await import('../api/options.js');
      const o = cmd.optsWithGlobals<ScheduleFlags>();
      const list = await withSchedules(o, false, (b) => b.list());
      printer(o)({ schedules: list }, () => formatSchedules(list));
    });
  schedules
    .command('add <name>')
    .description('create or replace a schedule (its tick history stays)')
    .requiredOption('--cron <expr>', 'cron expression: 5 fields, or 6 with seconds first')
    .requiredOption('--workflow <name>', 'the workflow each tick starts')
    .option('--timezone <iana>', 'the time zone the cron is read in (default UTC)')
    .option('--input <json>', "each run's input: JSON, or @file (default {})")
    .option('--overlap <skip|allow>', 'skip (default): start nothing while the previous run is going')
    .option('--catch-up <none|N>', 'missed ticks fired after an outage besides the latest (default none)')
    .option('--priority <n>', "the priority of the runs it starts, -100..100 (default: the workflow's)")
    .option('--workflows-dir <dir>', 'where the workflows are (without --url)')
    .action(async (name: string, _o: unknown, cmd: Command) => {
      const [{ printer }, { readRunInput }] = await Promise.all([import('../api/options.js'), import('../run/input.js')]);
      const o = cmd.optsWithGlobals<AddFlags>();
      const catchUp = o.catchUp === undefined ? undefined : /^\d+$/.test(o.catchUp) ? Number(o.catchUp) : o.catchUp;
      const body = {
        name,
        cron: o.cron,
        workflow: o.workflow,
        ...(o.timezone ? { timezone: o.timezone } : {}),
        input: o.input === undefined ? {} : await readRunInput(o.input),
        ...(o.overlap ? { overlap: o.overlap } : {}),
        ...(catchUp !== undefined ? { catchUp } : {}),
        ...(o.priority !== undefined ? { priority: /^-?\d+$/.test(o.priority) ? Number(o.priority) : o.priority } : {}),
      } as ScheduleBody;
      const res = await withSchedules(o, true, (b) => b.put(body));
      printer(o)(res, () => `${res.created ? 'created' : 'replaced'} schedule ${name}: next tick ${res.schedule.nextTickAt ?? 'never'}`);
    });
  schedules
    .command('delete <name>')
    .description('delete a schedule (runs it started stay)')
    .action(async (name: string, _o: unknown, cmd: Command) => {
      const { printer } = await import('../api/options.js');
      const o = cmd.optsWithGlobals<ScheduleFlags>();
      const res = await withSchedules(o, false, (b) => b.delete(name));
      printer(o)(res, () => `deleted schedule ${name}`);
    });
}
