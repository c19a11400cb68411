import type { IncomingMessage, Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { serve } from '@hono/node-server';
import type { OpenAPIHono } from '@hono/zod-openapi';
import type { Logger } from 'pino';
import { z } from 'zod';
import type { Ratchet } from '../engine.js';
import { InvalidInputError } from '../errors.js';
import { parseInput } from '../store/validate.js';
import { createApp } from './app.js';
import { isLoopback } from './auth.js';
import { createEventHub } from '../live/hub.js';

export const DEFAULT_API_HOST = '127.0.0.1';
export const DEFAULT_API_PORT = 7700;
export const DEFAULT_BODY_LIMIT = 1024 * 1024;
export const DEFAULT_RETRY_AFTER_SECONDS = 5;

/** Where and how the API listens: checked alone by `serve` / `dev` before they open anything. */
const listenFields = {
  /** Accepted bearer tokens. Required unless the server listens on loopback only. */
  tokens: z.array(z.string().min(8, 'at least 8 characters').max(1000).regex(/^\S+$/, 'no whitespace')).max(100).optional(),
  host: z.string().min(1).max(255).optional(),
  /** 0 picks a free port. */
  port: z.number().int().min(0).max(65535).optional(),
  bodyLimit: z
    .number()
    .int()
    .min(64)
    .max(100 * 1024 * 1024)
    .optional(),
};
const listenOptions = z.object(listenFields).strict();
export type ListenOptions = z.input<typeof listenOptions>;

const serverOptions = z
  .object({
    ratchet: z.custom<Ratchet>((v) => typeof v === 'object' && v !== null && 'submit' in v, 'a Ratchet from createRatchet'),
    ...listenFields,
    retryAfterSeconds: z.number().int().min(1).max(3600).optional(),
    /** A heartbeat comment on a quiet run stream after this long, ms (default 15 s). */
    streamHeartbeatMs: z.number().int().min(10).max(600_000).optional(),
    logger: z.custom<Logger>().optional(),
  })
  .strict();
export type ServerOptions = z.input<typeof serverOptions>;

/**
 * Checks where and how the API would listen (tokens, host, port, body limit) without opening
 * anything; `where` names the caller in the error path. Refuses a non-loopback address without
 * a token: the API starts and stops runs, so it is never open to a network by accident.
 */
export function checkListenOptions(options: ListenOptions, where = 'createServer'): void {
  const o = parseInput(listenOptions, options, where);
  const host = o.host ?? DEFAULT_API_HOST;
  if ((o.tokens ?? []).length === 0 && !isLoopback(host)) {
    const message = `refusing to listen on ${host} without a token: give tokens (RATCHET_TOKEN / --token), or listen on 127.0.0.1`;
    throw new InvalidInputError(message, `${where}.tokens`, { reason: 'token_required' });
  }
}

export interface ApiServer {
  /** http://host:port */
  readonly url: string;
  readonly host: string;
  readonly port: number;
  readonly app: OpenAPIHono;
  close(): Promise<void>;
}

/**
 * The Host header as a URL writes it (lower case, IPv6 and IPv4 literals in their short form, the
 * default port dropped): @hono/node-server answers 400 when the header's name differs from its URL
 * form, so `LOCALHOST:7700` or `[0:0:0:0:0:0:0:1]:7700` (names of this machine a client may send)
 * would be refused before any route; the routes see the same short form (a loopback literal in any
 * spelling counts as loopback). Anything that is not a plain host[:port] is left as it is.
 */
export function normalizeHostHeader(req: IncomingMessage): void {
  const h = req.headers.host;
  if (!h) return;
  try {
    const u = new URL(`http://${h}`);
    if (u.username || u.password || u.pathname !== '/' || u.search || u.hash || h.includes('/') || h.includes('@')) return;
    if (u.host === h) return;
    req.headers.host = u.host;
    // The adapter builds the request's headers from the raw list: the same name there.
    for (let i = 0; i + 1 < req.rawHeaders.length; i += 2) if (req.rawHeaders[i]!.toLowerCase() === 'host') req.rawHeaders[i + 1] = u.host;
  } catch {
    /* not a host: hono refuses it */
  }
}

/** Starts the task API on `host:port` (default 127.0.0.1:7700); see checkListenOptions for what it refuses. */
export async function createServer(options: ServerOptions): Promise<ApiServer> {
  const o = parseInput(serverOptions, options, 'createServer');
  checkListenOptions({ host: o.host, port: o.port, bodyLimit: o.bodyLimit, tokens: o.tokens });
  const host = o.host ?? DEFAULT_API_HOST;
  const tokens = o.tokens ?? [];
  const logger = o.logger ?? o.ratchet.logger;
  const hub = createEventHub(o.ratchet.store.db, { logger });
  const app = createApp({
    ratchet: o.ratchet,
    tokens,
    bodyLimit: o.bodyLimit ?? DEFAULT_BODY_LIMIT,
    retryAfterSeconds: o.retryAfterSeconds ?? DEFAULT_RETRY_AFTER_SECONDS,
    logger,
    hub,
    streamHeartbeatMs: o.streamHeartbeatMs,
  });
  const server = await new Promise<Server>((resolve, reject) => {
    const s = serve({ fetch: app.fetch, hostname: host, port: o.port ?? DEFAULT_API_PORT }) as Server;
    s.prependListener('request', normalizeHostHeader); // before hono's own listener reads the header
    s.once('error', reject);
    s.once('listening', () => {
      s.off('error', reject);
      resolve(s);
    });
  });
  server.on('error', (err) => logger.error({ event: 'api_server_error', err: err.message }, 'API server error'));
  const port = (server.address() as AddressInfo).port;
  const url = `http://${host.includes(':') ? `[${host}]` : host}:${port}`;
  logger.info({ event: 'api_listening', url, auth: tokens.length > 0 }, 'task API listening');
  let closed: Promise<void> | null = null;
  return {
    url,
    host,
    port,
    app,
    close() {
      // Open streams end first, so their connections do not hold the close.
      closed ??= hub.close().then(
        () =>
          new Promise<void>((resolve) => {
            server.close(() => resolve());
            server.closeIdleConnections();
            setTimeout(() => server.closeAllConnections(), 2000).unref();
          }),
      );
      return closed;
    },
  };
}
