import {
  encodeFinishRow,
  FinishPartlyCommitted,
  finishEncoded,
  monotonicNow,
  type FinishRow,
  type FinishVerdict,
  type Queryable,
} from '../store/index.js';
import type { DbLanes } from './db-lanes.js';

/** How long a finish waits for others to join it. */
export const FINISH_BATCH_WINDOW_MS = 2;
/** A finish whose lease is confirmed for less than this goes alone, at once. */
export const FINISH_BATCH_MIN_ROOM_MS = 250;
const MAX_BATCH = 200;

interface Pending {
  row: Record<string, unknown>;
  /** The lease is confirmed until then (monotonic ms). */
  confirmedUntil: number;
  resolve(v: FinishVerdict): void;
  reject(e: unknown): void;
}

/**
 * Finishes that complete within a few milliseconds of each other commit together: one
 * statement over a JSON array, each row still fenced on its own owner + token + lease. Each
 * row is validated before it joins (one bad row cannot sink the batch); a row joins only when
 * its local deadline leaves room; each caller learns its own row's verdict; a failed commit
 * leaves every row's outcome unknown (every caller gets the error), not lost; when only the
 * second of a split batch's statements failed (FinishPartlyCommitted), the committed rows keep
 * their verdicts and only the others get the error.
 *
 * With lanes (DbLanes), a batch goes out only once a lane is free; the finishes that come while
 * it waits join it, so a worker whose statements queue sends fewer, fuller ones. A finish whose
 * lease leaves less than FINISH_BATCH_MIN_ROOM_MS goes at once, without a lane.
 */
export class FinishBatcher {
  private pending: Pending[] = [];
  private timer: NodeJS.Timeout | null = null;
  /** A batch is waiting for a lane: finishes that come now join it. */
  private waitingForLane = false;
  /** Fires when a waiting row's lease room runs short (armShortLeases), at shortAt (monotonic ms). */
  private shortTimer: NodeJS.Timeout | null = null;
  private shortAt = Infinity;

  constructor(
    private readonly db: Queryable,
    private readonly owner: string,
    private readonly windowMs = FINISH_BATCH_WINDOW_MS,
    private readonly lanes: DbLanes | null = null,
  ) {}

  finish(row: FinishRow, confirmedUntil: number): Promise<FinishVerdict> {
    const encoded = encodeFinishRow(row); // throws for this row alone
    return new Promise<FinishVerdict>((resolve, reject) => {
      const p = { row: encoded, confirmedUntil, resolve, reject };
      if (confirmedUntil - monotonicNow() < FINISH_BATCH_MIN_ROOM_MS) {
        void this.send([p]); // its lease is short: at once, no lane
        return;
      }
      if (this.windowMs <= 0) {
        void this.sendInLane(p);
        return;
      }
      this.pending.push(p);
      if (this.shortTimer && confirmedUntil - FINISH_BATCH_MIN_ROOM_MS < this.shortAt) this.armShortLeases();
      if (this.pending.length >= MAX_BATCH) this.flush();
      else this.timer ??= setTimeout(() => this.flush(), this.windowMs);
    });
  }

  flush(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    if (this.pending.length === 0) return;
    if (!this.lanes) {
      void this.send(this.pending.splice(0));
      return;
    }
    if (!this.waitingForLane) {
      const release = this.lanes.tryAcquire();
      if (release) {
        this.sendInHeldLane(release);
        return;
      }
    }
    if (!this.shortTimer) this.armShortLeases(); // a row joining later re-arms it when its lease is shorter (finish)
    if (this.waitingForLane) return; // these rows join the batch that goes when the lane comes
    this.waitingForLane = true;
    void this.lanes.acquire().then((release) => {
      this.waitingForLane = false;
      this.sendInHeldLane(release!);
    });
  }

  /** The waiting rows (up to MAX_BATCH) go in the lane `release` gives back; the rest are flushed again. */
  private sendInHeldLane(release: () => void): void {
    const batch = this.pending.splice(0, MAX_BATCH);
    this.armShortLeases();
    if (batch.length === 0) {
      release(); // every waiting row went at once, its lease short
      return;
    }
    if (this.pending.length > 0) this.flush();
    void this.send(batch).finally(release);
  }

  /**
   * While rows wait for a lane, the one whose lease room runs short first is sent then, at once and
   * without a lane, with every other waiting row as short by then: the keeper no longer extends a
   * finishing attempt, so a wait for a lane must never cost a lease.
   */
  private armShortLeases(): void {
    if (this.shortTimer) clearTimeout(this.shortTimer);
    this.shortTimer = null;
    this.shortAt = Infinity;
    if (this.pending.length === 0) return;
    let first = Infinity;
    for (const p of this.pending) first = Math.min(first, p.confirmedUntil);
    this.shortAt = first - FINISH_BATCH_MIN_ROOM_MS;
    this.shortTimer = setTimeout(
      () => {
        this.shortTimer = null;
        const cut = monotonicNow() + FINISH_BATCH_MIN_ROOM_MS;
        const short = this.pending.filter((p) => p.confirmedUntil <= cut);
        if (short.length > 0) {
          this.pending = this.pending.filter((p) => p.confirmedUntil > cut);
          for (let i = 0; i < short.length; i += MAX_BATCH) void this.send(short.slice(i, i + MAX_BATCH));
        }
        this.armShortLeases();
      },
      Math.max(0, this.shortAt - monotonicNow()),
    );
    this.shortTimer.unref(); // the statements in flight, not this timer, keep a worker alive
  }

  /** One finish alone (batching off), once a lane is free, or at once without one when its lease room runs short first. */
  private async sendInLane(p: Pending): Promise<void> {
    if (!this.lanes) return this.send([p]);
    let release = this.lanes.tryAcquire();
    if (!release) {
      const short = new AbortController();
      const timer = setTimeout(() => short.abort(), Math.max(0, p.confirmedUntil - FINISH_BATCH_MIN_ROOM_MS - monotonicNow()));
      try {
        release = await this.lanes.acquire(short.signal);
      } finally {
        clearTimeout(timer);
      }
    }
    try {
      await this.send([p]);
    } finally {
      release?.();
    }
  }

  private async send(batch: Pending[]): Promise<void> {
    try {
      const verdicts = await finishEncoded(
        this.db,
        this.owner,
        batch.map((p) => p.row),
      );
      const byId = new Map(verdicts.map((v) => [v.stageId, v]));
      for (const p of batch) {
        const v = byId.get(String(p.row.id));
        if (v) p.resolve(v);
        else p.reject(new Error(`finish returned no verdict for stage ${String(p.row.id)}`));
      }
    } catch (err) {
      if (err instanceof FinishPartlyCommitted) {
        // Rows the light statement committed keep their verdicts; the others' outcome is unknown.
        const byId = new Map(err.committed.map((v) => [v.stageId, v]));
        for (const p of batch) {
          const v = byId.get(String(p.row.id));
          if (v) p.resolve(v);
          else p.reject(err.cause);
        }
        return;
      }
      for (const p of batch) p.reject(err);
    }
  }
}
