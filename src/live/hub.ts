import { setMaxListeners } from 'node:events';
import type { Logger } from 'pino';
import type { Db } from '../store/db.js';
import type { Listener } from '../store/listener.js';
import { eventsSince, lastEventId } from '../store/stream.js';
import { decodeToken, onLocalTokens, TOKENS_CHANNEL, type TokenDelta } from './tokens.js';

/** The channel migration 0004's trigger notifies, once per statement per run (payload: the run id). */
export const EVENTS_CHANNEL = 'ratchet_events';
/** How often the embedded store is polled for new events while someone watches (no LISTEN there). */
export const DEFAULT_POLL_MS = 200;

export interface EventHub {
  /** 'listen': PostgreSQL LISTEN/NOTIFY; 'poll': one shared poll (embedded PGlite). */
  readonly mode: 'listen' | 'poll';
  /**
   * Calls `wake` whenever run `runId` may have new events: a notification for it, the
   * listening connection (re)established, or the poll finding some. A wake is only a hint
   * to read the table; it carries no data. Returns the unsubscribe.
   */
  subscribe(runId: string, wake: () => void): () => void;
  /**
   * Single flight: while a read under `key` is in flight, callers asking for the same key share
   * its answer (streams opening together, quiet-heartbeat checks). The reads that follow
   * notifications are shared by the run's feed instead (src/live/run-stream.ts): one per
   * notification however many watchers, whenever each gets to it.
   */
  shared<T>(key: string, read: () => Promise<T>): Promise<T>;
  /**
   * Calls `fn` with each streamed piece of a model answer of run `runId` (src/live/tokens.ts):
   * NOTIFY on `ratchet_tokens` (PostgreSQL) or the in-process bus (PGlite). Returns the unsubscribe.
   */
  subscribeTokens(runId: string, fn: (t: TokenDelta) => void): () => void;
  /** Aborted when the hub closes: streams end. */
  readonly closed: AbortSignal;
  close(): Promise<void>;
}

/**
 * One per API process: a single LISTEN connection (or a single poll) fanned out to every
 * watcher of every run, so 50 watchers cost one connection, not 50. Opened at the first
 * subscription, kept until close().
 */
export function createEventHub(db: Db, opts: { logger?: Logger; pollMs?: number } = {}): EventHub {
  const subscribers = new Map<string, Set<() => void>>();
  const ac = new AbortController();
  setMaxListeners(0, ac.signal); // every open stream listens for the hub's close
  const log = opts.logger?.child({ component: 'event-hub' });
  const wakeRun = (runId: string) => {
    for (const w of subscribers.get(runId) ?? []) w();
  };
  const wakeAll = () => {
    for (const set of subscribers.values()) for (const w of set) w();
  };

  let listener: Listener | null = null;
  let pollTimer: NodeJS.Timeout | null = null;
  let pollLastId: string | null = null;
  const mode = db.listen ? 'listen' : 'poll';

  const poll = async () => {
    pollTimer = null;
    if (ac.signal.aborted || subscribers.size === 0) return;
    try {
      if (pollLastId === null) {
        pollLastId = await lastEventId(db);
        wakeAll(); // whatever came before the poll started, each watcher reads it itself
      } else {
        const r = await eventsSince(db, pollLastId, [...subscribers.keys()]);
        pollLastId = r.lastId;
        for (const id of r.runIds) wakeRun(id);
      }
    } catch (err) {
      log?.warn({ event: 'stream_poll_failed', err: (err as Error).message }, 'polling for events failed; trying again');
    }
    schedulePoll();
  };
  const schedulePoll = () => {
    if (pollTimer || ac.signal.aborted || subscribers.size === 0) return;
    pollTimer = setTimeout(() => void poll(), opts.pollMs ?? DEFAULT_POLL_MS);
    pollTimer.unref();
  };

  const start = () => {
    if (mode === 'poll') return schedulePoll();
    listener ??= db.listen!(EVENTS_CHANNEL, {
      notify: wakeRun,
      connected: () => {
        log?.debug({ event: 'stream_listening', channel: EVENTS_CHANNEL }, 'listening for events');
        wakeAll();
      },
      lost: (err, retryInMs) =>
        log?.warn({ event: 'stream_listen_lost', err: err.message, retryInMs }, 'the LISTEN connection failed; reconnecting'),
    });
  };

  // Streamed model tokens (not events): a second LISTEN, opened at the first token subscriber.
  const tokenSubscribers = new Map<string, Set<(t: TokenDelta) => void>>();
  let tokenSource: { close(): Promise<void> | void } | null = null;
  const deliverToken = (t: TokenDelta | null) => {
    if (!t) return;
    for (const fn of tokenSubscribers.get(t.runId) ?? []) fn(t);
  };
  const startTokens = () => {
    if (tokenSource) return;
    if (mode === 'poll') {
      const off = onLocalTokens(deliverToken);
      tokenSource = { close: off };
      return;
    }
    tokenSource = db.listen!(TOKENS_CHANNEL, {
      notify: (payload) => deliverToken(decodeToken(payload)),
      connected: () => log?.debug({ event: 'tokens_listening', channel: TOKENS_CHANNEL }, 'listening for model tokens'),
      lost: (err, retryInMs) =>
        log?.warn({ event: 'tokens_listen_lost', err: err.message, retryInMs }, 'the token LISTEN connection failed; reconnecting'),
    });
  };

  const inFlight = new Map<string, Promise<unknown>>();
  return {
    mode,
    closed: ac.signal,
    shared<T>(key: string, read: () => Promise<T>): Promise<T> {
      const running = inFlight.get(key) as Promise<T> | undefined;
      if (running) return running;
      const p = read().finally(() => inFlight.delete(key));
      inFlight.set(key, p);
      return p;
    },
    subscribe(runId, wake) {
      if (ac.signal.aborted) return () => {};
      let set = subscribers.get(runId);
      if (!set) subscribers.set(runId, (set = new Set()));
      set.add(wake);
      start();
      return () => {
        set.delete(wake);
        if (set.size === 0 && subscribers.get(runId) === set) subscribers.delete(runId);
      };
    },
    subscribeTokens(runId, fn) {
      if (ac.signal.aborted) return () => {};
      let set = tokenSubscribers.get(runId);
      if (!set) tokenSubscribers.set(runId, (set = new Set()));
      set.add(fn);
      startTokens();
      return () => {
        set.delete(fn);
        if (set.size === 0 && tokenSubscribers.get(runId) === set) tokenSubscribers.delete(runId);
      };
    },
    async close() {
      ac.abort();
      if (pollTimer) clearTimeout(pollTimer);
      subscribers.clear();
      tokenSubscribers.clear();
      await Promise.all([listener?.close(), tokenSource?.close()]);
    },
  };
}
