import type { Logger } from 'pino';
import { AttemptAbortedError, type AbortReason } from '../errors.js';
import type { AttemptLabels, Metrics } from '../observability/metrics.js';
import { monotonicNow, type ClaimedStage } from '../store/index.js';
import type { EventWriter } from './event-writer.js';

/** setTimeout fires at once past 2^31-1 ms: every delay is bounded. */
const MAX_TIMER_MS = 2 ** 31 - 1;

export interface AttemptOptions {
  /** Bounded labels for its metrics (default: its tool class and workflow). */
  labels?: AttemptLabels;
  /** Counts ownership_unknown when it happens (not when the attempt ends). */
  metrics?: Metrics;
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
  readonly controller = new AbortController();
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
  private final: AttemptAbortedError | null = null;
  private readonly finalListeners = new Set<(err: AttemptAbortedError) => void>();
  /** The deadline of the call in progress (reconcile, run, a model call), monotonic ms; null between calls. */
  private callDeadline: number | null = null;
  private deadlineTimer: NodeJS.Timeout | null = null;
  private readonly confirmListeners = new Set<(confirmedUntil: number) => void>();
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
    this.armDeadline();
  }

  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /** The reason that ends the attempt, else the signal's (ownership_unknown), else null. */
  get abortReason(): AbortReason | null {
    return this.final?.reason ?? (this.signal.aborted ? (this.signal.reason as AttemptAbortedError).reason : null);
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
    return this.signal.aborted && (this.signal.reason as AttemptAbortedError).reason === 'ownership_unknown';
  }

  /** A newer confirmation from an extend statement. */
  confirm(confirmedUntil: number, leaseUntil: Date): void {
    if (this.ended) return;
    this.confirmedUntil = Math.max(this.confirmedUntil, confirmedUntil);
    this.lastConfirmedAt = monotonicNow();
    this.lastLeaseUntil = leaseUntil;
    this.armDeadline();
    for (const listener of this.confirmListeners) listener(this.confirmedUntil);
  }

  /** Calls `listener` after each newer confirmation (the thread runner mirrors the deadline); returns an unsubscribe. */
  onConfirm(listener: (confirmedUntil: number) => void): () => void {
    this.confirmListeners.add(listener);
    return () => this.confirmListeners.delete(listener);
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
    if (!this.signal.aborted) {
      this.controller.abort(err);
      if (reason === 'ownership_unknown') this.reportOwnershipUnknown();
    } else if (ends) {
      const from = (this.signal.reason as AttemptAbortedError).reason;
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
    if (!this.signal.aborted && monotonicNow() >= this.confirmedUntil) this.abort('ownership_unknown');
    if (this.signal.aborted) throw this.final ?? (this.signal.reason as AttemptAbortedError);
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
    if (this.deadlineTimer) clearTimeout(this.deadlineTimer);
    this.deadlineTimer = null;
  }

  private reportOwnershipUnknown(): void {
    const { id: stageId, runId, fence } = this.stage;
    const data = { lastConfirmedLeaseEnd: this.lastLeaseUntil.toISOString(), lastRequestId: this.lastRequestId };
    this.logger.warn({ event: 'ownership_unknown', runId, stageId, fence, ...data }, 'lease confirmation deadline passed');
    this.events.push({ runId, stageId, type: 'ownership_unknown', fence, attempt: this.stage.attempt, data });
    this.metrics?.ownershipUnknown.inc({ tool_class: this.labels.tool_class, workflow: this.labels.workflow });
  }

  private armDeadline(): void {
    if (this.deadlineTimer) clearTimeout(this.deadlineTimer);
    const wait = Math.min(Math.max(0, this.confirmedUntil - monotonicNow()), MAX_TIMER_MS);
    this.deadlineTimer = setTimeout(() => {
      this.deadlineTimer = null;
      if (this.ended) return;
      if (monotonicNow() >= this.confirmedUntil) this.abort('ownership_unknown');
      else this.armDeadline();
    }, wait);
  }
}
