import { createServer, type ApiServer } from '../../src/api/server.js';
import { createClient, type RatchetClient } from '../../src/client/index.js';
import type { Clock } from '../../src/client/clock.js';
import { createRatchet, type Ratchet, type RatchetOptions } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import { apiWorkflows } from './fixtures.js';

export const TOKEN = 'test-token-0123456789';

export interface Api {
  ratchet: Ratchet;
  server: ApiServer;
  client: RatchetClient;
  /** fetch against the server with the token (raw HTTP, for status codes and bodies). */
  http(path: string, init?: RequestInit & { token?: string | null }): Promise<{ status: number; headers: Headers; body: any }>;
  close(): Promise<void>;
}

/** A Ratchet on the given database (embedded in memory by default), the task API on a free loopback port, and a client. */
export async function startApi(
  opts: Partial<RatchetOptions> & {
    bodyLimit?: number;
    tokens?: string[];
    clock?: Clock;
    fetch?: typeof fetch;
    streamHeartbeatMs?: number;
  } = {},
): Promise<Api> {
  const { bodyLimit, tokens, clock, fetch: f, streamHeartbeatMs, ...ratchetOpts } = opts;
  const ratchet = await createRatchet({ dataDir: ':memory:', workflows: apiWorkflows, logger: silentLogger(), ...ratchetOpts });
  const server = await createServer({
    ratchet,
    tokens: tokens ?? [TOKEN],
    port: 0,
    ...(bodyLimit ? { bodyLimit } : {}),
    retryAfterSeconds: 2,
    ...(streamHeartbeatMs ? { streamHeartbeatMs } : {}),
  });
  const client = createClient({ baseUrl: server.url, token: TOKEN, ...(clock ? { clock } : {}), ...(f ? { fetch: f } : {}) });
  return {
    ratchet,
    server,
    client,
    async http(path, init = {}) {
      const { token = TOKEN, headers, ...rest } = init;
      const h = new Headers(headers);
      if (token !== null) h.set('authorization', `Bearer ${token}`);
      const res = await fetch(`${server.url}${path}`, { ...rest, headers: h });
      const text = await res.text();
      let body: unknown = text;
      try {
        body = JSON.parse(text);
      } catch {
        /* not JSON */
      }
      return { status: res.status, headers: res.headers, body };
    },
    async close() {
      await server.close();
      await ratchet.close();
    },
  };
}

/** Row counts that bad requests must leave unchanged. */
export async function counts(r: Ratchet): Promise<{ runs: number; stages: number; events: number }> {
  const [c] =
    await r.store.db.query(`SELECT (SELECT count(*) FROM ratchet.runs)::int AS runs, (SELECT count(*) FROM ratchet.stages)::int AS stages,
    (SELECT count(*) FROM ratchet.events)::int AS events`);
  return c as { runs: number; stages: number; events: number };
}

export async function until<T>(what: string, fn: () => Promise<T | null | undefined | false>, timeoutMs = 20_000): Promise<T> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** A clock for the poller: sleeping moves time forward at once and records the wait. */
export function fakeClock(start = 1_700_000_000_000): Clock & { sleeps: number[]; t: number } {
  const c = {
    t: start,
    sleeps: [] as number[],
    now: () => c.t,
    sleep: async (ms: number) => {
      c.sleeps.push(ms);
      c.t += ms;
      await new Promise((r) => setImmediate(r));
    },
  };
  return c;
}
