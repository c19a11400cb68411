import { CronExpressionParser, type CronExpression } from 'cron-parser';

/**
 * Cron arithmetic, pure (no clock of its own: `now` is always the database's, passed in).
 * cron-parser 5 reads the expression in the schedule's IANA time zone (through luxon, i.e. the
 * platform's Intl data). Across a daylight-saving change it does what the README states:
 * - a local time that does not exist (spring forward, 02:30 in Europe/Berlin on the last Sunday
 *   of March) fires once, shifted forward by the gap (03:30 local, the same instant 01:30 UTC);
 * - a local time that happens twice (fall back, 02:30 on the last Sunday of October) fires once,
 *   at its first occurrence (02:30 summer time, 00:30 UTC).
 * Ticks are only ever enumerated forward (`next()`): cron-parser's `prev()` skips the shifted
 * spring-forward tick, so walking backward would disagree with walking forward.
 */

/** A cron expression (5 fields, or 6 with seconds first) and the zone it is read in. */
export interface CronSpec {
  cron: string;
  timezone: string;
}

/** Ticks scanned forward in one call at most; past it the scan jumps toward `now` (a very long outage of a very frequent schedule). */
export const MAX_TICK_SCAN = 10_000;

function iterator(spec: CronSpec, after: Date): CronExpression {
  return CronExpressionParser.parse(spec.cron, { tz: spec.timezone, currentDate: after });
}

/** Why a cron expression or time zone is refused, or null when both are usable. */
export function cronProblem(spec: CronSpec): { path: 'cron' | 'timezone'; message: string } | null {
  try {
    new Intl.DateTimeFormat('en', { timeZone: spec.timezone });
  } catch {
    return { path: 'timezone', message: `unknown time zone "${spec.timezone}" (an IANA name such as "Europe/Berlin" or "UTC")` };
  }
  try {
    iterator(spec, new Date()).next();
  } catch (err) {
    return { path: 'cron', message: `cron expression "${spec.cron}" does not parse: ${(err as Error).message}` };
  }
  return null;
}

/** The first tick strictly after `after`, or null when the expression has none. */
export function nextTick(spec: CronSpec, after: Date): Date | null {
  try {
    return iterator(spec, after).next().toDate();
  } catch {
    return null;
  }
}

export interface DueTicks {
  /** The ticks to fire, oldest first: the last `catchUp` missed ones, then the latest due one. */
  fire: Date[];
  /** Due ticks that fire nothing (older than what catchUp keeps); a lower bound when the scan jumped. */
  missed: number;
  /** The latest due tick (every tick up to it is now decided), or null when none is due. */
  latest: Date | null;
}

/**
 * The ticks in (after, now]. The latest is the one whose period `now` is in: it fires however
 * late. The ones before it were missed (an outage, no worker): `catchUp` of them fire too, the
 * most recent ones; the rest are counted and dropped.
 */
export function dueTicks(spec: CronSpec, after: Date, now: Date, catchUp: number): DueTicks {
  const keep = catchUp + 1;
  const recent: Date[] = [];
  let seen = 0;
  let skippedByJump = 0;
  let it = iterator(spec, after);
  let scanned = 0;
  for (;;) {
    let tick: Date;
    try {
      tick = it.next().toDate();
    } catch {
      break; // no further tick
    }
    if (tick > now) break;
    seen++;
    recent.push(tick);
    if (recent.length > keep) recent.shift();
    if (++scanned >= MAX_TICK_SCAN) {
      // Jump: restart a little before now, far enough back to still see `keep` ticks at the recent pace.
      const pace = (tick.getTime() - after.getTime()) / scanned;
      const from = new Date(Math.max(tick.getTime(), now.getTime() - pace * (keep + 1)));
      skippedByJump += Math.max(0, Math.floor((from.getTime() - tick.getTime()) / Math.max(pace, 1)));
      it = iterator(spec, from);
      scanned = 0;
      after = from;
    }
  }
  const latest = recent.at(-1) ?? null;
  return { fire: recent, missed: seen + skippedByJump - recent.length, latest };
}
