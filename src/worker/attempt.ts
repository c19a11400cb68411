import type { Logger } from 'pino';
import type { RetryPolicy } from '../definitions/types.js';
import { AttemptAbortedError, type AbortReason } from '../errors.js';
import type { AttemptLabels, Metrics } from '../observability/metrics.js';
import { monotonicNow, type ClaimedStage } from '../store/index.js';
import type { EventWriter } from './event-writer.js';

/** setTimeout fires at once past 2^31-1 ms: every delay is bounded. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * One timer for the confirmation deadlines of every attempt in the process, instead of one per
 * attempt (a setTimeout per attempt, each with its own duration — a new node timer list, a
 * priority-queue insert and removal — was ~2% of a worker's CPU, PERF-NOTES §15). It is armed
 * for the earliest deadline it knows of; at each firing it aborts (ownership_unknown) every
 * attempt whose deadline passed on the monotonic clock now — never one before its deadline —
 * and re-arms for the earliest of the rest. An attempt that is added with an earlier deadline
 * than the armed one re-arms it; a confirmation only moves a deadline later, so it re-arms
 * nothing (the timer fires, finds it not due, and re-arms). Attempts leave at their end. The
 * timer holds the process open only while it watches an attempt (as the per-attempt timers did).
 */
class DeadlineWatch {
  private readonly watched = new Set<Attempt>();
  private timer: NodeJS.Timeout | null = null;
  /** When the armed timer fires (monotonic ms), Infinity when none is armed. */
  private dueAt = Infinity;
  private readonly fire = (): void => this.check();

  watch(a: Attempt): void {
    if (a.ended) return;
    if (this.watched.size === 0) this.timer?.ref();
    this.watched.add(a);
    if (a.confirmedUntil < this.dueAt) this.arm(a.confirmedUntil);
  }

  unwatch(a: Attempt): void {
    if (this.watched.delete(a) && this.watched.size === 0) this.timer?.unref();
  }

  /** How many attempts it watches (tests). */
  get size(): number {
    return this.watched.size;
  }

  private arm(at: number): void {
    if (this.timer) clearTimeout(this.timer);
    this.dueAt = at;
    this.timer = setTimeout(this.fire, Math.min(Math.max(0, at - monotonicNow()), MAX_TIMER_MS));
    if (this.watched.size === 0) this.timer.unref();
  }

  private check(): void {
    this.timer = null;
    this.dueAt = Infinity;
    let next = Infinity;
    let thrown: { err: unknown } | null = null;
    for (const a of this.watched) {
      let done: boolean;
      try {
        done = a.deadlineDue(monotonicNow());
      } catch (err) {
        thrown ??= { err }; // the others are still checked; the first error is thrown after, as a timer's would be
        done = true;
      }
      if (done) this.watched.delete(a);
      else if (a.confirmedUntil < next) next = a.confirmedUntil;
    }
    if (next < this.dueAt) this.arm(next);
    if (thrown) throw thrown.err;
  }
}
const deadlines = new DeadlineWatch();

/** The attempts the deadline timer watches now (tests). */
export const watchedDeadlines = (): number => deadlines.size;

export interface AttemptOptions {
  /** Bounded labels for its metrics (default: its tool class and workflow). */
  labels?: AttemptLabels;
  /** Counts ownership_unknown when it happens (not when the attempt ends). */
  metrics?: Metrics;
  /** Its tool's retry policy: what follows should the keeper's extend find it past maxDuration. */
  retry?: RetryPolicy;
}

/**
 * One claim of a stage: its lease confirmation deadline (monotonic), its abort signal, the
 * deadline of the call in progress. The deadline timer aborts with `ownership_unknown` before
 * the lease can lapse unseen; beginEffect() checks the deadline synchronously, because a
 * blocked event loop fires timers late.
 *
 * Aborts escalate. `ownership_unknown` only informs the tool (its signal aborts, beginEffect
 * refuses; a tool that still answers is judged by the fenced finish). Every other reason is
 * final: the attempt is over whatever the tool does, and it stays final when it comes after
 * `ownership_unknown` — an AbortSignal aborts only once, so the signal keeps its first reason
 * while `finalReason` and onFinal() carry the one that ends the attempt (the runner stops
 * waiting, the slot is freed, a tool thread is terminated after its grace).
 */
