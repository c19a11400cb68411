/**
 * Small local services for the example workflows, in one node http server on loopback:
 *   GET  /statements/:invoiceId     statement of account (text/plain)       reconcile-invoice
 *   POST /cases                     file a reconciliation case  (fenced)    reconcile-invoice
 *   GET  /cases/:idempotencyKey     the case filed under a key, or 404      (its reconcile())
 *   GET  /sales/:region?period=     sales rows of a region and quarter      publish-report
 *   POST /reports                   publish a report            (fenced)    publish-report
 *   GET  /reports/:idempotencyKey   the report published under a key, or 404
 * The fenced receivers sit behind ratchet/receiver's createFenceGuard: Idempotency-Key and
 * X-Execution-Fence are required, a repeated key replays (to any fence once its effect is done),
 * another request under a done key is 422 idempotency_key_reused, and a lower fence for a key not
 * done yet is 409 stale_fence.
 * Storage: PostgreSQL with `databaseUrl` (or SERVICES_DATABASE_URL), else in-memory PGlite.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createFenceGuard } from '../src/receiver/index.js';
import { findCase, findReport, createCaseHandler, publishReportHandler, SCHEMA_STATEMENTS } from './services/receivers.js';
import { PERIOD, salesFor } from './services/sales.js';
import { statementText } from './services/statements.js';
import { openServicesStorage } from './services/storage.js';

/** The variable the example tools read the services' base URL from. */
export { SERVICES_URL_ENV } from '../workflows/_lib/services-url.js';

export type Route = 'statements' | 'sales' | 'cases' | 'reports';

export interface ServicesOptions {
  /** Default 0: a free port. */
  port?: number;
  host?: string;
  /** The services' database; default SERVICES_DATABASE_URL; unset = in-memory PGlite. */
  databaseUrl?: string;
  faults?: {
    /** The first N requests to a route answer 503 (before the guard: nothing is recorded). */
    fail?: Partial<Record<Route, number>>;
    /** The first N fenced POSTs to a route commit their effect, then the connection is cut before the answer. */
    dropAnswer?: Partial<Record<'cases' | 'reports', number>>;
  };
  /** Told about errors answered 500 (default console.error). */
  onError?: (err: unknown) => void;
}

/** One request to a fenced receiver, as the witness saw it. */
export interface ReceiverRequest {
  method: string;
  path: string;
  key: string | null;
  fence: string | null;
  /** The W3C trace context the caller sent (the tool call's span), or null. */
  traceparent: string | null;
  status: number;
  replayed: boolean;
  /** The answer was never delivered (faults.dropAnswer). */
  dropped: boolean;
}

export interface Effects {
  cases: { key: string; caseId: string; invoiceId: string; outcome: string; fence: string }[];
  reports: { key: string; reportId: string; title: string; fence: string }[];
  requests: ReceiverRequest[];
}

export interface Services {
  url: string;
  storage: 'postgres' | 'pglite';
  effects(): Promise<Effects>;
  close(): Promise<void>;
}

const json = (res: ServerResponse, status: number, body: unknown) =>
  res.writeHead(status, { 'content-type': 'application/json; charset=utf-8' }).end(JSON.stringify(body));

/**
 * Watches the answer a fenced receiver writes (status, Idempotent-Replayed), and with `drop`
 * lets the handler run and commit, then cuts the connection instead of answering.
 */
function witness(req: IncomingMessage, res: ServerResponse, record: ReceiverRequest, drop: boolean): void {
  const writeHead = res.writeHead.bind(res) as (status: number, headers?: Record<string, string>) => ServerResponse;
  res.writeHead = ((status: number, headers?: Record<string, string>) => {
    record.status = status;
    record.replayed = headers?.['idempotent-replayed'] === 'true';
    return drop ? res : writeHead(status, headers);
  }) as typeof res.writeHead;
  if (drop)
    res.end = (() => {
      req.socket.destroy();
      return res;
    }) as typeof res.end;
}

