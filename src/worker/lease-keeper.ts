import type { Logger } from 'pino';
import {
  DatabaseUnavailableError,
  monotonicNow,
  StatementTimeLimitError,
  type ExtendLease,
  type ExtendResult,
  type QueryOptions,
} from '../store/index.js';
import { elapsedSinceFirstClaim, withRowBudget } from '../dispatcher/dispatcher.js';
import { decideRetry } from '../planner/retry.js';
import type { Attempt } from './attempt.js';
import { processMetrics, type ExtensionFailureReason, type Metrics } from '../observability/metrics.js';

/**
 * A tick's time limit never goes below this: a statement needs its round trip, and an answer
 * that comes after an attempt's confirmation deadline still renews it (ownership known again).
 */
export const MIN_TICK_LIMIT_MS = 250;
/** After a tick that got no usable answer, the next comes this soon (doubling up to the heartbeat interval). */
export const RETRY_TICK_MS = 100;

/** The keeper's whole dependency: extend a batch of leases in one statement, within a time limit. */
export interface LeaseExtender {
  extend(args: { owner: string; leases: ExtendLease[] }, opts?: QueryOptions): Promise<ExtendResult[]>;
}

const keyOf = (a: Attempt): string => `${a.stage.id}:${a.stage.fence}`;

/** Why an extend statement gave no answer (the `reason` label of the extension failures counter). */
export function extensionFailureReason(err: unknown): ExtensionFailureReason {
  if (!(err instanceof DatabaseUnavailableError)) return 'error';
  return err.cause instanceof StatementTimeLimitError ? 'timeout' : 'unavailable';
}

/**
 * Extends all of one worker's leases in one statement per tick, independent of the tools'
 * own work. Ticks every min(heartbeat) of the attempts it holds, so an extension comes at
 * least one heartbeat interval plus a reserve for one failed request before expiry (the
 * tool class's timing rule).
 *
 * A tick never waits on one hung statement: its time limit is the least confirmed lease time
 * left among the attempts it extends (an answer after that is worth little), at most one
 * heartbeat interval, at least MIN_TICK_LIMIT_MS. Its extender (Store.openExtender) runs on a
 * connection of its own, which a statement without an answer destroys, so the next tick —
 * RETRY_TICK_MS later, not a whole interval — runs on a fresh connection. A statement that
 * throws changes nothing: ownership becomes unknown only when an attempt's confirmation
 * deadline passes.
 *
 * Never extends an attempt that ended, is finishing, ended for good (lost lease, cancel,
 * duration, deadline, shutdown, timeout) or whose call passed its timeout. An answer about an
 * attempt that has since started its finish (or ended) is not a lost lease: its own finish
 * moved the row, and the fenced finish reports what happened.
 */
export class LeaseKeeper {
  /**
   * By stage id and fence: a worker may hold two attempts of one stage (an orphaned one whose
   * ownership became unknown, and its own reclaim of the stage); the old one must still hear
   * that its lease is lost.
   */
  private readonly attempts = new Map<string, Attempt>();
  private timer: NodeJS.Timeout | null = null;
  /** When the armed timer fires (monotonic ms). */
  private dueAt = Infinity;
  private running = false;
  private ticking: Promise<void> | null = null;
  /** The last tick left a lease without a usable answer: the next one comes soon. */
  private soon = false;
  private retryMs = RETRY_TICK_MS;

  constructor(
    private readonly store: LeaseExtender,
    private readonly owner: string,
    private readonly logger: Logger,
    private readonly onAnswer: () => void = () => {},
    private readonly metrics: Metrics = processMetrics(),
  ) {}

  add(attempt: Attempt): void {
    this.attempts.set(keyOf(attempt), attempt);
    if (!this.running || this.ticking) return;
    // A new attempt with a shorter heartbeat must not wait for a timer armed for a longer one.
    if (!this.timer || monotonicNow() + attempt.heartbeatMs < this.dueAt) this.schedule();
  }

  remove(attempt: Attempt): void {
    if (this.attempts.get(keyOf(attempt)) === attempt) this.attempts.delete(keyOf(attempt));
  }

  /** Whether an attempt held for a stage began an irreversible request. */
  effectStarted(stageId: string): boolean {
    return [...this.attempts.values()].some((a) => a.stage.id === stageId && a.effectStarted);
  }

  /** Aborts the attempts held for a stage (shutdown). */
  abort(stageId: string, reason: 'shutdown', message: string): void {
    for (const a of [...this.attempts.values()]) if (a.stage.id === stageId) a.abort(reason, message);
  }

  get size(): number {
    return this.attempts.size;
  }

  /** The attempts held now (metrics read them at scrape time). */
  held(): Attempt[] {
    return [...this.attempts.values()].filter((a) => !a.ended);
  }

  start(): void {
    this.running = true;
    this.schedule();
  }

  async stop(): Promise<void> {
    this.running = false;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    await this.ticking;
  }

  private interval(): number {
    let min = Infinity;
    for (const a of this.attempts.values()) min = Math.min(min, a.heartbeatMs);
    return Number.isFinite(min) ? min : 1000;
  }

