import { InvalidInputError, UnknownRunError } from '../errors.js';
import { TERMINAL_EVENT_TYPES, TERMINAL_RUN_STATES, type RunState } from '../planner/states.js';
import type { Queryable } from '../store/db.js';
import type { EventRow } from '../store/runs.js';
import { endCheck, eventPosition, readStreamBatch, STREAM_START, type StreamPosition } from '../store/stream.js';
import type { EventHub } from './hub.js';
import type { TokenDelta } from './tokens.js';

const isTerminalEvent = (type: string) => TERMINAL_EVENT_TYPES.includes(type);
const isTerminalState = (state: string) => TERMINAL_RUN_STATES.includes(state as RunState);
/** Run `runId`'s end check at `at`, one query for every watcher asking at once (hub.shared, single flight). */
const sharedEndCheck = (db: Queryable, hub: EventHub, runId: string, at: StreamPosition) =>
  hub.shared(`end ${runId} ${at.tx} ${at.id}`, () => endCheck(db, runId, at));
/** An end check that says the run is over at that point for good: terminal, and not retried after it. */
const overForGood = (c: { state: string; retriedAfter: boolean } | null): boolean =>
  c !== null && isTerminalState(c.state) && !c.retriedAfter;

export const DEFAULT_HEARTBEAT_MS = 15_000;
const BATCH = 500;
/** Held-back events (a transaction still running) are read again after this, doubling up to the max. */
const HELD_BACK_FIRST_MS = 10;
const HELD_BACK_MAX_MS = 250;

export type StreamedEvent = EventRow & { position: StreamPosition };
export type StreamItem = { kind: 'event'; event: StreamedEvent } | { kind: 'heartbeat' } | { kind: 'token'; token: TokenDelta };
/**
 * The stream as the server sends it (openRunStreamChunks): the events of one read together, so a
 * watcher costs one hop and one write per read, not per event. The array is shared by the
 * watchers that took the same events (the feed hands them the same one): read it, never change it.
 */
export type StreamChunk =
  | { kind: 'events'; events: readonly StreamedEvent[] }
  | { kind: 'heartbeat' }
  | { kind: 'token'; token: TokenDelta };
/** Streamed pieces waiting for a slow watcher, at most: older ones are dropped (they are best effort). */
const MAX_PENDING_TOKENS = 1000;

export interface RunStreamOptions {
  /** Resume after this event id (Last-Event-ID): it must be an event of this run. */
  afterEventId?: string;
  /** A heartbeat item after this long without events (default 15 s); the run is also re-read then. */
  heartbeatMs?: number;
  signal?: AbortSignal;
}

/**
 * Opens run `runId`'s stream (see streamRun), one item per event, or null when there is nothing
 * left to send: the run is over and the resume point is at or after its end. Throws
 * UnknownRunError for an unknown run and InvalidInputError (path Last-Event-ID) for a resume id
 * that is not one of its events, before anything is sent.
 */
export async function openRunStream(
  db: Queryable,
  hub: EventHub,
  runId: string,
  opts: RunStreamOptions = {},
): Promise<AsyncGenerator<StreamItem, void> | null> {
  const chunks = await openRunStreamChunks(db, hub, runId, opts);
  return chunks && eachEvent(chunks);
}

/** One item per event (a for-await loop closes `chunks` when its consumer stops early). */
async function* eachEvent(chunks: AsyncGenerator<StreamChunk, void>): AsyncGenerator<StreamItem, void> {
  for await (const c of chunks) {
    if (c.kind === 'events') for (const event of c.events) yield { kind: 'event', event };
    else yield c;
  }
}

