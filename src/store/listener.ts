import pg from 'pg';

/** A LISTEN on one channel over a connection of its own (see createPgListener). */
export interface Listener {
  close(): Promise<void>;
}

export interface ListenHandlers {
  /** A notification's payload. */
  notify(payload: string): void;
  /**
   * The connection was (re)established and LISTEN is in place. Notifications sent while it
   * was down are lost, so a listener re-reads what it cares about here.
   */
  connected(): void;
  /** The connection failed; it is tried again after `retryInMs`. */
  lost(err: Error, retryInMs: number): void;
}

const MIN_RETRY_MS = 250;
const MAX_RETRY_MS = 5000;

/**
 * LISTEN `channel` on one pg.Client outside the pool (a pooled connection would be handed to
 * others, and a LISTEN must stay put). A broken connection is replaced, with a growing pause
 * (250 ms doubling to 5 s), until close().
 */
export function createPgListener(config: pg.ClientConfig, channel: string, on: ListenHandlers): Listener {
  let client: pg.Client | null = null;
  let closed = false;
  let retryMs = MIN_RETRY_MS;
  let timer: NodeJS.Timeout | null = null;

  const schedule = (err: Error) => {
    if (closed || timer) return;
    const wait = retryMs;
    retryMs = Math.min(retryMs * 2, MAX_RETRY_MS);
    on.lost(err, wait);
    timer = setTimeout(() => {
      timer = null;
      void connect();
    }, wait);
    timer.unref();
  };

  const connect = async () => {
    if (closed) return;
    const c = new pg.Client({ ...config, keepAlive: true });
    client = c;
    const fail = (err: Error) => {
      if (client === c) client = null;
      c.removeAllListeners('notification');
      c.on('error', () => {});
      c.end().catch(() => {});
      schedule(err);
    };
    c.on('error', fail);
    c.on('end', () => {
      if (client === c && !closed) fail(new Error('the LISTEN connection ended'));
    });
    c.on('notification', (n) => {
      if (n.channel === channel) on.notify(n.payload ?? '');
    });
    try {
      await c.connect();
      await c.query(`LISTEN ${pg.escapeIdentifier(channel)}`);
    } catch (err) {
      fail(err as Error);
      return;
    }
    if (closed) {
      await c.end().catch(() => {});
      return;
    }
    retryMs = MIN_RETRY_MS;
    on.connected();
  };

  void connect();
  return {
    async close() {
      closed = true;
      if (timer) clearTimeout(timer);
      const c = client;
      client = null;
      if (c) await c.end().catch(() => {});
    },
  };
}