  private schedule(): void {
    if (!this.running || this.attempts.size === 0) return;
    if (this.timer) clearTimeout(this.timer);
    const interval = this.interval();
    const wait = this.soon ? Math.min(interval, this.retryMs) : interval;
    this.retryMs = this.soon ? Math.min(this.retryMs * 2, interval) : RETRY_TICK_MS;
    this.soon = false;
    this.dueAt = monotonicNow() + wait;
    this.timer = setTimeout(() => {
      this.timer = null;
      this.dueAt = Infinity;
      this.ticking = this.tick().finally(() => {
        this.ticking = null;
        this.schedule();
      });
    }, wait);
  }

  private tickLimit(live: Attempt[], now: number): number {
    return tickLimitOf(
      live.map((a) => a.confirmedUntil),
      now,
      this.interval(),
    );
  }

  /** One extend statement, within its time limit, for every lease still worth keeping. */
  async tick(): Promise<void> {
    const now = monotonicNow();
    const live = [...this.attempts.values()].filter((a) => !a.ended && !a.finishing && a.finalReason === null && !a.timedOut(now));
    if (live.length === 0) return;
    const timeoutMs = this.tickLimit(live, now);
    let results: ExtendResult[];
    try {
      const leases = live.map((a) => ({ stageId: a.stage.id, fence: a.stage.fence, retryDelayMs: retryAfterOverrun(a) }));
      results = await this.store.extend({ owner: this.owner, leases }, { timeoutMs });
    } catch (err) {
      const reason = extensionFailureReason(err);
      this.metrics.extensionFailures.inc({ reason });
      this.logger.warn(
        { event: 'heartbeat_failed', reason, timeoutMs, err: (err as Error).message, leases: live.length },
        'extend statement failed: ownership unknown until confirmed; asking again soon',
      );
      this.soon = true;
      return;
    }
    this.onAnswer();
    for (const r of results) {
      const a = this.attempts.get(`${r.stageId}:${r.fence}`);
      if (a) this.answer(a, r);
    }
  }

  private answer(a: Attempt, r: ExtendResult): void {
    const log = { runId: a.stage.runId, stageId: a.stage.id, fence: a.stage.fence, toolClass: a.stage.toolClass };
    if (r.verdict === 'extended') {
      a.confirm(r.confirmedUntil!, r.leaseUntil!);
      this.logger.debug({ event: 'heartbeat_ok', ...log, leaseUntil: r.leaseUntil }, 'lease extended');
      return;
    }
    if (r.verdict === 'duration_exceeded') {
      // This statement itself ended the attempt in the database (whatever the attempt does meanwhile).
      this.logger.warn({ event: 'stage_duration_exceeded', ...log }, 'attempt passed maxDuration');
      a.abort('stage_duration_exceeded', `the attempt passed its maxDuration of ${a.stage.maxDurationMs} ms`);
      return;
    }
    if (a.ended || a.finishing || a.finalReason !== null) {
      // Its own finish (or its end) raced this extend: the row moved on for that reason, and
      // the fenced finish tells what happened. Never a lost lease.
      this.logger.debug(
        { event: 'extend_after_finish', ...log, verdict: r.verdict, state: r.state },
        'extend answered after the attempt began its finish',
      );
      return;
    }
    switch (r.verdict) {
      case 'changed':
        this.soon = true; // the row changed while the statement ran: the next tick says what it is now
        this.logger.debug({ event: 'heartbeat_changed', ...log }, 'stage changed during the extend: asking again');
        break;
      case 'cancelled':
        this.logger.info({ event: 'stage_cancelled', ...log }, 'stage cancelled: aborting the tool');
        a.abort('cancelled', 'the run was cancelled');
        break;
      case 'run_deadline':
        this.logger.info({ event: 'run_deadline', ...log }, "the run's deadline passed: aborting the tool");
        a.abort('run_deadline', "the run's deadline passed: the run expired");
        break;
      case 'finished': // the row ended under this fence without this attempt's finish: as good as lost
      case 'lost':
        this.metrics.leasesExpired.inc({ tool_class: a.labels.tool_class, workflow: a.labels.workflow });
        this.logger.warn({ event: 'heartbeat_lost', ...log, state: r.state }, 'lease lost: aborting the tool');
        a.abort('lease_lost', 'the lease was lost: another owner may hold this stage');
        break;
    }
  }
}

/**
 * What the attempt's retry policy says should this extend find it past maxDuration: the delay
 * before the next attempt, or null for none (attempts or maxElapsed spent), decided as a failed
 * attempt's finish decides (the dispatcher's onFailure: errorKind 'timeout', maxElapsed counted
 * to now). Undefined without a policy: the next attempt is due at once while attempts remain.
 */
export function retryAfterOverrun(a: Attempt, now = monotonicNow()): number | null | undefined {
  if (!a.retry) return undefined;
  const decision = decideRetry({
    policy: withRowBudget(a.retry, a.stage), // as the extend statement itself counts it
    attempt: a.stage.attempt,
    errorKind: 'timeout',
    elapsedMs: elapsedSinceFirstClaim(a.stage, now),
  });
  return decision.retry ? decision.delayMs : null;
}

/**
 * A tick's time limit: the least confirmed lease time left among the live attempts (their
 * confirmedUntil), within [MIN_TICK_LIMIT_MS, one heartbeat interval]. An attempt whose
 * confirmed time has already run out (the blip case) counts as 0 left, so the floor applies.
 */
export function tickLimitOf(confirmedUntils: number[], now: number, interval: number): number {
  let least = interval;
  for (const until of confirmedUntils) least = Math.min(least, Math.max(until - now, 0));
  return Math.max(MIN_TICK_LIMIT_MS, Math.floor(least));
}