/** openRunStream with the events of one read in one item (what the SSE route sends: one write per read). */
export async function openRunStreamChunks(
  db: Queryable,
  hub: EventHub,
  runId: string,
  opts: RunStreamOptions = {},
): Promise<AsyncGenerator<StreamChunk, void> | null> {
  let position = STREAM_START;
  if (opts.afterEventId !== undefined) {
    const p = await eventPosition(db, runId, opts.afterEventId);
    if (!p) {
      const start = STREAM_START;
      if (!(await sharedEndCheck(db, hub, runId, start))) throw new UnknownRunError(runId);
      throw new InvalidInputError(`event ${opts.afterEventId} is not an event of run ${runId}`, 'Last-Event-ID');
    }
    position = p;
  }
  // Opens arriving together (a page of watchers reconnecting) share these reads (hub.shared, single flight).
  const at = position;
  const before = await sharedEndCheck(db, hub, runId, at);
  if (!before) throw new UnknownRunError(runId);
  if (overForGood(before)) {
    const rest = await hub.shared(`rest ${runId} ${at.tx} ${at.id}`, () => readStreamBatch(db, runId, at, 1));
    if (rest.events.length === 0 && !rest.heldBack) return null;
  }
  return streamRun(db, hub, runId, position, opts, before);
}

/** Stream order: (tx, id) as numbers (xid8 and bigint, as decimal text). */
function comparePositions(a: StreamPosition, b: StreamPosition): number {
  if (a.tx !== b.tx) return BigInt(a.tx) < BigInt(b.tx) ? -1 : 1;
  if (a.id === b.id) return 0;
  return BigInt(a.id) < BigInt(b.id) ? -1 : 1;
}

/** Events a shared feed keeps behind its slowest follower, at most (older ones: followers read them themselves). */
const FEED_MAX = 2000;
/** Followers a feed wakes per turn of the event loop after a read (see RunFeed.wakeFollowers). */
const WAKE_SLICE = 10;
/** Events a shared feed keeps however far its followers are, so a watcher reconnecting near the head joins at once. */
const FEED_KEEP = 64;

/** A watcher of a run as its feed sees it (see RunFeed). */
interface Follower {
  /** The absolute index (RunFeed.first based) of the next buffered event this watcher takes; null: not joined. */
  next: number | null;
  /** Waiting ahead of the feed's head for its read (join said 'ahead'). */
  ahead?: boolean;
  wake(): void;
  fail(err: Error): void;
}

/**
 * The shared reader of one run's stream in one process: one read per notification, fanned out to
 * every watcher of the run standing in its window. It holds the run's events (base, head] in stream
 * order, exactly as readStreamBatch returns them (a read from a position gives every final event
 * after it, in order, so a buffer grown by reads from its own head is the stream's contiguous
 * piece). A watcher at a position inside that window takes the buffered events after it; a watcher
 * behind it (a replay, a Last-Event-ID reconnect) reads on its own until it reaches the window, then
 * joins. Held-back reads are retried by the feed once for all.
 */
class RunFeed {
  /** The position before buffer[0]. */
  base: StreamPosition;
  /** The position of the last buffered event (base when empty): the feed reads after it. */
  head: StreamPosition;
  buffer: StreamedEvent[] = [];
  /** The absolute index of buffer[0]. */
  first = 0;
  /**
   * Terminal events whose run was found ended (and not retried) when the feed read them, with the
   * count of notifications before that check: a watcher taking one after another notification (a
   * run_retried the feed has not read yet) checks again (see endsHere).
   */
  readonly ended = new WeakMap<StreamedEvent, number>();
  /** Notifications received for the run. */
  private notes = 0;
  /** A notification (or held-back retry) came while nobody wanted a read: read when a follower joins. */
  private missed = false;
  readonly followers = new Set<Follower>();
  private reading = false;
  private again = false;
  private heldBackMs = HELD_BACK_FIRST_MS;
  private heldBackTimer: NodeJS.Timeout | null = null;
  private readonly unsubscribe: () => void;
  closed = false;

  constructor(
    private readonly db: Queryable,
    hub: EventHub,
    private readonly runId: string,
    at: StreamPosition,
    private readonly onEmpty: () => void,
  ) {
    this.base = at;
    this.head = at;
    this.unsubscribe = hub.subscribe(runId, () => {
      this.notes++;
      this.pump();
    });
  }

  attach(f: Follower): void {
    this.followers.add(f);
  }

  detach(f: Follower): void {
    this.followers.delete(f);
    if (this.followers.size > 0) return;
    this.closed = true;
    this.unsubscribe();
    if (this.heldBackTimer) clearTimeout(this.heldBackTimer);
    this.onEmpty();
  }

