import { createHash } from 'node:crypto';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import pg from 'pg';
import { createFenceGuard } from '../src/receiver/index.js';
import type { EffectRow, LedgerRow } from './history.js';

/**
 * The soak's downstream service: the project's own fence guard (`ratchet/receiver`) over its
 * own database in the private cluster (so a PostgreSQL restart hits it too), with a ledger of
 * every request in arrival order (key, fence, worker, verdict). Each applied effect also
 * writes a row of its own table in the guard's transaction: the ground truth the checker
 * counts. `cutAfterNext` arms the "answer lost after the effect" fault for one worker (it fires
 * only on an `applied` verdict: the effect happened and its answer is lost); `failNextAbove`
 * arms the late-request fault.
 */
export interface ChaosReceiver {
  readonly url: string;
  readonly ledger: LedgerRow[];
  /**
   * The next effect request from `worker`: once the guard has answered (the effect is applied
   * or replayed), `cut` runs before the answer is written, so the answer is lost on a link
   * `cut` black-holes. Resolves true when it fired, false after `timeoutMs` without a request.
   */
  cutAfterNext(worker: string, cut: () => void, timeoutMs: number): Promise<boolean>;
  /**
   * The late-request fault's second half: the next request for `key` with a fence above
   * `fence` (the new owner's) is admitted by the guard and answered 503 by the handler, so the
   * guard keeps its fence with the key still open; then the held older request is refused
   * stale_fence. Resolves true once that answer was given, false after `timeoutMs`.
   */
  failNextAbove(key: string, fence: string, timeoutMs: number): Promise<boolean>;
  effects(): Promise<EffectRow[]>;
  close(): Promise<void>;
}

async function readBody(req: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  return Buffer.concat(chunks).toString();
}

const reply = (res: ServerResponse, status: number, body: unknown) => {
  if (res.destroyed) return;
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
};

export async function startReceiver(databaseUrl: string): Promise<ChaosReceiver> {
  const pool = new pg.Pool({ connectionString: databaseUrl, max: 12, connectionTimeoutMillis: 2000, query_timeout: 5000 });
  pool.on('error', () => {});
  const guard = createFenceGuard(pool);
  await guard.migrate();
  await pool.query(`CREATE TABLE IF NOT EXISTS chaos_effects (
    id bigserial PRIMARY KEY, key text NOT NULL, fence bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`);
  const ledger: LedgerRow[] = [];
  const flakySeen = new Set<string>();
  const cuts = new Map<string, { cut: () => void; fired: (v: boolean) => void }>();
  const failing = new Map<string, { fence: bigint; fired: (v: boolean) => void }>();
  let seq = 0;

  const server = createServer((req, res) => {
    void (async () => {
      const path = new URL(req.url ?? '/', 'http://x').pathname;
      if (req.method === 'POST' && path === '/flaky') {
        const { key } = JSON.parse(await readBody(req)) as { key: string };
        const fail = !flakySeen.has(key);
        flakySeen.add(key);
        return reply(res, 200, { fail });
      }
      if (req.method !== 'POST' || path !== '/effect') return reply(res, 404, { error: 'not_found' });
      const row: LedgerRow = {
        seq: ++seq,
        arrivedAt: Date.now(),
        answeredAt: null,
        key: String(req.headers['idempotency-key'] ?? ''),
        fence: String(req.headers['x-execution-fence'] ?? ''),
        worker: String(req.headers['x-chaos-worker'] ?? ''),
        verdict: 'pending',
        status: null,
      };
      ledger.push(row);
      const raw = await readBody(req);
      let status: number;
      let body: unknown;
      const fail = failing.get(row.key);
      const failThis = fail !== undefined && /^\d+$/.test(row.fence) && BigInt(row.fence) > fail.fence;
      if (failThis) failing.delete(row.key);
      try {
        const fingerprint = createHash('sha256').update(raw).digest('hex');
        const result = await guard.run(
          row.key,
          row.fence,
          async (tx) => {
            if (failThis) return { status: 503, body: { error: 'chaos_late_request', message: 'admitted, answered 503 on purpose' } };
            await tx.query('INSERT INTO chaos_effects (key, fence) VALUES ($1, $2)', [row.key, row.fence]);
            return { status: 201, body: { applied: true, fence: row.fence } };
          },
          { fingerprint },
        );
        row.verdict = result.verdict;
        ({ status, body } = result);
      } catch (err) {
        row.verdict = 'error';
        status = 503;
        body = { error: 'receiver_unavailable', message: (err as Error).message };
      }
      row.status = status;
      row.answeredAt = Date.now();
      if (failThis) fail.fired(row.verdict === 'not_stored');
      const armed = cuts.get(row.worker);
      if (armed && row.verdict === 'applied') {
        cuts.delete(row.worker);
        armed.cut();
        armed.fired(true);
      }
      reply(res, status, body);
    })().catch((err: unknown) => reply(res, 500, { error: String(err) }));
  });
  // Longer than a late request is held (chaos/faults.ts): an idle keep-alive connection closed by
  // the server while the proxy holds a request on it would lose the request.
  server.keepAliveTimeout = 60_000;
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;

  return {
    url: `http://127.0.0.1:${port}`,
    ledger,
    cutAfterNext(worker, cut, timeoutMs) {
      return new Promise<boolean>((resolve) => {
        const timer = setTimeout(() => {
          cuts.delete(worker);
          resolve(false);
        }, timeoutMs);
        cuts.set(worker, {
          cut,
          fired: (v) => {
            clearTimeout(timer);
            resolve(v);
          },
        });
      });
    },
    failNextAbove(key, fence, timeoutMs) {
      return new Promise<boolean>((resolve) => {
        const timer = setTimeout(() => {
          failing.delete(key);
          resolve(false);
        }, timeoutMs);
        failing.set(key, {
          fence: BigInt(fence),
          fired: (v) => {
            clearTimeout(timer);
            resolve(v);
          },
        });
      });
    },
    async effects() {
      const { rows } = await pool.query<{ key: string; fence: string; at: number }>(
        'SELECT key, fence::text AS fence, (extract(epoch from at) * 1000)::float8 AS at FROM chaos_effects ORDER BY id',
      );
      return rows;
    },
    async close() {
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
      for (const c of cuts.values()) c.fired(false);
      for (const f of failing.values()) f.fired(false);
      await pool.end();
    },
  };
}
