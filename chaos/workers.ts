import { fileURLToPath } from 'node:url';
import { spawnTs, type Child } from '../test/helpers/child.js';
import { startTcpProxy, type TcpProxy } from '../test/helpers/tcp-proxy.js';

const WORKFLOWS = (version: 1 | 2) => fileURLToPath(new URL(`./workflows/v${version}`, import.meta.url));

/** Event loop block of the loop_block fault: past the 3 s lease. */
export const BLOCK_MS = 4500;

export interface ChaosWorker {
  readonly name: string;
  readonly owner: string;
  readonly version: 1 | 2;
  readonly child: Child;
  /** This worker's link to PostgreSQL. */
  readonly pgProxy: TcpProxy;
  /** This worker's link to the receiver. */
  readonly rxProxy: TcpProxy;
  /** A fault is acting on it (never two at once on one worker). */
  busy: boolean;
  /** Event-loop blocks asked of it (SIGUSR2); it prints {"blocking":true,"n":<this>} when each starts. */
  blocks: number;
  exited: boolean;
}

export interface PoolTargets {
  pgUrl: string;
  redisUrl: string;
  receiverUrl: string;
  modelUrl: string;
}

/**
 * The soak's worker processes, each with its own link proxies (to PostgreSQL and to the
 * receiver) in this process, so one worker's links can be cut alone.
 */
export class WorkerPool {
  readonly live: ChaosWorker[] = [];
  private readonly all: ChaosWorker[] = [];
  private count = 0;
  /** If the soak's process exits without closeAll (SIGINT, a crash), no worker is left behind. */
  private readonly onExit = () => {
    for (const w of this.all) if (!w.exited) w.child.proc.kill('SIGKILL');
  };
  constructor(
    private readonly targets: PoolTargets,
    private readonly log: (line: string) => void,
  ) {
    process.on('exit', this.onExit);
  }

  /**
   * Starts a worker process as a supervisor would: one that dies before it is ready (its start-up met a PostgreSQL
   * restart, say: the migrator's connection reset) is started again, up to 3 times, a second apart.
   */
  async spawn(version: 1 | 2): Promise<ChaosWorker> {
    for (let i = 1; ; i++) {
      try {
        return await this.spawnOnce(version);
      } catch (err) {
        if (i >= 3) throw err;
        this.log(`worker start failed (attempt ${i}), starting it again: ${(err as Error).message.slice(0, 200)}`);
        await new Promise((r) => setTimeout(r, 1000));
      }
    }
  }

  private async spawnOnce(version: 1 | 2): Promise<ChaosWorker> {
    const name = `w${++this.count}v${version}`;
    const pg = new URL(this.targets.pgUrl);
    const rx = new URL(this.targets.receiverUrl);
    const pgProxy = await startTcpProxy({ target: { host: pg.hostname, port: Number(pg.port) } });
    const rxProxy = await startTcpProxy({ target: { host: rx.hostname, port: Number(rx.port) } });
    const child = spawnTs('chaos/worker-process.ts', [name], {
      DATABASE_URL: withApplicationName(pgProxy.url(this.targets.pgUrl), name),
      RECEIVER_URL: rxProxy.url(this.targets.receiverUrl).replace(/\/$/, ''),
      REDIS_URL: this.targets.redisUrl,
      OPENAI_BASE_URL: this.targets.modelUrl,
      OPENAI_API_KEY: 'chaos',
      WORKFLOWS_DIR: WORKFLOWS(version),
      CHAOS_WORKER: name,
      BLOCK_MS: String(BLOCK_MS),
    });
    let ready: Record<string, unknown>;
    try {
      ready = await child.line((o) => o.ready === true, 90_000);
    } catch (err) {
      child.proc.kill('SIGKILL');
      await pgProxy.close();
      await rxProxy.close();
      throw err;
    }
    const w: ChaosWorker = { name, owner: String(ready.owner), version, child, pgProxy, rxProxy, busy: false, blocks: 0, exited: false };
    void child.exit.then((e) => {
      w.exited = true;
      const i = this.live.indexOf(w);
      if (i >= 0) this.live.splice(i, 1);
      this.log(`worker ${name} exited ${JSON.stringify(e)}`);
    });
    this.live.push(w);
    this.all.push(w);
    this.log(`worker ${name} ready (${w.owner})`);
    return w;
  }

  /** Drops `w` from the live set now (it is about to be killed or stopped for good). */
  retire(w: ChaosWorker): void {
    const i = this.live.indexOf(w);
    if (i >= 0) this.live.splice(i, 1);
  }

  /** Graceful stop (SIGTERM: drain, release leases), bounded; SIGKILL after `ms`. */
  async stop(w: ChaosWorker, ms = 15_000): Promise<void> {
    this.retire(w);
    w.child.proc.kill('SIGCONT');
    w.child.proc.kill('SIGTERM');
    const t = setTimeout(() => w.child.proc.kill('SIGKILL'), ms);
    await w.child.exit;
    clearTimeout(t);
    await w.pgProxy.close();
    await w.rxProxy.close();
  }

  async kill(w: ChaosWorker): Promise<void> {
    this.retire(w);
    w.child.proc.kill('SIGKILL');
    await w.child.exit;
    await w.pgProxy.close();
    await w.rxProxy.close();
  }

  /** The last lines of every worker's stderr (for a failing soak's report). */
  logs(maxPerWorker = 4000): string {
    return this.all.map((w) => `--- ${w.name} (${w.owner})\n${w.child.stderr().slice(-maxPerWorker)}`).join('\n');
  }

  async closeAll(): Promise<void> {
    await Promise.all(
      this.all.map(async (w) => {
        if (!w.exited) {
          w.child.proc.kill('SIGCONT');
          w.child.proc.kill('SIGKILL');
          await w.child.exit;
        }
        await w.pgProxy.close();
        await w.rxProxy.close();
      }),
    );
    this.live.length = 0;
    process.off('exit', this.onExit);
  }
}

/**
 * `url` with application_name=`name`: the worker's every connection names it (node-postgres lets
 * the connection string's application_name win over the store's own), so the trigger log
 * (chaos/history.sql.ts) records which worker wrote each row.
 */
export function withApplicationName(url: string, name: string): string {
  const u = new URL(url);
  u.searchParams.set('application_name', name);
  return u.toString();
}