  /**
   * Joins follower `f` standing at `at` when `at` lies in the window [base, head]: 'joined', and
   * f.next points at the first buffered event after `at`. Behind the window: 'behind' (read on your
   * own). Ahead of it (the watcher read further on its own): the window moves there when nobody is
   * joined and no read is running ('joined'), else 'ahead': a read is asked for, wait for its wake.
   */
  join(f: Follower, at: StreamPosition): 'joined' | 'behind' | 'ahead' {
    f.ahead = false;
    if (comparePositions(at, this.base) < 0) return 'behind';
    if (comparePositions(at, this.head) > 0) {
      let joined = false;
      for (const o of this.followers) if (o.next !== null) joined = true;
      if (joined || this.reading) {
        f.ahead = true;
        this.pump();
        return 'ahead';
      }
      this.first += this.buffer.length;
      this.buffer = [];
      this.base = at;
      this.head = at;
      f.next = this.first;
    } else {
      let i = this.buffer.length;
      while (i > 0 && comparePositions(this.buffer[i - 1]!.position, at) > 0) i--;
      f.next = this.first + i;
    }
    // Notifications that came while nobody was joined were not read: read now, from here.
    if (this.missed) this.pump();
    return 'joined';
  }

  /** Someone wants the feed to read: a joined follower, or one waiting ahead of the head. */
  private wanted(): boolean {
    for (const f of this.followers) if (f.next !== null || f.ahead) return true;
    return false;
  }

  /**
   * Whether a watcher taking terminal event `e` (marked in `ended`) may end on it without asking
   * again: no notification came since the feed's check and no read is running (a run_retried
   * committed since would come with one, before the feed reads it).
   */
  settled(e: StreamedEvent): boolean {
    return !this.reading && this.ended.get(e) === this.notes;
  }

  /**
   * The buffered events follower `f` has not taken yet (and takes them); null when it fell out of
   * the window. Followers taking the same events get the same array (indexes are absolute and
   * never reused, so (from, to) names the same events for as long as they are buffered).
   */
  take(f: Follower): readonly StreamedEvent[] | null {
    if (f.next === null || f.next < this.first) {
      f.next = null;
      return null;
    }
    const from = f.next;
    const to = this.first + this.buffer.length;
    f.next = to;
    const last = this.lastTake;
    if (last && last.from === from && last.to === to) return last.events;
    const events = this.buffer.slice(from - this.first);
    this.lastTake = { from, to, events };
    return events;
  }
  private lastTake: { from: number; to: number; events: readonly StreamedEvent[] } | null = null;

  /** Reads after the head (single flight: a wake during a read reads once more after it), then wakes every follower. */
  pump(): void {
    if (this.closed) return;
    // Nobody at the head (the first watcher still replaying the history on its own): reading now
    // would read that history for nobody. The first follower to join reads from where it stands.
    if (!this.wanted()) {
      this.missed = true;
      return;
    }
    this.missed = false;
    if (this.reading) {
      this.again = true;
      return;
    }
    this.reading = true;
    void this.readLoop();
  }

  private async readLoop(): Promise<void> {
    try {
      do {
        this.again = false;
        this.missed = false;
        const batch = await readStreamBatch(this.db, this.runId, this.head, BATCH);
        for (const e of batch.events) {
          if (e.type === 'run_retried') for (const old of this.buffer) this.ended.delete(old);
          if (isTerminalEvent(e.type)) {
            const notes = this.notes;
            const now = await endCheck(this.db, this.runId, e.position);
            if (overForGood(now)) this.ended.set(e, notes);
          }
          this.buffer.push(e);
          this.head = e.position;
        }
        this.trim();
        if (batch.full) this.again = true;
        if (batch.heldBack) {
          if (!this.heldBackTimer) {
            this.heldBackTimer = setTimeout(() => {
              this.heldBackTimer = null;
              this.pump();
            }, this.heldBackMs);
            this.heldBackTimer.unref();
          }
          this.heldBackMs = Math.min(this.heldBackMs * 2, HELD_BACK_MAX_MS);
        } else {
          this.heldBackMs = HELD_BACK_FIRST_MS;
        }
        this.wakeFollowers();
        if (this.again && !this.wanted()) {
          this.again = false;
          this.missed = true;
        }
      } while (this.again && !this.closed);
    } catch (err) {
      for (const f of this.followers) f.fail(err as Error);
    } finally {
      this.reading = false;
    }
  }

