import { fileURLToPath } from 'node:url';
import { createRatchet, type Ratchet, type RunView } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import { spawnTs, type Child } from '../helpers/child.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { startPrivateRedis, type PrivateRedis } from '../helpers/redis-server.js';
import { startWitness, type Witness } from '../helpers/witness.js';

export const FAULT_WORKFLOWS = fileURLToPath(new URL('../fixtures/fault-workflows', import.meta.url));

/** A Ratchet that only submits and reads (no worker), over the test database. */
export function submitter(databaseUrl: string): Promise<Ratchet> {
  return createRatchet({ databaseUrl, workflowsDir: FAULT_WORKFLOWS, logger: silentLogger(), poolSize: 3 });
}

export class Workers {
  private readonly all: Child[] = [];
  constructor(private readonly base: NodeJS.ProcessEnv) {}

  /** Starts a real worker process and waits until it serves. */
  async spawn(name: string, env: NodeJS.ProcessEnv = {}): Promise<Child & { owner: string }> {
    const child = spawnTs('test/fixtures/worker-process.ts', [name], { ...this.base, ...env });
    this.all.push(child);
    const ready = await child.line((o) => o.ready === true, 60_000);
    return Object.assign(child, { owner: ready.owner as string });
  }

  /** Every worker's stderr (pino JSON), condensed, for a failing test's report. */
  logs(): string {
    return this.all
      .map(
        (c, i) =>
          `--- worker ${i} (pid ${c.proc.pid})\n` +
          c
            .stderr()
            .split('\n')
            .map((l) => {
              try {
                const o = JSON.parse(l) as Record<string, unknown>;
                return `${new Date(o.time as number).toISOString()} ${String(o.event)} ${String(o.msg)} ${String(o.err ?? '')}`;
              } catch {
                return l;
              }
            })
            .join('\n'),
      )
      .join('\n');
  }

  async killAll(): Promise<void> {
    for (const c of this.all) {
      if (c.proc.exitCode === null && c.proc.signalCode === null) {
        c.proc.kill('SIGCONT');
        c.proc.kill('SIGKILL');
      }
      await c.exit;
    }
    this.all.length = 0;
  }
}

/** Polls a run until `pred` holds (bounded). */
export async function waitRun(
  r: Ratchet,
  id: string,
  pred: (run: RunView) => boolean,
  timeoutMs = 60_000,
  what = 'run condition',
): Promise<RunView> {
  const until = Date.now() + timeoutMs;
  let last: RunView | null = null;
  while (Date.now() < until) {
    last = await r.getRun(id);
    if (last && pred(last)) return last;
    await new Promise((res) => setTimeout(res, 50));
  }
  throw new Error(`timed out waiting for ${what}; last: ${JSON.stringify(last)}`);
}

export async function waitEvents(
  r: Ratchet,
  id: string,
  pred: (types: { type: string; fence: string | null }[]) => boolean,
  timeoutMs = 30_000,
  what = 'events',
) {
  const until = Date.now() + timeoutMs;
  let last: { type: string; fence: string | null }[] = [];
  while (Date.now() < until) {
    last = (await r.events(id)).map((e) => ({ type: e.type, fence: e.fence }));
    if (pred(last)) return last;
    await new Promise((res) => setTimeout(res, 100));
  }
  throw new Error(`timed out waiting for ${what}; last: ${JSON.stringify(last)}`);
}

export interface FaultHarness {
  db: TestDatabase;
  witness: Witness;
  redis: PrivateRedis | null;
  r: Ratchet;
  workers: Workers;
  close(): Promise<void>;
}

/**
 * What every fault test file stands on: its own database, the fenced witness, a submitter,
 * worker processes wired to them (and to a private Redis when asked), torn down in order.
 */
export async function openFaultHarness(label: string, opts: { redis?: boolean; env?: NodeJS.ProcessEnv } = {}): Promise<FaultHarness> {
  const db = await createTestDatabase(label);
  const witness = await startWitness(db.url);
  const redis = opts.redis ? await startPrivateRedis() : null;
  const r = await submitter(db.url);
  const workers = new Workers({ DATABASE_URL: db.url, WITNESS_URL: witness.url, ...(redis ? { REDIS_URL: redis.url } : {}), ...opts.env });
  return {
    db,
    witness,
    redis,
    r,
    workers,
    async close() {
      await workers.killAll();
      await r.close();
      await redis?.close();
      await witness.close();
      await db.drop();
    },
  };
}

/** afterEach: a failing test prints the workers' condensed logs; workers are killed unless kept. */
export function reportAndKill(workers: () => Workers, opts: { keep?: boolean } = {}) {
  return async (ctx: { task: { result?: { state?: string } } }) => {
    if (ctx.task.result?.state === 'fail') console.error(workers().logs().slice(-20_000));
    if (!opts.keep) await workers().killAll();
  };
}
