import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { InvalidDefinitionError } from '../../src/errors.js';
import { defineSchedule } from '../../src/schedules/define.js';
import { cronProblem, dueTicks, nextTick } from '../../src/schedules/ticks.js';

const berlin = { cron: '30 2 * * *', timezone: 'Europe/Berlin' };
const iso = (d: Date) => d.toISOString();

/** Every tick in (from, to], walking forward as the firing pass does. */
function ticksBetween(spec: typeof berlin, from: string, to: string): string[] {
  const out: string[] = [];
  let t = new Date(from);
  for (;;) {
    const n = nextTick(spec, t);
    if (!n || n > new Date(to)) return out;
    out.push(iso(n));
    t = n;
  }
}

/** Local date in Berlin of an instant. */
const berlinDate = (s: string) => new Intl.DateTimeFormat('en-CA', { timeZone: 'Europe/Berlin', dateStyle: 'short' }).format(new Date(s));

describe('cron ticks in a time zone across daylight-saving changes (cron-parser 5)', () => {
  it('spring forward (Berlin, 29 March 2026): 02:30 does not exist; it fires once that day, at 03:30 CEST (01:30 UTC)', () => {
    const ticks = ticksBetween(berlin, '2026-03-26T12:00:00Z', '2026-04-01T12:00:00Z');
    expect(ticks).toEqual([
      '2026-03-27T01:30:00.000Z',
      '2026-03-28T01:30:00.000Z', // 02:30 CET
      '2026-03-29T01:30:00.000Z', // the skipped hour: shifted to 03:30 CEST
      '2026-03-30T00:30:00.000Z',
      '2026-03-31T00:30:00.000Z',
      '2026-04-01T00:30:00.000Z', // 02:30 CEST
    ]);
    expect(ticks.map(berlinDate)).toEqual(['2026-03-27', '2026-03-28', '2026-03-29', '2026-03-30', '2026-03-31', '2026-04-01']);
  });

  it('fall back (Berlin, 25 October 2026): 02:30 happens twice; it fires once, at the first (02:30 CEST, 00:30 UTC)', () => {
    const ticks = ticksBetween(berlin, '2026-10-22T12:00:00Z', '2026-10-28T12:00:00Z');
    expect(ticks).toEqual([
      '2026-10-23T00:30:00.000Z',
      '2026-10-24T00:30:00.000Z',
      '2026-10-25T00:30:00.000Z', // 02:30 CEST (the first 02:30 on the 25th)
      '2026-10-26T01:30:00.000Z',
      '2026-10-27T01:30:00.000Z',
      '2026-10-28T01:30:00.000Z', // 02:30 CET
    ]);
    expect(new Set(ticks.map(berlinDate)).size).toBe(ticks.length);
  });

  it('an hourly schedule has 23 ticks on the spring-forward day and 25 on the fall-back day (each instant once)', () => {
    const hourly = { cron: '0 * * * *', timezone: 'Europe/Berlin' };
    expect(ticksBetween(hourly, '2026-03-28T22:59:59Z', '2026-03-29T21:59:59Z')).toHaveLength(23);
    expect(ticksBetween(hourly, '2026-10-24T21:59:59Z', '2026-10-25T22:59:59Z')).toHaveLength(25);
  });

  it('dueTicks: the latest due tick fires; catchUp N adds the N missed before it, the rest are counted as missed', () => {
    const hourly = { cron: '0 * * * *', timezone: 'UTC' };
    const after = new Date('2026-05-01T00:00:00Z');
    const now = new Date('2026-05-01T10:05:00Z'); // ticks 01:00 .. 10:00 are due
    expect(dueTicks(hourly, after, now, 0)).toEqual({
      fire: [new Date('2026-05-01T10:00:00Z')],
      missed: 9,
      latest: new Date('2026-05-01T10:00:00Z'),
    });
    const three = dueTicks(hourly, after, now, 3);
    expect(three.fire.map(iso)).toEqual(['07', '08', '09', '10'].map((h) => `2026-05-01T${h}:00:00.000Z`));
    expect(three.missed).toBe(6);
    expect(dueTicks(hourly, after, new Date('2026-05-01T00:59:59Z'), 3)).toEqual({ fire: [], missed: 0, latest: null });
    // A tick exactly at `after` was decided already; one exactly at `now` is due.
    expect(dueTicks(hourly, after, new Date('2026-05-01T01:00:00Z'), 0).fire.map(iso)).toEqual(['2026-05-01T01:00:00.000Z']);
  });

  it('a year-long outage of an every-second schedule is decided quickly (the scan jumps), the latest tick fires', () => {
    const started = performance.now();
    const due = dueTicks(
      { cron: '* * * * * *', timezone: 'UTC' },
      new Date('2025-01-01T00:00:00Z'),
      new Date('2026-01-01T00:00:00.500Z'),
      2,
    );
    expect(performance.now() - started).toBeLessThan(5000);
    expect(due.fire.map(iso)).toEqual(['2025-12-31T23:59:58.000Z', '2025-12-31T23:59:59.000Z', '2026-01-01T00:00:00.000Z']);
    expect(due.missed).toBeGreaterThan(1000);
  });

  it('names a bad expression or an unknown time zone', () => {
    expect(cronProblem({ cron: '61 * * * *', timezone: 'UTC' })?.path).toBe('cron');
    expect(cronProblem({ cron: 'every hour', timezone: 'UTC' })?.path).toBe('cron');
    expect(cronProblem({ cron: '0 * * * *', timezone: 'Mars/Olympus_Mons' })?.path).toBe('timezone');
    expect(cronProblem({ cron: '*/15 9-17 * * 1-5', timezone: 'America/New_York' })).toBeNull();
  });
});