  /** Followers woken but not yet (see wakeFollowers), in order. */
  private readonly toWake = new Set<Follower>();
  private waking = false;

  /**
   * Wakes every follower after a read, WAKE_SLICE per turn of the event loop: each wake ends in
   * that watcher's socket write (a syscall, tens of µs on a busy machine), and 50 of them in one
   * go would hold up for milliseconds whatever else the process does (a worker's next stage, in
   * `ratchet dev` or a serve beside a worker). Between slices, I/O that came in is handled first.
   * A follower woken late takes the same events (the feed keeps them until it has) and more if
   * another read came meanwhile.
   */
  private wakeFollowers(): void {
    for (const f of this.followers) this.toWake.add(f);
    if (this.waking) return;
    this.waking = true;
    const step = () => {
      let n = 0;
      for (const f of this.toWake) {
        if (n++ === WAKE_SLICE) break;
        this.toWake.delete(f);
        f.wake();
      }
      if (this.toWake.size > 0 && !this.closed) setImmediate(step);
      else {
        this.toWake.clear();
        this.waking = false;
      }
    };
    step();
  }

  /** Drops the events every joined follower has taken (keeping the last FEED_KEEP), and beyond FEED_MAX whatever the followers. */
  private trim(): void {
    let upTo = this.first + this.buffer.length;
    for (const f of this.followers) if (f.next !== null && f.next >= this.first) upTo = Math.min(upTo, f.next);
    upTo = Math.min(upTo, this.first + this.buffer.length - FEED_KEEP);
    upTo = Math.max(upTo, this.first + this.buffer.length - FEED_MAX);
    const drop = upTo - this.first;
    if (drop <= 0) return;
    this.base = this.buffer[drop - 1]!.position;
    this.buffer = this.buffer.slice(drop);
    this.first = upTo;
  }
}

/** The feeds of the runs being watched, per hub (one per API process). */
const feedsOf = new WeakMap<EventHub, Map<string, RunFeed>>();
function feedFor(db: Queryable, hub: EventHub, runId: string, at: StreamPosition): RunFeed {
  let feeds = feedsOf.get(hub);
  if (!feeds) feedsOf.set(hub, (feeds = new Map()));
  let feed = feeds.get(runId);
  if (!feed || feed.closed) {
    const f: RunFeed = new RunFeed(db, hub, runId, at, () => {
      if (feeds.get(runId) === f) feeds.delete(runId);
    });
    feeds.set(runId, f);
    feed = f;
  }
  return feed;
}

/**
 * A run's events as they are committed, in stream order ((tx, id): see src/store/stream.sql.ts),
 * each once, from `position` on; ends after the run's terminal event, or when the run is found
 * over with nothing left to send. Heartbeat items fill silences. Standing at the head, a watcher
 * takes its events from the run's shared feed (one read per notification for all watchers);
 * behind it, and on its first read and after each quiet heartbeat (when it also asks whether the
 * run is over), it reads on its own.
 */
