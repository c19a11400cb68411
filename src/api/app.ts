import type { IncomingMessage } from 'node:http';
import { OpenAPIHono, type Hook } from '@hono/zod-openapi';
import type { Context, Env, MiddlewareHandler } from 'hono';
import { bodyLimit } from 'hono/body-limit';
import type { Logger } from 'pino';
import type { Ratchet } from '../engine.js';
import { createTokenCheck, isLoopbackHost } from './auth.js';
import { processMetrics } from '../observability/metrics.js';
import { refreshWaitingStages } from '../observability/wait-metrics.js';
import { ApiError, issuePath } from './errors.js';
import {
  cancelRoute,
  eventsRoute,
  explainRoute,
  getRunRoute,
  healthRoute,
  listRunsRoute,
  readyRoute,
  retryRoute,
  submitRoute,
} from './routes.js';
import { mountScheduleRoutes } from './schedules.js';
import { mountWaitRoutes } from './waits.js';
import { createRunService } from './service.js';
import { toApiError } from './to-api-error.js';
import { streamHandler } from './stream-route.js';
import type { EventHub } from '../live/hub.js';
import { registerDashboard } from '../dashboard/routes.js';

export interface AppOptions {
  ratchet: Ratchet;
  /** Bearer tokens accepted; empty means no auth (the server listens on loopback only then). */
  tokens: readonly string[];
  /** Largest request body in bytes (413 past it). */
  bodyLimit: number;
  /** Seconds a 503 tells the client to wait (Retry-After). */
  retryAfterSeconds: number;
  logger: Logger;
  /** The process's event hub (one LISTEN connection for every stream); its owner closes it. */
  hub: EventHub;
  /** A heartbeat comment on a quiet stream after this long (default 15 s). */
  streamHeartbeatMs?: number;
}

const TARGET_PATH: Record<string, string[]> = { json: [], query: [], param: [], header: [] };

/** A request that does not fit its schema: 400 with the JSON path of the first problem. */
const validationHook: Hook<unknown, Env, string, unknown> = (result) => {
  if (result.success) return;
  const issue = result.error.issues[0]!;
  const path =
    result.target === 'header' && issue.path[0] === 'idempotency-key'
      ? 'Idempotency-Key'
      : result.target === 'header' && issue.path[0] === 'signal-id'
        ? 'Signal-Id'
        : issuePath(issue, TARGET_PATH[result.target] ?? []);
  throw new ApiError(
    400,
    'invalid_request',
    `${result.target === 'json' ? 'the body' : `the ${result.target}`} does not fit the request schema: ${issue.message} (at ${path})`,
    {
      path,
      details: {
        in: result.target === 'json' ? 'body' : result.target,
        issues: result.error.issues.map((i) => ({ path: issuePath(i), message: i.message })),
      },
    },
  );
};

/** cancel and retry take no body: a body would suggest a retry can mean something else than the original request. */
const noBody: MiddlewareHandler = async (c, next) => {
  const text = c.req.raw.body ? await c.req.text() : '';
  if (text.trim().length > 0) {
    throw new ApiError(
      400,
      'invalid_request',
      'this request takes no body (a retry is the same request again; to change the input submit a new run)',
      { path: '$' },
    );
  }
  await next();
};

/** Headers the API reads as one value, with the name its errors give. */
const SINGLE_VALUE_HEADERS: readonly [string, string][] = [
  ['idempotency-key', 'Idempotency-Key'],
  ['signal-id', 'Signal-Id'],
];

/**
 * A header sent on several lines is refused, never joined: the Request that @hono/node-server
 * builds joins them ("a, b"), a key nobody sent. Node keeps each line apart in the raw request
 * (`headersDistinct`); without a Node request (another adapter) there is nothing to tell.
 */
const singleValueHeaders: MiddlewareHandler = async (c, next) => {
  const incoming = (c.env as { incoming?: IncomingMessage } | undefined)?.incoming;
  for (const [name, label] of SINGLE_VALUE_HEADERS) {
    const lines = incoming?.headersDistinct?.[name]?.length ?? 0;
    if (lines > 1) {
      throw new ApiError(400, 'invalid_request', `the ${label} header was sent ${lines} times (more than once); send it once`, {
        path: label,
      });
    }
  }
  await next();
};

/**
 * The task API as a Hono app (DESIGN.md "Task API"): every body and response a zod schema,
 * the OpenAPI document at /v1/openapi.json, bearer auth on everything but /healthz and
 * /readyz, a body limit (413), and the database not answering as 503 with Retry-After.
 */
