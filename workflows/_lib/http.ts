import { randomUUID } from 'node:crypto';
import { PermanentError, TransientError, type ToolContext } from '../../src/index.js';
import { servicesUrl } from './services-url.js';

/**
 * HTTP for the example tools, with one error policy: 5xx, 408, 429, 409 `in_progress` and
 * network errors are TransientError (worth a retry); 409 `stale_fence` and every other 4xx are
 * PermanentError (no retry can fix them). An abort rethrows the attempt's own reason
 * (lease_lost, timeout, ...), so the worker sees why it stopped.
 */

export interface HttpAnswer {
  status: number;
  body: unknown;
  /** The receiver replayed a stored answer (`Idempotent-Replayed: true`). */
  replayed: boolean;
}

type Ctx = Pick<ToolContext, 'signal' | 'traceparent'>;

/**
 * Every request carries the tool call's trace context (`traceparent`, W3C Trace Context) when
 * the worker gives one: the service's own spans then join the run's trace.
 */
async function send(url: string, init: RequestInit, ctx: Ctx): Promise<HttpAnswer> {
  let res: Response;
  let text: string;
  const headers = { ...(init.headers as Record<string, string> | undefined), ...(ctx.traceparent ? { traceparent: ctx.traceparent } : {}) };
  try {
    res = await fetch(url, { ...init, headers, signal: ctx.signal });
    text = await res.text();
  } catch (err) {
    if (ctx.signal.aborted) throw ctx.signal.reason;
    throw new TransientError(`${init.method ?? 'GET'} ${url} failed: ${(err as Error).message}`, { code: 'network_error', cause: err });
  }
  const replayed = res.headers.get('idempotent-replayed') === 'true';
  if (text === '' || !(res.headers.get('content-type') ?? '').includes('json'))
    return { status: res.status, body: text === '' ? null : text, replayed };
  try {
    return { status: res.status, body: JSON.parse(text) as unknown, replayed };
  } catch (err) {
    throw new TransientError(`${init.method ?? 'GET'} ${url}: the answer is not JSON`, { code: 'bad_response', cause: err });
  }
}

function errorCode(body: unknown): string | undefined {
  const e = (body as { error?: unknown } | null)?.error;
  return typeof e === 'string' ? e : undefined;
}

/** Throws the classified error for a non-2xx answer; returns the answer otherwise. */
export function expectOk(answer: HttpAnswer, what: string): HttpAnswer {
  const { status, body } = answer;
  if (status >= 200 && status < 300) return answer;
  const code = errorCode(body);
  const message = `${what}: HTTP ${status}${code ? ` ${code}` : ''}`;
  if (status === 409 && code === 'stale_fence')
    throw new PermanentError(`${message} (a newer attempt holds this key)`, { code: 'stale_fence' });
  if (status >= 500 || status === 408 || status === 429 || (status === 409 && code === 'in_progress')) {
    throw new TransientError(message, { code: code ?? `http_${status}` });
  }
  throw new PermanentError(message, { code: code ?? `http_${status}` });
}

/** GET a service path; `null` for 404 when `allowMissing`, else classified errors. */
export async function getFromService(path: string, ctx: Ctx, opts: { allowMissing?: boolean } = {}): Promise<HttpAnswer | null> {
  const answer = await send(servicesUrl(path), { method: 'GET', headers: { accept: 'application/json, text/plain' } }, ctx);
  if (answer.status === 404 && opts.allowMissing) return null;
  return expectOk(answer, `GET ${path}`);
}

/**
 * The fenced, irreversible POST: `Idempotency-Key` (ctx.idempotencyKey) and
 * `X-Execution-Fence` (ctx.fence) go with it, and `ctx.beginEffect(requestId)` is called right
 * before it is sent — it throws when this attempt no longer owns (or cannot confirm it owns)
 * the stage, so nothing irreversible starts without a lease.
 */
export async function fencedPost(
  path: string,
  body: unknown,
  ctx: Pick<ToolContext, 'signal' | 'fence' | 'idempotencyKey' | 'beginEffect' | 'traceparent'>,
): Promise<HttpAnswer> {
  const payload = JSON.stringify(body);
  const requestId = randomUUID();
  const headers = {
    'content-type': 'application/json',
    'Idempotency-Key': ctx.idempotencyKey,
    'X-Execution-Fence': ctx.fence,
    'X-Request-Id': requestId,
  };
  ctx.beginEffect(requestId);
  return expectOk(await send(servicesUrl(path), { method: 'POST', headers, body: payload }, ctx), `POST ${path}`);
}