describe('defineSchedule', () => {
  const cls = defineToolClass({ name: 'sched-def', lease: '3s', heartbeat: '1s', jitter: '200ms', timeout: '2s', maxDuration: '10s' });
  const echo = defineTool({
    name: 'sched_echo',
    description: 'echo',
    class: cls,
    input: z.object({ n: z.number() }),
    output: z.object({ n: z.number() }),
    run: async (i) => i,
  });
  const wf = defineWorkflow({ name: 'sched-echo', input: z.object({ n: z.number() }), steps: [{ tool: echo }] });

  it('fills the defaults', () => {
    const s = defineSchedule({ name: 'nightly', cron: '30 2 * * *', workflow: wf, input: { n: 1 } });
    expect(s).toMatchObject({
      name: 'nightly',
      timezone: 'UTC',
      workflow: 'sched-echo',
      overlap: 'skip',
      catchUp: 'none',
      input: { n: 1 },
    });
  });

  it('refuses bad definitions with a path', () => {
    const bad: [unknown, string][] = [
      [{ name: 'x', cron: '61 * * * *', workflow: wf, input: { n: 1 } }, 'schedule[x].cron'],
      [{ name: 'x', cron: '0 * * * *', timezone: 'Nowhere/City', workflow: wf, input: { n: 1 } }, 'schedule[x].timezone'],
      [{ name: 'x', cron: '0 * * * *', workflow: wf, input: { n: 'one' } }, 'schedule[x].input.n'],
      [{ name: 'x', cron: '0 * * * *', workflow: wf, input: { n: 1 }, overlap: 'queue' }, 'schedule[x].overlap'],
      [{ name: 'x', cron: '0 * * * *', workflow: wf, input: { n: 1 }, catchUp: 0 }, 'schedule[x].catchUp'],
      [{ name: '1bad', cron: '0 * * * *', workflow: wf }, 'schedule[1bad].name'],
    ];
    for (const [opts, path] of bad) {
      let err: unknown;
      try {
        defineSchedule(opts as never);
      } catch (e) {
        err = e;
      }
      expect(err, path).toBeInstanceOf(InvalidDefinitionError);
      expect((err as InvalidDefinitionError).details.path ?? (err as { path?: string }).path, path).toBe(path);
    }
  });
});