export function createApp(opts: AppOptions): OpenAPIHono {
  const service = createRunService(opts.ratchet);
  const checkToken = createTokenCheck(opts.tokens);
  const app = new OpenAPIHono({ defaultHook: validationHook });
  const log = opts.logger.child({ component: 'api' });

  app.onError((err, c) => {
    const e = toApiError(err, opts.retryAfterSeconds);
    if (e.status >= 500) {
      const cause = e.cause as Error | undefined;
      log.error(
        { event: 'api_error', method: c.req.method, path: c.req.routePath, status: e.status, code: e.code, err: cause?.message },
        'request failed',
      );
    }
    if (e.retryAfterMs !== null) c.header('Retry-After', String(Math.ceil(e.retryAfterMs / 1000)));
    if (e.status === 401) c.header('WWW-Authenticate', 'Bearer realm="ratchet"');
    // The rest of an oversized body is never read: the connection cannot carry another request.
    if (e.status === 413) c.header('Connection', 'close');
    return c.json(e.toJSON(), e.status as 400);
  });
  app.notFound((c) => c.json(new ApiError(404, 'not_found', `no route ${c.req.method} ${c.req.path}`).toJSON(), 404));

  app.use('*', async (c, next) => {
    const started = performance.now();
    await next();
    log.debug(
      {
        event: 'http_request',
        method: c.req.method,
        route: c.req.routePath,
        status: c.res.status,
        durationMs: Math.round(performance.now() - started),
      },
      'request',
    );
  });

  // Health: no token, nothing about runs.
  app.openapi(healthRoute, (c) => c.json({ ok: true as const }, 200));
  app.openapi(readyRoute, async (c) => {
    try {
      await opts.ratchet.store.db.query('SELECT 1');
      return c.json({ ok: true, database: 'up' as const }, 200);
    } catch {
      c.header('Retry-After', String(opts.retryAfterSeconds));
      return c.json({ ok: false, database: 'down' as const }, 503);
    }
  });

  // No tokens (loopback only): the API and the dashboard answer only requests addressed to a
  // loopback name, so a rebound DNS name cannot reach them from a browser (health stays open).
  if (opts.tokens.length === 0) {
    app.use('*', async (c: Context, next) => {
      if (!isLoopbackHost(c.req.header('host') ?? new URL(c.req.url).host)) {
        throw new ApiError(403, 'forbidden_host', 'without tokens this server answers only Host localhost, 127.0.0.1 or [::1]');
      }
      await next();
    });
  }

  app.use('/v1/*', async (c: Context, next) => {
    if (opts.tokens.length > 0 && !checkToken(c.req.header('authorization'))) {
      throw new ApiError(
        401,
        'unauthorized',
        c.req.header('authorization') ? 'the bearer token is not accepted' : 'send Authorization: Bearer <token>',
      );
    }
    await next();
  });
  // One body limit for the API and the dashboard's POSTs (the sign-in included): 413 past it, read no further.
  const limitBody = bodyLimit({
    maxSize: opts.bodyLimit,
    onError: () => {
      throw new ApiError(413, 'body_too_large', `the request body is larger than ${opts.bodyLimit} bytes`, {
        path: '$',
        details: { limit: opts.bodyLimit },
      });
    },
  });
  app.use('/v1/*', limitBody);
  app.use('/v1/*', singleValueHeaders);
  app.use('/v1/runs/:id/cancel', noBody);
  app.use('/v1/runs/:id/retry', noBody);

  app.openapi(submitRoute, async (c) => {
    const res = await service.submit(c.req.valid('json'), c.req.valid('header')['idempotency-key']);
    c.header('Location', `/v1/runs/${res.id}`);
    return res.created ? c.json(res, 202) : c.json(res, 200);
  });
  app.openapi(listRunsRoute, async (c) => c.json(await service.list(c.req.valid('query')), 200));
  app.openapi(getRunRoute, async (c) => c.json(await service.get(c.req.valid('param').id), 200));
  app.openapi(eventsRoute, async (c) => c.json(await service.events(c.req.valid('param').id, c.req.valid('query')), 200));
  app.openapi(explainRoute, async (c) => c.json(await service.explain(c.req.valid('param').id), 200));
  app.openapi(cancelRoute, async (c) => c.json(await service.cancel(c.req.valid('param').id), 200));
  app.openapi(retryRoute, async (c) => c.json(await service.retry(c.req.valid('param').id), 200));
  mountScheduleRoutes(app, opts.ratchet);
  mountWaitRoutes(app, opts.ratchet, opts.tokens);
  app.get('/v1/runs/:id/stream', streamHandler({ ratchet: opts.ratchet, hub: opts.hub, heartbeatMs: opts.streamHeartbeatMs, logger: log }));

  // Prometheus text format, behind the same bearer auth (Prometheus sends it with `authorization`).
  app.get('/v1/metrics', async (c) => {
    const registry = processMetrics().registry;
    // Waiting stages by kind, from the database (the database not answering leaves the last figure).
    await refreshWaitingStages(registry, opts.ratchet.store.db).catch(() => {});
    return c.body(await registry.metrics(), 200, { 'content-type': registry.contentType });
  });

  registerDashboard(app, {
    ratchet: opts.ratchet,
    service,
    hub: opts.hub,
    tokens: opts.tokens,
    heartbeatMs: opts.streamHeartbeatMs,
    logger: log,
    limitBody,
  });

  app.openAPIRegistry.registerComponent('securitySchemes', 'bearer', { type: 'http', scheme: 'bearer' });
  app.doc('/v1/openapi.json', {
    openapi: '3.0.3',
    info: { title: 'Ratchet task API', version: '1', description: 'Runs as async tasks: submit, poll, explain, cancel, retry.' },
  });
  return app;
}
