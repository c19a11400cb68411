import type { Logger } from 'pino';
import {
  checkListenOptions,
  createServer,
  DEFAULT_API_HOST,
  DEFAULT_API_PORT,
  DEFAULT_BODY_LIMIT,
  type ApiServer,
} from '../../api/server.js';
import { createRatchet, type Ratchet } from '../../engine.js';
import type { Worker } from '../../worker/worker.js';
import { intOption, storeTarget, workflowsDir, type GlobalOptions } from './options.js';

export interface ServeOptions extends GlobalOptions {
  host?: string;
  port?: string;
  bodyLimit?: string;
  workflowsDir?: string;
}

const pick = (...values: (string | undefined)[]): string | undefined => values.find((v) => v !== undefined && v !== '');

/** Accepted tokens: --token (or RATCHET_TOKEN), plus RATCHET_TOKENS (comma-separated) for rotation. */
export function serverTokens(o: GlobalOptions): string[] {
  const one = pick(o.token, process.env.RATCHET_TOKEN);
  const many = (process.env.RATCHET_TOKENS ?? '')
    .split(',')
    .map((t) => t.trim())
    .filter(Boolean);
  return [...new Set([...(one ? [one] : []), ...many])];
}

/** Flags over environment (RATCHET_HOST, RATCHET_PORT, RATCHET_BODY_LIMIT) over defaults (127.0.0.1:7700, 1 MiB). */
export function listenOptions(o: ServeOptions): { host: string; port: number; bodyLimit: number; tokens: string[] } {
  return {
    host: pick(o.host, process.env.RATCHET_HOST) ?? DEFAULT_API_HOST,
    port: intOption(pick(o.port, process.env.RATCHET_PORT) ?? String(DEFAULT_API_PORT), '--port', 0, 65535),
    bodyLimit: intOption(
      pick(o.bodyLimit, process.env.RATCHET_BODY_LIMIT) ?? String(DEFAULT_BODY_LIMIT),
      '--body-limit',
      64,
      100 * 1024 * 1024,
    ),
    tokens: serverTokens(o),
  };
}

/**
 * `serve` and `dev`: a Ratchet (the workflows loaded, for submit), the task API and, for dev,
 * a worker serving every class. Prints one line when listening; runs until SIGINT / SIGTERM,
 * then stops the worker (in-flight stages get `graceMs`), the server and the store.
 */
export async function serveUntilSignal(o: ServeOptions, logger: Logger, opts: { worker: boolean; graceMs: number }): Promise<void> {
  // Every listening option is checked (as createServer will) before the store opens: a refused
  // flag leaves no data directory, lock file or migration behind.
  const listen = listenOptions(o);
  checkListenOptions(listen, 'listen');
  let ratchet: Ratchet | undefined;
  let server: ApiServer | undefined;
  let worker: Worker | undefined;
  try {
    ratchet = await createRatchet({ ...storeTarget(o), workflowsDir: workflowsDir(o.workflowsDir), logger });
    if (opts.worker) {
      worker = ratchet.worker({ graceMs: opts.graceMs });
      await worker.start();
    }
    server = await createServer({ ratchet, ...listen, logger });
    const ready = {
      type: 'api_listening',
      url: server.url,
      auth: listen.tokens.length > 0,
      backend: ratchet.store.kind,
      dataDir: ratchet.store.dataDir,
      workflows: ratchet.registry.list().map((w) => w.name),
      worker: worker ? { owner: worker.owner, classes: worker.classes } : null,
    };
    process.stdout.write(
      o.json
        ? `${JSON.stringify(ready)}\n`
        : `task API on ${server.url} (${listen.tokens.length > 0 ? 'bearer token required' : 'no token: loopback only'}), ` +
            `${ratchet.store.kind === 'pglite' ? `embedded PGlite${ratchet.store.dataDir ? ` at ${ratchet.store.dataDir}` : ''}` : 'PostgreSQL'}` +
            `${worker ? `, worker serving ${worker.classes.join(', ') || 'no classes'}` : ''}; workflows: ${ready.workflows.join(', ') || 'none'}\n`,
    );
    await new Promise<void>((resolve) => {
      const stop = (signal: string) => {
        logger.info({ event: 'server_stopping', signal }, 'stopping');
        process.off('SIGTERM', onTerm);
        process.off('SIGINT', onInt);
        resolve();
      };
      const onTerm = () => stop('SIGTERM');
      const onInt = () => stop('SIGINT');
      process.on('SIGTERM', onTerm);
      process.on('SIGINT', onInt);
    });
  } finally {
    await server?.close();
    await worker?.stop({ graceMs: opts.graceMs });
    await ratchet?.close();
  }
}