export async function startServices(opts: ServicesOptions = {}): Promise<Services> {
  const storage = await openServicesStorage(opts.databaseUrl ?? process.env.SERVICES_DATABASE_URL ?? undefined);
  const { pool } = storage;
  const guard = createFenceGuard(pool);
  await guard.migrate();
  for (const statement of SCHEMA_STATEMENTS) await pool.query(statement);

  const onError = opts.onError ?? ((err: unknown) => console.error('example services:', err));
  const middleware = { onError: (err: unknown) => onError(err) };
  const receivers = { cases: guard.middleware(createCaseHandler, middleware), reports: guard.middleware(publishReportHandler, middleware) };
  const failLeft = { ...opts.faults?.fail };
  const dropLeft = { ...opts.faults?.dropAnswer };
  const requests: ReceiverRequest[] = [];

  function fenced(route: 'cases' | 'reports', req: IncomingMessage, res: ServerResponse): void {
    const header = (name: string) => (typeof req.headers[name] === 'string' ? (req.headers[name] as string) : null);
    const dropped = (dropLeft[route] ?? 0) > 0;
    if (dropped) dropLeft[route]! -= 1;
    const record: ReceiverRequest = {
      method: 'POST',
      path: `/${route}`,
      key: header('idempotency-key'),
      fence: header('x-execution-fence'),
      traceparent: header('traceparent'),
      status: 0,
      replayed: false,
      dropped,
    };
    witness(req, res, record, record.dropped);
    requests.push(record);
    receivers[route](req, res);
  }

  async function route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://services');
    const [, head, rest, extra] = url.pathname.split('/');
    const name = head as Route;
    if ((failLeft[name] ?? 0) > 0) {
      failLeft[name]! -= 1;
      return void json(res, 503, { error: 'injected_fault' });
    }
    let arg: string | undefined;
    try {
      arg = rest === undefined || extra !== undefined ? undefined : decodeURIComponent(rest);
    } catch {
      return void json(res, 400, { error: 'bad_path' });
    }
    const get = req.method === 'GET';
    if (get && head === 'health' && rest === undefined) return void json(res, 200, { ok: true, storage: storage.kind });
    if (get && head === 'statements' && arg) {
      const text = statementText(arg);
      if (text === null) return void json(res, 404, { error: 'unknown_statement' });
      return void res.writeHead(200, { 'content-type': 'text/plain; charset=utf-8' }).end(text);
    }
    if (get && head === 'sales' && arg) {
      const period = url.searchParams.get('period') ?? '';
      if (!PERIOD.test(period)) return void json(res, 400, { error: 'invalid_period' });
      const sales = salesFor(arg, period);
      return void (sales ? json(res, 200, sales) : json(res, 404, { error: 'unknown_region' }));
    }
    if ((head === 'cases' || head === 'reports') && rest === undefined && req.method === 'POST') return fenced(head, req, res);
    if (get && head === 'cases' && arg) {
      const found = await findCase(pool, arg);
      return void (found ? json(res, 200, found) : json(res, 404, { error: 'unknown_case' }));
    }
    if (get && head === 'reports' && arg) {
      const found = await findReport(pool, arg);
      return void (found ? json(res, 200, found) : json(res, 404, { error: 'unknown_report' }));
    }
    json(res, 404, { error: 'not_found' });
  }

  const server = createServer((req, res) => {
    route(req, res).catch((err: unknown) => {
      onError(err);
      if (!res.headersSent) json(res, 500, { error: 'internal_error' });
      else res.destroy();
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port ?? 0, opts.host ?? '127.0.0.1', () => resolve());
  });
  const { address, port } = server.address() as AddressInfo;

  return {
    url: `http://${address}:${port}`,
    storage: storage.kind,
    async effects() {
      const cases = await pool.query<Effects['cases'][number]>(
        'SELECT key, case_id AS "caseId", invoice_id AS "invoiceId", outcome, fence::text AS fence FROM examples.cases ORDER BY created_at, key',
      );
      const reports = await pool.query<Effects['reports'][number]>(
        'SELECT key, report_id AS "reportId", title, fence::text AS fence FROM examples.reports ORDER BY published_at, key',
      );
      return { cases: cases.rows, reports: reports.rows, requests: requests.map((r) => ({ ...r })) };
    },
    async close() {
      await new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
      await pool.end();
    },
  };
}
