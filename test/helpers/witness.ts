import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import pg from 'pg';
import { createFenceGuard, type GuardVerdict } from '../../src/receiver/index.js';

export interface WitnessRequest {
  key: string;
  fence: string;
  verdict: GuardVerdict;
  body: unknown;
  at: number;
  /** The W3C trace context the tool sent (ctx.traceparent), or null. */
  traceparent: string | null;
}
export interface Observation {
  [k: string]: unknown;
  at: number;
}

export interface Witness {
  url: string;
  /** Every effect request in arrival order, with the guard's verdict. */
  requests: WitnessRequest[];
  /** Everything tools reported through POST /observe. */
  observations: Observation[];
  /** Effects applied per key (counted in the receiver's own table, the ground truth). */
  appliedPerKey(): Promise<Map<string, number>>;
  waitFor<T>(pred: () => T | undefined | false, timeoutMs?: number, what?: string): Promise<T>;
  /** No request was applied with a fence lower than one already seen for its key. */
  staleAccepted(): WitnessRequest[];
  close(): Promise<void>;
}

async function body(req: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  const text = Buffer.concat(chunks).toString();
  return text ? JSON.parse(text) : null;
}

/**
 * The witness: a fenced test receiver on loopback over a real PostgreSQL database. Tools in
 * fault tests send their irreversible requests here (Idempotency-Key + X-Execution-Fence);
 * it records every request and its verdict, so tests count effects, not log lines.
 */
export async function startWitness(databaseUrl: string): Promise<Witness> {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 8 });
  pool.on('error', () => {});
  const guard = createFenceGuard(pool);
  await guard.migrate();
  await pool.query(
    'CREATE TABLE IF NOT EXISTS witness_effects (id serial primary key, key text not null, fence bigint not null, body jsonb)',
  );
  const requests: WitnessRequest[] = [];
  const observations: Observation[] = [];

  const server: Server = createServer((req, res) => {
    void (async () => {
      try {
        const url = new URL(req.url ?? '/', 'http://x');
        const reply = (status: number, b: unknown) => {
          res.writeHead(status, { 'content-type': 'application/json' });
          res.end(JSON.stringify(b));
        };
        if (req.method === 'POST' && url.pathname === '/effect') {
          const key = String(req.headers['idempotency-key'] ?? '');
          const fence = String(req.headers['x-execution-fence'] ?? '');
          const b = await body(req);
          const result = await guard.run(key, fence, async (tx) => {
            await tx.query('INSERT INTO witness_effects (key, fence, body) VALUES ($1, $2, $3)', [key, fence, JSON.stringify(b)]);
            return { status: 201, body: { applied: true, fence } };
          });
          const traceparent = typeof req.headers.traceparent === 'string' ? req.headers.traceparent : null;
          requests.push({ key, fence, verdict: result.verdict, body: b, at: Date.now(), traceparent });
          return reply(result.status, result.body);
        }
        if (req.method === 'GET' && url.pathname.startsWith('/effect/')) {
          const key = decodeURIComponent(url.pathname.slice('/effect/'.length));
          const { rows } = await pool.query('SELECT fence::text AS fence FROM witness_effects WHERE key = $1', [key]);
          observations.push({ kind: 'reconcile_lookup', key, found: rows.length > 0, at: Date.now() });
          return reply(200, { exists: rows.length > 0, fence: rows[0]?.fence ?? null });
        }
        if (req.method === 'POST' && url.pathname === '/observe') {
          observations.push({ ...((await body(req)) as object), at: Date.now() });
          return reply(204, null);
        }
        reply(404, { error: 'not_found' });
      } catch (err) {
        res.writeHead(500);
        res.end(String(err));
      }
    })();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;

  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    observations,
    async appliedPerKey() {
      const { rows } = await pool.query('SELECT key, count(*)::int AS n FROM witness_effects GROUP BY key');
      return new Map(rows.map((r) => [r.key as string, r.n as number]));
    },
    async waitFor(pred, timeoutMs = 30_000, what = 'condition') {
      const until = Date.now() + timeoutMs;
      for (;;) {
        const v = pred();
        if (v) return v;
        if (Date.now() > until) throw new Error(`witness: timed out waiting for ${what}`);
        await new Promise((r) => setTimeout(r, 25));
      }
    },
    staleAccepted() {
      const highest = new Map<string, bigint>();
      const bad: WitnessRequest[] = [];
      for (const r of requests) {
        const f = BigInt(r.fence);
        const h = highest.get(r.key);
        if (r.verdict === 'applied' && h !== undefined && f < h) bad.push(r);
        if (h === undefined || f > h) highest.set(r.key, f);
      }
      return bad;
    },
    async close() {
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
      await pool.end();
    },
  };
}
