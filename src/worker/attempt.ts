import type { Logger } from 'pino';
import { AttemptAbortedError, type AbortReason } from '../errors.js';
import { monotonicNow, type ClaimedStage } from '../store/index.js';
import type { EventWriter } from './event-writer.js';

/** setTimeout fires at once past 2^31-1 ms: every delay is bounded. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * One claim of a stage: its lease confirmation deadline (monotonic), its abort signal, its
 * timeout. The deadline timer aborts with `ownership_unknown` before the lease can lapse
 * unseen; beginEffect() checks the deadline synchronously, because a blocked event loop fires
 * timers late.
 */
export class Attempt {
  readonly controller = new AbortController();
  readonly startedAt = monotonicNow();
  /** Monotonic time of the last confirmation (claim or extend). */
  lastConfirmedAt = this.startedAt;
  readonly timeoutAt: number;
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
  private deadlineTimer: NodeJS.Timeout | null = null;
  private readonly confirmListeners = new Set<(confirmedUntil: number) => void>();

  constructor(
    readonly stage: ClaimedStage,
    readonly heartbeatMs: number,
    private readonly events: EventWriter,
    private readonly logger: Logger,
  ) {
    this.timeoutAt = this.startedAt + stage.timeoutMs;
    this.confirmedUntil = stage.confirmedUntil;
    this.lastLeaseUntil = stage.leaseUntil;
    this.armDeadline();
  }

  get signal(): AbortSignal {
    return this.controller.signal;
  }

  get abortReason(): AbortReason | null {
    return this.signal.aborted ? (this.signal.reason as AttemptAbortedError).reason : null;
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

  /** Aborts the attempt's signal once, with a typed reason. */
  abort(reason: AbortReason, message?: string): void {
    if (this.signal.aborted) return;
    const { id: stageId, runId, fence } = this.stage;
    this.controller.abort(new AttemptAbortedError(reason, message ?? `attempt aborted: ${reason}`, { runId, stageId, fence }));
    if (reason === 'ownership_unknown') {
      const data = { lastConfirmedLeaseEnd: this.lastLeaseUntil.toISOString(), lastRequestId: this.lastRequestId };
      this.logger.warn({ event: 'ownership_unknown', runId, stageId, fence, ...data }, 'lease confirmation deadline passed');
      this.events.push({ runId, stageId, type: 'ownership_unknown', fence, attempt: this.stage.attempt, data });
    }
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
    if (this.signal.aborted) throw this.signal.reason as AttemptAbortedError;
  }

  /** Past its timeout the keeper stops extending, whether or not the tool settles. */
  timedOut(now = monotonicNow()): boolean {
    return now >= this.timeoutAt;
  }

  end(): void {
    this.ended = true;
    if (this.deadlineTimer) clearTimeout(this.deadlineTimer);
    this.deadlineTimer = null;
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
