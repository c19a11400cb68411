import type { Logger } from 'pino';
import type { NewEvent, Store } from '../store/index.js';

/** Bound on events kept while the database is away (oldest dropped past it, and logged). */
const MAX_PENDING = 10_000;

/**
 * Writes events that are not part of a lease statement (tool_request_started,
 * ownership_unknown, ...) in batches. While the database does not answer they wait and are
 * retried, so an ownership_unknown event reaches the events table when it answers again.
 */
export class EventWriter {
  private pending: NewEvent[] = [];
  private timer: NodeJS.Timeout | null = null;
  private flushing: Promise<void> | null = null;
  private retryMs = 100;

  constructor(
    private readonly store: Store,
    private readonly logger: Logger,
  ) {}

  push(event: NewEvent): void {
    if (this.pending.length >= MAX_PENDING) {
      const dropped = this.pending.shift();
      this.logger.error({ event: 'event_dropped', type: dropped?.type, runId: dropped?.runId }, 'event buffer full');
    }
    this.pending.push({ ...event, at: event.at ?? new Date() });
    this.schedule(0);
  }

  get size(): number {
    return this.pending.length;
  }

  private schedule(ms: number): void {
    if (this.timer || this.flushing) return;
    this.timer = setTimeout(() => {
      this.timer = null;
      void this.flush();
    }, ms);
    this.timer.unref();
  }

  /** Writes what is pending; on failure keeps it for the next try. */
  flush(): Promise<void> {
    if (this.flushing) return this.flushing;
    if (this.pending.length === 0) return Promise.resolve();
    const batch = this.pending.splice(0, 500);
    this.flushing = this.store
      .appendEvents(batch)
      .then(
        () => {
          this.retryMs = 100;
        },
        (err: unknown) => {
          this.pending.unshift(...batch);
          this.retryMs = Math.min(this.retryMs * 2, 5000);
          this.logger.warn(
            { event: 'event_write_failed', err: (err as Error).message, pending: this.pending.length },
            'events kept for retry',
          );
        },
      )
      .finally(() => {
        this.flushing = null;
        if (this.pending.length > 0) this.schedule(this.retryMs);
      });
    return this.flushing;
  }

  /**
   * Writes what is pending now (waiting for a write already under way first), so an attempt's
   * own events (tool_request_started, outcome_unknown, reconciled) precede its finish in the
   * history. A failure keeps them for the background retry; it never blocks the finish.
   */
  async settle(): Promise<void> {
    if (this.flushing) await this.flushing;
    if (this.pending.length === 0) return;
    if (this.timer) {
      clearTimeout(this.timer);
      this.timer = null;
    }
    await this.flush();
  }

  /** Best effort on shutdown: a few tries within `ms`. */
  async drain(ms = 2000): Promise<void> {
    const until = Date.now() + ms;
    while (this.pending.length > 0 && Date.now() < until) {
      if (this.timer) {
        clearTimeout(this.timer);
        this.timer = null;
      }
      await this.flush();
      if (this.pending.length > 0) await new Promise((r) => setTimeout(r, 100));
    }
    if (this.pending.length > 0)
      this.logger.error({ event: 'events_unwritten', count: this.pending.length }, 'events not written at shutdown');
  }
}
