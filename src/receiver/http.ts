import type { IncomingMessage, ServerResponse } from 'node:http';
import type pg from 'pg';
import { isConnectionError } from '../store/db-errors.js';
import { assertIdempotencyKey, parseFence, requestFingerprint } from './fence.js';
import type { EffectHandler, GuardResponse, GuardResult, RunOptions } from './fence-guard.js';

/** Largest JSON body the middleware reads by default (1 MiB); larger is 413. */
export const DEFAULT_BODY_LIMIT = 1024 * 1024;

export interface HttpHandlerContext {
  /** The Idempotency-Key header. */
  key: string;
  /** The X-Execution-Fence header, as a canonical decimal string. */
  fence: string;
  /** The parsed JSON body (null when the body is empty). */
  body: unknown;
  /** The guard's transaction: write through it so the effect commits with its record. */
  tx: pg.ClientBase;
  req: IncomingMessage;
}

export type HttpHandler = (ctx: HttpHandlerContext) => Promise<GuardResponse>;
export type RequestListener = (req: IncomingMessage, res: ServerResponse) => void;

export interface MiddlewareOptions {
  /** Body limit in bytes (default 1 MiB). */
  bodyLimit?: number;
  /** Told about every error answered 500/503 (default: console.error). */
  onError?: (err: unknown, req: IncomingMessage) => void;
}

type RunFn = (key: string, fence: string | bigint, handler: EffectHandler, opts?: RunOptions) => Promise<GuardResult>;

function send(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  if (status === 204 || status === 304) {
    res.writeHead(status, headers).end();
    return;
  }
  const text = JSON.stringify(body ?? null);
  res
    .writeHead(status, {
      ...headers,
      'content-type': 'application/json; charset=utf-8',
      'content-length': String(Buffer.byteLength(text)),
    })
    .end(text);
}

/**
 * One header's value, or `duplicate` when it came on more than one line: Node joins repeated
 * unknown headers with ", " in `req.headers`, which would turn two keys into a new one.
 * `headersDistinct` keeps each line apart.
 */
function header(req: IncomingMessage, name: string): string | undefined | { duplicate: number } {
  const lines = req.headersDistinct[name];
  if (lines && lines.length > 1) return { duplicate: lines.length };
  return lines?.[0];
}

type BodyResult = { ok: true; value: unknown; raw: Buffer } | { ok: false; status: 400 | 413; error: string };

/** Reads the whole body up to `limit` bytes and parses it as JSON (empty → null); keeps the bytes for the fingerprint. */
function readJsonBody(req: IncomingMessage, limit: number): Promise<BodyResult> {
  const declared = Number(req.headers['content-length'] ?? '0');
  if (declared > limit) return Promise.resolve({ ok: false, status: 413, error: 'body_too_large' });
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const cleanup = () => {
      req.off('data', onData);
      req.off('end', onEnd);
      req.off('error', onError);
      req.off('aborted', onAborted);
    };
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size > limit) {
        cleanup();
        resolve({ ok: false, status: 413, error: 'body_too_large' });
        return;
      }
      chunks.push(chunk);
    };
    const onEnd = () => {
      cleanup();
      const raw = Buffer.concat(chunks);
      const text = raw.toString('utf8');
      if (text.trim() === '') return resolve({ ok: true, value: null, raw });
      try {
        resolve({ ok: true, value: JSON.parse(text) as unknown, raw });
      } catch {
        resolve({ ok: false, status: 400, error: 'invalid_json' });
      }
    };
    const onError = (err: Error) => {
      cleanup();
      reject(err);
    };
    const onAborted = () => {
      cleanup();
      reject(new Error('request aborted by the client'));
    };
    req.on('data', onData);
    req.on('end', onEnd);
    req.on('error', onError);
    req.on('aborted', onAborted);
  });
}

function headersFor(result: GuardResult): Record<string, string> {
  if (result.verdict === 'replayed') return { 'idempotent-replayed': 'true' };
  if (result.verdict === 'in_progress') return { 'retry-after': '1' };
  return {};
}

/**
 * A Node http request listener: Idempotency-Key and X-Execution-Fence headers (400 when
 * missing, malformed or sent more than once), a JSON body (413 past the limit, 400 when not
 * JSON), then the guard, with the request's fingerprint (method, target and body bytes): the
 * same key with another request is 422 `idempotency_key_reused`.
 */
export function createMiddleware(run: RunFn, handler: HttpHandler, opts: MiddlewareOptions = {}): RequestListener {
  const limit = opts.bodyLimit ?? DEFAULT_BODY_LIMIT;
  const onError = opts.onError ?? ((err: unknown) => console.error('ratchet/receiver: request failed', err));
  const twice = (name: string, n: number) => `the ${name} header was sent ${n} times (more than once); send it once`;

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const key = header(req, 'idempotency-key');
    if (typeof key === 'object') {
      return send(res, 400, { error: 'invalid_idempotency_key', message: twice('Idempotency-Key', key.duplicate) });
    }
    if (key === undefined || key === '') {
      return send(res, 400, { error: 'missing_idempotency_key', message: 'the Idempotency-Key header is required' });
    }
    try {
      assertIdempotencyKey(key);
    } catch (err) {
      return send(res, 400, { error: 'invalid_idempotency_key', message: (err as Error).message });
    }
    const rawFence = header(req, 'x-execution-fence');
    if (typeof rawFence === 'object') {
      return send(res, 400, { error: 'invalid_fence', message: twice('X-Execution-Fence', rawFence.duplicate) });
    }
    if (rawFence === undefined || rawFence === '') {
      return send(res, 400, { error: 'missing_fence', message: 'the X-Execution-Fence header is required' });
    }
    let fence: bigint;
    try {
      fence = parseFence(rawFence);
    } catch (err) {
      return send(res, 400, { error: 'invalid_fence', message: (err as Error).message });
    }

    const body = await readJsonBody(req, limit);
    if (!body.ok) {
      // An unread body cannot be left on a kept-alive connection: close it after answering.
      return send(
        res,
        body.status,
        { error: body.error, ...(body.status === 413 ? { limit } : {}) },
        body.status === 413 ? { connection: 'close' } : {},
      );
    }

    let result: GuardResult;
    try {
      const fingerprint = requestFingerprint(req.method ?? 'GET', req.url ?? '/', body.raw);
      result = await run(key, fence, (tx) => handler({ key, fence: fence.toString(), body: body.value, tx, req }), { fingerprint });
    } catch (err) {
      onError(err, req);
      if (isConnectionError(err)) return send(res, 503, { error: 'database_unavailable' }, { 'retry-after': '1' });
      return send(res, 500, { error: 'internal_error' });
    }
    send(res, result.status, result.body, headersFor(result));
  }

  return (req, res) => {
    handle(req, res).catch((err: unknown) => {
      onError(err, req);
      if (!res.headersSent) send(res, 500, { error: 'internal_error' });
      else res.destroy();
    });
  };
}