export class Attempt {
  /**
   * Made at the first read of `signal` (most tools never read theirs: an AbortSignal and its
   * EventTarget per attempt were ~3% of a worker's CPU, PERF-NOTES §15); until then the first
   * abort is kept in `firstAbort`, and a signal made after it is aborted with it at once.
   */
  private controller: AbortController | null = null;
  /** The first abort (the signal's reason), kept whether or not the signal exists. */
  private firstAbort: AttemptAbortedError | null = null;
  readonly startedAt = monotonicNow();
  /** Monotonic time of the last confirmation (claim or extend). */
  lastConfirmedAt = this.startedAt;
  /** Monotonic ms until which the lease is confirmed. */
  confirmedUntil: number;
  /** Wall-clock end of the last confirmed lease (for the ownership_unknown event). */
  lastLeaseUntil: Date;
  lastRequestId: string | null = null;
  effectStarted = false;
  /** The key the tool derived for its effect (tool.idempotencyKey(input)), once derived; recorded with its requests. */
  effectKey: string | null = null;
  /** Its finish is on the way: the keeper leaves it alone (the finish itself is fenced). */
  finishing = false;
  ended = false;
  readonly labels: AttemptLabels;
  /** Its tool's retry policy (AttemptOptions.retry), if given. */
  readonly retry: RetryPolicy | undefined;
  private final: AttemptAbortedError | null = null;
  private readonly finalListeners = new Set<(err: AttemptAbortedError) => void>();
  /** The deadline of the call in progress (reconcile, run, a model call), monotonic ms; null between calls. */
  private callDeadline: number | null = null;
  /** Made at the first onConfirm (only the thread runner listens). */
  private confirmListeners: Set<(confirmedUntil: number) => void> | null = null;
  private readonly metrics: Metrics | undefined;

  constructor(
    readonly stage: ClaimedStage,
    readonly heartbeatMs: number,
    private readonly events: EventWriter,
    private readonly logger: Logger,
    options: AttemptOptions = {},
  ) {
    this.confirmedUntil = stage.confirmedUntil;
    this.lastLeaseUntil = stage.leaseUntil;
    this.labels = options.labels ?? { tool_class: stage.toolClass, workflow: stage.workflow };
    this.metrics = options.metrics;
    this.retry = options.retry;
    this.armDeadline();
  }

  /** The attempt's abort signal: made at its first read, already aborted with the first reason if one came before. */
  get signal(): AbortSignal {
    if (this.controller === null) {
      this.controller = new AbortController();
      if (this.firstAbort !== null) this.controller.abort(this.firstAbort);
    }
    return this.controller.signal;
  }

  /** Whether the signal has been made (tests: an attempt whose tool never reads its signal makes none). */
  get signalMade(): boolean {
    return this.controller !== null;
  }

  /** Whether it aborted (the signal's `aborted`, without making the signal). */
  get aborted(): boolean {
    return this.firstAbort !== null;
  }

  /** The reason that ends the attempt, else the signal's (ownership_unknown), else null. */
  get abortReason(): AbortReason | null {
    return this.final?.reason ?? this.firstAbort?.reason ?? null;
  }

  /** The reason that ended the attempt (anything but ownership_unknown), or null while it may still finish. */
  get finalReason(): AbortReason | null {
    return this.final?.reason ?? null;
  }

  get finalError(): AttemptAbortedError | null {
    return this.final;
  }

  /** Whether its signal aborted with ownership_unknown (whatever came after). */
  get ownershipLapsed(): boolean {
    return this.firstAbort?.reason === 'ownership_unknown';
  }

  /** A newer confirmation from an extend statement. */
  confirm(confirmedUntil: number, leaseUntil: Date): void {
    if (this.ended) return;
    this.confirmedUntil = Math.max(this.confirmedUntil, confirmedUntil);
    this.lastConfirmedAt = monotonicNow();
    this.lastLeaseUntil = leaseUntil;
    this.armDeadline();
    if (this.confirmListeners) for (const listener of this.confirmListeners) listener(this.confirmedUntil);
  }

  /** Calls `listener` after each newer confirmation (the thread runner mirrors the deadline); returns an unsubscribe. */
  onConfirm(listener: (confirmedUntil: number) => void): () => void {
    const listeners = (this.confirmListeners ??= new Set());
    listeners.add(listener);
    return () => listeners.delete(listener);
  }

  /** Calls `listener` once when the attempt ends for good (at once if it has); returns an unsubscribe. */
  onFinal(listener: (err: AttemptAbortedError) => void): () => void {
    if (this.final) {
      listener(this.final);
      return () => {};
    }
    this.finalListeners.add(listener);
    return () => this.finalListeners.delete(listener);
  }