async function* streamRun(
  db: Queryable,
  hub: EventHub,
  runId: string,
  start: StreamPosition,
  opts: RunStreamOptions,
  /** openRunStream's end check at `start`: the first read's, not asked again. */
  opened: { state: string; retriedAfter: boolean },
): AsyncGenerator<StreamChunk, void> {
  let openedCheck: typeof opened | null = opened;
  const heartbeatMs = opts.heartbeatMs ?? DEFAULT_HEARTBEAT_MS;
  let position = start;
  let dirty = true;
  let failure: Error | null = null;
  let wakeUp: (() => void) | null = null;
  const wake = () => {
    dirty = true;
    wakeUp?.();
  };
  const follower: Follower = {
    next: null,
    wake,
    fail: (err) => {
      failure = err;
      wakeUp?.();
    },
  };
  const feed = feedFor(db, hub, runId, start);
  feed.attach(follower);
  // Streamed model tokens: yielded as they come, between events; they wake the loop without a read.
  const tokens: TokenDelta[] = [];
  const unsubscribeTokens = hub.subscribeTokens(runId, (t) => {
    if (tokens.length >= MAX_PENDING_TOKENS) tokens.shift();
    tokens.push(t);
    wakeUp?.();
  });
  const stop = () => wakeUp?.();
  opts.signal?.addEventListener('abort', stop);
  hub.closed.addEventListener('abort', stop);
  const over = () => opts.signal?.aborted === true || hub.closed.aborted;
  try {
    let checkEnd = true; // first read, and after each quiet heartbeat: a run may be over already
    let heldBackMs = HELD_BACK_FIRST_MS;
    while (!over()) {
      while (tokens.length > 0) yield { kind: 'token', token: tokens.shift()! };
      if (failure) throw failure;
      if (dirty) {
        dirty = false;
        let place: 'joined' | 'behind' | 'ahead' = 'behind';
        let shared: readonly StreamedEvent[] | null = null;
        if (!checkEnd) {
          place = follower.next !== null ? 'joined' : feed.join(follower, position);
          if (place === 'joined') {
            shared = feed.take(follower);
            if (!shared) place = 'behind'; // fell out of the feed's window (a slow watcher)
          }
        }
        if (shared) {
          // The taken events in one chunk (the feed's own array), cut after each terminal event the
          // feed found ended: the stream may end there.
          let from = 0;
          for (let k = 0; k < shared.length; k++) {
            const e = shared[k]!;
            if (!(isTerminalEvent(e.type) && feed.ended.has(e))) continue;
            position = e.position;
            yield { kind: 'events', events: from === 0 && k === shared.length - 1 ? shared : shared.slice(from, k + 1) };
            from = k + 1;
            if (feed.settled(e)) return;
            // A notification since the feed's check (or a read running): a run_retried may be
            // committed and not read yet. Ask again, once for all the run's watchers.
            const at2 = e.position;
            const now = await sharedEndCheck(db, hub, runId, at2);
            if (overForGood(now)) return;
          }
          if (from < shared.length) {
            position = shared[shared.length - 1]!.position;
            yield { kind: 'events', events: from === 0 ? shared : shared.slice(from) };
          }
        } else if (place === 'ahead') {
          // Ahead of the feed, which is reading: its read wakes this watcher.
        } else {
          follower.next = null; // an own read moves past what the feed would hand this watcher
          follower.ahead = false;
          const at = position;
          const before = !checkEnd ? null : (openedCheck ?? (await sharedEndCheck(db, hub, runId, at)));
          openedCheck = null;
          if (checkEnd && !before) throw new UnknownRunError(runId);
          const batch = await hub.shared(`read ${runId} ${at.tx} ${at.id}`, () => readStreamBatch(db, runId, at, BATCH));
          // One chunk, cut after each terminal event: the stream may end there.
          const events = batch.events;
          let from = 0;
          for (let k = 0; k < events.length; k++) {
            const e = events[k]!;
            if (!isTerminalEvent(e.type) && k < events.length - 1) continue;
            position = e.position;
            yield { kind: 'events', events: from === 0 && k === events.length - 1 ? events : events.slice(from, k + 1) };
            from = k + 1;
            if (isTerminalEvent(e.type)) {
              const at2 = position;
              const now = await sharedEndCheck(db, hub, runId, at2);
              if (overForGood(now)) return;
            }
          }
          if (checkEnd && overForGood(before) && batch.events.length === 0 && !batch.heldBack) return;
          checkEnd = false;
          if (batch.heldBack) {
            setTimeout(wake, heldBackMs).unref();
            heldBackMs = Math.min(heldBackMs * 2, HELD_BACK_MAX_MS);
          } else {
            heldBackMs = HELD_BACK_FIRST_MS;
            dirty = true; // caught up as far as this read goes: join the feed (or read on)
          }
        }
        if (dirty) continue;
      }
      const woken = await new Promise<boolean>((resolve) => {
        const t = setTimeout(() => resolve(false), heartbeatMs);
        wakeUp = () => {
          clearTimeout(t);
          resolve(true);
        };
        if (dirty || over() || tokens.length > 0 || failure) wakeUp();
      });
      wakeUp = null;
      if (!woken && !over()) {
        yield { kind: 'heartbeat' };
        dirty = true;
        checkEnd = true;
      }
    }
  } finally {
    feed.detach(follower);
    unsubscribeTokens();
    opts.signal?.removeEventListener('abort', stop);
    hub.closed.removeEventListener('abort', stop);
  }
}
