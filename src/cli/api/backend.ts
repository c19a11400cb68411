import { existsSync } from 'node:fs';
import type { RunService } from '../../api/service.js';
import { createRunService } from '../../api/service.js';
import { createWaitService, type WaitService } from '../../api/wait-service.js';
import { userInfo } from 'node:os';
import { createClient } from '../../client/client.js';
import { loadWorkflows } from '../../definitions/loader.js';
import { createRatchet } from '../../engine.js';
import { DataDirLockedError } from '../../errors.js';
import { bearerToken, cliLogger, serverUrl, storeTarget, workflowsDir, type GlobalOptions } from './options.js';

/** What status / list / events / explain / cancel / retry need, from a server or from the store. */
export type Backend = Pick<RunService, 'get' | 'list' | 'events' | 'explain' | 'cancel' | 'retry'> & {
  readonly where: string;
  /** Waits (issue 10): a signal, a decision on a gated call, what waits for a person. */
  signal(runId: string, name: string, payload: unknown, signalId?: string): ReturnType<WaitService['signal']>;
  approve(runId: string, a: { stageId?: string; input?: unknown; reason?: string; by?: string }): ReturnType<WaitService['approve']>;
  reject(runId: string, a: { stageId?: string; reason?: string; by?: string }): ReturnType<WaitService['reject']>;
  approvals(q?: { runId?: string; limit?: number }): ReturnType<WaitService['approvals']>;
  close(): Promise<void>;
};

/**
 * A server when a URL is given (--url / RATCHET_URL), through ratchet/client; else the store
 * directly (DATABASE_URL, or the embedded data directory, which one process holds at a time:
 * while `ratchet dev` or `serve` holds it, talk to that process with --url). Workflows are
 * loaded only when asked for (explain reads class limits from them) and when they exist.
 */
export async function openBackend(o: GlobalOptions & { workflowsDir?: string }, opts: { workflows?: boolean } = {}): Promise<Backend> {
  const url = serverUrl(o);
  if (url) {
    const client = createClient({ baseUrl: url, token: bearerToken(o) });
    return {
      where: url,
      get: (id) => client.get(id),
      list: async (q = {}) =>
        client.list({
          ...(q.state ? { state: q.state.split(',') as never } : {}),
          workflow: q.workflow,
          createdAfter: q.createdAfter,
          createdBefore: q.createdBefore,
          cursor: q.cursor,
          ...(q.limit ? { limit: Number(q.limit) } : {}),
        }),
      events: (id, q = {}) => client.events(id, { after: q.after, ...(q.limit ? { limit: Number(q.limit) } : {}) }),
      explain: (id) => client.explain(id),
      cancel: (id) => client.cancel(id),
      retry: (id) => client.retry(id),
      signal: async (id, name, payload, signalId) => {
        const { httpStatus: _s, ...res } = await client.signal(id, name, payload, signalId ? { signalId } : {});
        return res;
      },
      approve: (id, a) => client.approve(id, a),
      reject: (id, a) => client.reject(id, a),
      approvals: (q) => client.approvals(q),
      close: async () => {},
    };
  }
  const dir = workflowsDir(o.workflowsDir);
  const workflows = opts.workflows && existsSync(dir) ? await loadWorkflows(dir) : [];
  const target = storeTarget(o);
  let ratchet;
  try {
    ratchet = await createRatchet({ ...target, workflows, logger: cliLogger() });
  } catch (err) {
    if (err instanceof DataDirLockedError) {
      throw new DataDirLockedError(
        err.dataDir,
        `${err.holder}; if that is \`ratchet dev\` or \`ratchet serve\`, ask it instead: --url http://127.0.0.1:7700 (or RATCHET_URL)`,
      );
    }
    throw err;
  }
  const service = createRunService(ratchet);
  const waits = createWaitService(ratchet);
  // Without a server there is no token: a decision records the operating-system user who ran the command.
  const cliUser = `cli:${userInfo().username}`;
  return {
    where:
      ratchet.store.kind === 'postgres' ? 'PostgreSQL' : `embedded PGlite${ratchet.store.dataDir ? ` at ${ratchet.store.dataDir}` : ''}`,
    get: service.get,
    list: service.list,
    events: service.events,
    explain: service.explain,
    cancel: service.cancel,
    retry: service.retry,
    signal: (id, name, payload, signalId) => waits.signal(id, name, payload, { ...(signalId ? { signalId } : {}), sentBy: cliUser }),
    approve: (id, a) => waits.approve(id, a, cliUser),
    reject: (id, a) => waits.reject(id, a, cliUser),
    approvals: (q) => waits.approvals(q),
    close: () => ratchet.close(),
  };
}

/** Opens a backend, runs `fn`, always closes it. */
export async function withBackend<T>(
  o: GlobalOptions & { workflowsDir?: string },
  fn: (b: Backend) => Promise<T>,
  opts: { workflows?: boolean } = {},
): Promise<T> {
  const b = await openBackend(o, opts);
  try {
    return await fn(b);
  } finally {
    await b.close();
  }
}
