import type { Logger } from 'pino';
import type { ExtendResult, Lease } from '../store/index.js';
import type { Attempt } from './attempt.js';
import { processMetrics, type Metrics } from '../observability/metrics.js';

/** The keeper's whole dependency: extend a batch of leases in one statement. */
export interface LeaseExtender {
  extend(args: { owner: string; leases: Lease[] }): Promise<ExtendResult[]>;
}

/**
 * Extends all of one worker's leases in one statement per tick, independent of the tools'
 * own work. Ticks every min(heartbeat) of the attempts it holds, so an extension comes at
 * least one heartbeat interval plus a reserve for one failed request before expiry (the
 * tool class's timing rule). Never extends an attempt that ended, was aborted for a lost
 * lease / cancel / duration, or passed its timeout. A statement that throws changes
 * nothing: ownership becomes unknown only when an attempt's confirmation deadline passes.
 */
export class LeaseKeeper {
  private readonly attempts = new Map<string, Attempt>();
  private timer: NodeJS.Timeout | null = null;
  /** When the armed timer fires (monotonic ms). */
  private dueAt = Infinity;
  private running = false;
  private ticking: Promise<void> | null = null;

  constructor(
    private readonly store: LeaseExtender,
    private readonly owner: string,
    private readonly logger: Logger,
    private readonly onAnswer: () => void = () => {},
    private readonly metrics: Metrics = processMetrics(),
  ) {}

  add(attempt: Attempt): void {
    this.attempts.set(attempt.stage.id, attempt);
    if (!this.running || this.ticking) return;
    // A new attempt with a shorter heartbeat must not wait for a timer armed for a longer one.
    if (!this.timer || performance.now() + attempt.heartbeatMs < this.dueAt) this.schedule();
  }

  remove(attempt: Attempt): void {
    if (this.attempts.get(attempt.stage.id) === attempt) this.attempts.delete(attempt.stage.id);
  }

  /** Whether the attempt held for a stage began an irreversible request. */
  effectStarted(stageId: string): boolean {
    return this.attempts.get(stageId)?.effectStarted ?? false;
  }

  /** Aborts the attempt held for a stage (shutdown). */
  abort(stageId: string, reason: 'shutdown', message: string): void {
    this.attempts.get(stageId)?.abort(reason, message);
  }

  get size(): number {
    return this.attempts.size;
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
    const wait = this.interval();
    this.dueAt = performance.now() + wait;
    this.timer = setTimeout(() => {
      this.timer = null;
      this.dueAt = Infinity;
      this.ticking = this.tick().finally(() => {
        this.ticking = null;
        this.schedule();
      });
    }, wait);
  }

  /** One extend statement for every lease still worth keeping. */
  async tick(): Promise<void> {
    const live = [...this.attempts.values()].filter((a) => {
      if (a.ended || a.finishing || a.timedOut()) return false;
      const reason = a.abortReason;
      return reason === null || reason === 'ownership_unknown' || reason === 'timeout';
    }).filter((a) => !a.timedOut());
    if (live.length === 0) return;
    let results: ExtendResult[];
    try {
      results = await this.store.extend({ owner: this.owner, leases: live.map((a) => ({ stageId: a.stage.id, fence: a.stage.fence })) });
    } catch (err) {
      this.metrics.extensionFailures.inc();
      this.logger.warn({ event: 'heartbeat_failed', err: (err as Error).message, leases: live.length }, 'extend statement failed: ownership unknown until confirmed');
      return;
    }
    this.onAnswer();
    const byId = new Map(live.map((a) => [a.stage.id, a]));
    for (const r of results) {
      const a = byId.get(r.stageId);
      if (!a || a.stage.fence !== r.fence) continue;
      const log = { runId: a.stage.runId, stageId: a.stage.id, fence: a.stage.fence, toolClass: a.stage.toolClass };
      switch (r.verdict) {
        case 'extended':
          this.metrics.leaseRemaining.observe({ tool_class: a.stage.toolClass }, Math.max(0, a.lastLeaseUntil.getTime() - r.dbNow.getTime()) / 1000);
          this.metrics.heartbeatAge.observe({ tool_class: a.stage.toolClass }, (performance.now() - a.lastConfirmedAt) / 1000);
          a.confirm(r.confirmedUntil!, r.leaseUntil!);
          this.logger.debug({ event: 'heartbeat_ok', ...log, leaseUntil: r.leaseUntil }, 'lease extended');
          break;
        case 'cancelled':
          this.logger.info({ event: 'stage_cancelled', ...log }, 'stage cancelled: aborting the tool');
          a.abort('cancelled', 'the run was cancelled');
          break;
        case 'duration_exceeded':
          this.logger.warn({ event: 'stage_duration_exceeded', ...log }, 'attempt passed maxDuration');
          a.abort('stage_duration_exceeded', 'the attempt passed its maxDuration');
          break;
        case 'lost':
          this.metrics.leasesExpired.inc({ tool_class: a.stage.toolClass });
          this.logger.warn({ event: 'heartbeat_lost', ...log, state: r.state }, 'lease lost: aborting the tool');
          a.abort('lease_lost', 'the lease was lost: another owner may hold this stage');
          break;
      }
    }
  }
}
