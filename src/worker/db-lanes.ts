import { InvalidInputError } from '../errors.js';

/** Claim and finish statements that all the workers of one database keep in flight at once, by default. */
export const DEFAULT_DB_LANES = 4;

/**
 * How many of this worker's claim and finish statements may be in flight at once: its share of
 * `total`, the lanes every live worker of the database shares (`total / peers`, at least one).
 *
 * Why: PostgreSQL does a statement's work at the cost of the cores it has. Four worker processes
 * on two cores, each with two or three statements in flight, kept ~10 backends runnable at once,
 * and each statement then cost about twice the CPU (preempted lock holders, cache misses), so four
 * processes made fewer stages per second than one (PERF-NOTES §16). A worker that waits for a
 * lane loses nothing: its finishes wait in the batcher and go out together as one statement when
 * a lane frees, and its claim asks for the slots free by then.
 *
 * Lease heartbeats, the sweeper and event writes do not take a lane: a lease is never extended
 * late for it. Nor do a finish whose lease is nearly out (it goes at once, also when it has been
 * waiting), a finish asked again after a conflict, or a claim of a class with limits (its own
 * transaction serialises it on the class lock).
 */
export class DbLanes {
  private busy = 0;
  private live = 1;
  private readonly waiters: (() => void)[] = [];

  /** `total`: lanes shared by every live worker of the database; `Infinity` (or 0) turns the limit off. */
  private readonly total: number;
  constructor(total: number) {
    this.total = total === 0 ? Infinity : total;
  }

  /** This worker's lanes now. */
  get width(): number {
    return Number.isFinite(this.total) ? Math.max(1, Math.floor(this.total / this.live)) : Infinity;
  }

  /** Statements of this worker in flight now. */
  get inFlight(): number {
    return this.busy;
  }

  /** Live workers of the database, this one included (from ratchet.workers, each sweeper tick; 1 before the first). */
  get peers(): number {
    return this.live;
  }

  setPeers(n: number): void {
    this.live = Math.max(1, Math.floor(n));
    this.drain();
  }

  /** A lane now if one is free and nobody waits (its release), else null. */
  tryAcquire(): (() => void) | null {
    if (this.busy >= this.width || this.waiters.length > 0) return null;
    this.busy++;
    return this.releaser();
  }

  /** Waits for a lane; the answer releases it (once). Null when `signal` aborted the wait (no lane taken). */
  async acquire(signal?: AbortSignal): Promise<(() => void) | null> {
    if (signal?.aborted) return null;
    const now = this.tryAcquire();
    if (now) return now;
    const got = await new Promise<boolean>((resolve) => {
      const waiter = () => {
        signal?.removeEventListener('abort', onAbort);
        resolve(true);
      };
      const onAbort = () => {
        const i = this.waiters.indexOf(waiter);
        if (i >= 0) this.waiters.splice(i, 1);
        resolve(false);
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.waiters.push(waiter);
    });
    return got ? this.releaser() : null;
  }

  private releaser(): () => void {
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.busy--;
      this.drain();
    };
  }

  /** Hands free lanes to waiters, oldest first (a waiter's lane is counted when handed). */
  private drain(): void {
    while (this.waiters.length > 0 && this.busy < this.width) {
      this.busy++;
      this.waiters.shift()!();
    }
  }
}

/** RATCHET_DB_LANES: a whole number of lanes, or 0 for no limit; unset: none given. */
export function dbLanesFromEnv(env: NodeJS.ProcessEnv = process.env): number | undefined {
  const v = env.RATCHET_DB_LANES?.trim();
  if (v === undefined || v === '') return undefined;
  if (!/^\d{1,6}$/.test(v))
    throw new InvalidInputError(`RATCHET_DB_LANES must be a whole number (0: no limit), not "${v}"`, 'RATCHET_DB_LANES');
  const n = Number(v);
  return n === 0 ? Infinity : n;
}
