import type { z } from 'zod';
import { ApiError, errorBodySchema } from '../api/errors.js';

export interface HttpOptions {
  baseUrl: string;
  token?: string;
  fetch: typeof fetch;
}

export interface RequestArgs<S extends z.ZodType> {
  method: 'GET' | 'POST' | 'DELETE';
  path: string;
  schema: S;
  body?: unknown;
  headers?: Record<string, string>;
  /** Give up on the answer after this long: ApiError `read_timeout` (status 0). */
  timeoutMs: number;
  signal?: AbortSignal;
}

/** Retry-After as milliseconds (seconds or an HTTP date), or null. */
function retryAfterMs(value: string | null): number | null {
  if (!value) return null;
  if (/^\d+$/.test(value.trim())) return Number(value.trim()) * 1000;
  const at = Date.parse(value);
  return Number.isNaN(at) ? null : Math.max(0, at - Date.now());
}

/**
 * One request to the task API: bearer token, JSON body, a timeout of its own, and an answer
 * parsed with its zod schema. Every failure is an ApiError with a stable code: the server's
 * (`unknown_run`, `database_unavailable`...), or `read_timeout` / `network_error` /
 * `invalid_response` (status 0 for the first two: no answer came).
 */
export async function request<S extends z.ZodType>(
  http: HttpOptions,
  args: RequestArgs<S>,
): Promise<{ status: number; data: z.output<S> }> {
  const timeout = AbortSignal.timeout(Math.max(1, args.timeoutMs));
  const signal = args.signal ? AbortSignal.any([timeout, args.signal]) : timeout;
  const headers: Record<string, string> = { accept: 'application/json', ...args.headers };
  if (http.token) headers.authorization = `Bearer ${http.token}`;
  if (args.body !== undefined) headers['content-type'] = 'application/json';
  const what = `${args.method} ${args.path}`;
  let res: Response;
  let text: string;
  try {
    res = await http.fetch(new URL(args.path, http.baseUrl), {
      method: args.method,
      headers,
      body: args.body === undefined ? undefined : JSON.stringify(args.body),
      signal,
    });
    text = await res.text();
  } catch (err) {
    if (timeout.aborted)
      throw new ApiError(0, 'read_timeout', `${what}: no answer within ${args.timeoutMs} ms`, {
        cause: err,
        details: { timeoutMs: args.timeoutMs },
      });
    throw new ApiError(0, 'network_error', `${what}: ${(err as Error).message}`, { cause: err });
  }
  let json: unknown;
  try {
    json = text.length > 0 ? JSON.parse(text) : null;
  } catch (err) {
    throw new ApiError(
      res.status,
      res.ok ? 'invalid_response' : res.status >= 500 ? 'internal' : 'invalid_response',
      `${what}: the answer (HTTP ${res.status}) is not JSON`,
      { cause: err },
    );
  }
  if (!res.ok) {
    const e = errorBodySchema.safeParse(json);
    if (!e.success)
      throw new ApiError(
        res.status,
        res.status >= 500 ? 'internal' : 'invalid_response',
        `${what}: HTTP ${res.status} without an error body`,
      );
    throw new ApiError(res.status, e.data.error.code, e.data.error.message, {
      path: e.data.error.path,
      details: e.data.error.details,
      retryAfterMs: retryAfterMs(res.headers.get('retry-after')),
    });
  }
  const parsed = args.schema.safeParse(json);
  if (!parsed.success) {
    throw new ApiError(
      res.status,
      'invalid_response',
      `${what}: the answer does not fit its schema: ${parsed.error.issues[0]?.message ?? ''}`,
      { details: { issues: parsed.error.issues.map((i) => ({ path: i.path.map(String), message: i.message })) } },
    );
  }
  return { status: res.status, data: parsed.data };
}