  /**
   * Aborts with a typed reason. The signal aborts once (its first reason); a final reason
   * also ends the attempt, once, even after `ownership_unknown` (see the class comment).
   */
  abort(reason: AbortReason, message?: string): void {
    const { id: stageId, runId, fence } = this.stage;
    const err = new AttemptAbortedError(reason, message ?? `attempt aborted: ${reason}`, { runId, stageId, fence });
    const ends = reason !== 'ownership_unknown' && this.final === null;
    if (ends) this.final = err; // before the signal's listeners run, so they see it
    if (this.firstAbort === null) {
      this.firstAbort = err;
      this.controller?.abort(err); // a signal made later is aborted with it at its first read
      if (reason === 'ownership_unknown') this.reportOwnershipUnknown();
    } else if (ends) {
      const from = this.firstAbort.reason;
      this.logger.warn({ event: 'attempt_escalated', runId, stageId, fence, from, reason }, 'attempt ended after ownership became unknown');
    }
    if (!ends) return;
    const listeners = [...this.finalListeners];
    this.finalListeners.clear();
    for (const listener of listeners) listener(err);
  }

  /**
   * The gate before an irreversible request: throws when ownership is lost or unknown (checked
   * on the clock now, not only by the timer), else records tool_request_started.
   */
  beginEffect(requestId: string): void {
    this.checkOwnership();
    this.recordEffect(requestId);
  }

  /**
   * Records tool_request_started without the check: for a gate that was passed elsewhere (a
   * worker thread checks the shared deadline itself; its effect started even if this side
   * learns of it after an abort).
   */
  recordEffect(requestId: string): void {
    this.lastRequestId = requestId;
    this.effectStarted = true;
    const { id: stageId, runId, fence, attempt } = this.stage;
    this.logger.info({ event: 'tool_request_started', runId, stageId, fence, requestId }, 'tool request started');
    const data = { requestId, ...(this.effectKey ? { effectKey: this.effectKey } : {}) };
    this.events.push({ runId, stageId, type: 'tool_request_started', fence, attempt, data });
  }

  checkOwnership(): void {
    if (this.firstAbort === null && monotonicNow() >= this.confirmedUntil) this.abort('ownership_unknown');
    if (this.firstAbort !== null) throw this.final ?? this.firstAbort;
  }

  /** A call starts with `limitMs` to run; returns its deadline (monotonic ms). */
  beginCall(limitMs: number): number {
    this.callDeadline = monotonicNow() + limitMs;
    return this.callDeadline;
  }

  endCall(): void {
    this.callDeadline = null;
  }

  /** Past the timeout of the call in progress the keeper stops extending, whether or not the tool settles. */
  timedOut(now = monotonicNow()): boolean {
    return this.callDeadline !== null && now >= this.callDeadline;
  }

  /** Seconds since the last confirmation (claim or extend): grows while heartbeats stop. */
  heartbeatAgeSeconds(now = monotonicNow()): number {
    return Math.max(0, now - this.lastConfirmedAt) / 1000;
  }

  /** Seconds of lease this worker can still vouch for (its confirmation deadline), never below 0. */
  leaseRemainingSeconds(now = monotonicNow()): number {
    return Math.max(0, this.confirmedUntil - now) / 1000;
  }

  end(): void {
    this.ended = true;
    deadlines.unwatch(this);
  }

  private reportOwnershipUnknown(): void {
    const { id: stageId, runId, fence } = this.stage;
    const data = { lastConfirmedLeaseEnd: this.lastLeaseUntil.toISOString(), lastRequestId: this.lastRequestId };
    this.logger.warn({ event: 'ownership_unknown', runId, stageId, fence, ...data }, 'lease confirmation deadline passed');
    this.events.push({ runId, stageId, type: 'ownership_unknown', fence, attempt: this.stage.attempt, data });
    this.metrics?.ownershipUnknown.inc({ tool_class: this.labels.tool_class, workflow: this.labels.workflow });
  }

  /** Watched by the process's one deadline timer until it ends (or its deadline passes). */
  private armDeadline(): void {
    deadlines.watch(this);
  }

  /** The deadline watch's callback: past its confirmation deadline (on the clock now), ownership becomes unknown. */
  deadlineDue(now: number): boolean {
    if (this.ended) return true;
    if (now < this.confirmedUntil) return false;
    this.abort('ownership_unknown');
    return true;
  }
}
