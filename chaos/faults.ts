import type { PrivateRedis } from '../test/helpers/redis-server.js';
import type { Driver } from './driver.js';
import type { FaultKind, FaultRecord } from './history.js';
import type { PrivatePostgres } from './postgres.js';
import type { Prng } from './prng.js';
import type { ChaosReceiver } from './receiver.js';
import { BLOCK_MS, type ChaosWorker, type WorkerPool } from './workers.js';

/**
 * The fault injector: at random moments from the seed, one of the faults of issue 13, at most
 * MAX_ACTIVE at once, never two on one worker, never two global ones (PostgreSQL or Redis
 * restart) at once. Each fault heals itself (a killed worker is replaced, a paused one
 * continued, a cut link restored) and is recorded with its start and end.
 */
export const LEASE_MS = 3000;
const MAX_ACTIVE = 2;
/** Workers left untouched by faults at any moment. */
const KEEP_HEALTHY = 1;

const WEIGHTS = {
  sigkill: 3,
  sigstop: 2,
  pg_blackhole: 2,
  receiver_cut: 2,
  loop_block: 2,
  redis_flushall: 1,
  redis_restart: 1,
  pg_restart: 1,
  tenant_flood: 1,
} as const satisfies Partial<Record<FaultKind, number>>;
type RandomFault = keyof typeof WEIGHTS;
const GLOBAL: FaultKind[] = ['pg_restart', 'redis_restart'];
const MAX_FLOODS = 2;

export interface InjectorDeps {
  rng: Prng;
  pool: WorkerPool;
  receiver: ChaosReceiver;
  redis: PrivateRedis;
  pg: PrivatePostgres;
  driver: Driver;
  faults: FaultRecord[];
  log: (line: string) => void;
  /** The version new workers run (2 once the rolling deploy began). */
  version: { current: 1 | 2 };
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

export class FaultInjector {
  private readonly active = new Set<Promise<void>>();
  private globalActive = false;
  private floods = 0;
  constructor(private readonly d: InjectorDeps) {}

  private record(kind: FaultKind, at: number, extra: Partial<FaultRecord> = {}): void {
    this.d.faults.push({ kind, at, endAt: Date.now(), ...extra });
    this.d.log(`fault ${kind} ${extra.worker ?? ''} ${extra.detail ?? ''} (${Date.now() - at} ms)`);
  }

  /** A live worker no fault is acting on, leaving KEEP_HEALTHY others alone; marked busy. */
  private target(): ChaosWorker | null {
    const free = this.d.pool.live.filter((w) => !w.busy && !w.exited);
    if (free.length <= KEEP_HEALTHY) return null;
    const w = this.d.rng.pick(free);
    w.busy = true;
    return w;
  }

  private async replace(dead: ChaosWorker): Promise<void> {
    await sleep(this.d.rng.int(500, 2000));
    await this.d.pool.spawn(this.d.version.current);
    void dead;
  }

  private async inject(kind: RandomFault): Promise<void> {
    const { rng, pool, redis, pg, receiver } = this.d;
    const at = Date.now();
    switch (kind) {
      case 'sigkill': {
        const w = this.target();
        if (!w) return;
        await pool.kill(w);
        this.record(kind, at, { worker: w.name, owner: w.owner });
        await this.replace(w);
        return;
      }
      case 'sigstop': {
        const w = this.target();
        if (!w) return;
        const ms = LEASE_MS + rng.int(1000, 3000);
        w.child.proc.kill('SIGSTOP');
        await sleep(ms);
        w.child.proc.kill('SIGCONT');
        w.busy = false;
        return this.record(kind, at, { worker: w.name, owner: w.owner, detail: `paused ${ms} ms` });
      }
      case 'loop_block': {
        const w = this.target();
        if (!w) return;
        w.child.proc.kill('SIGUSR2');
        await sleep(BLOCK_MS + 200);
        w.busy = false;
        return this.record(kind, at, { worker: w.name, owner: w.owner, detail: `blocked ${BLOCK_MS} ms` });
      }
      case 'pg_blackhole': {
        const w = this.target();
        if (!w) return;
        const ms = LEASE_MS + rng.int(500, 3000);
        w.pgProxy.setMode('blackhole');
        await sleep(ms);
        w.pgProxy.setMode('reset'); // frees the backends the partition left behind (their locks too)
        w.pgProxy.setMode('pass');
        w.busy = false;
        return this.record(kind, at, { worker: w.name, owner: w.owner, detail: `partitioned ${ms} ms` });
      }
      case 'receiver_cut': {
        const w = this.target();
        if (!w) return;
        const fired = await receiver.cutAfterNext(w.name, () => w.rxProxy.setMode('blackhole'), 8000);
        if (fired) await sleep(rng.int(1000, 7000)); // the tool waits for its answer (timeout, or its lease's end)
        w.rxProxy.setMode('reset');
        w.rxProxy.setMode('pass');
        w.busy = false;
        return this.record(kind, at, {
          worker: w.name,
          owner: w.owner,
          detail: fired ? 'answer lost after the effect' : 'no request came',
        });
      }
      case 'redis_flushall':
        await redis.flushAll().catch(() => {});
        return this.record(kind, at);
      case 'redis_restart': {
        if (this.globalActive) return;
        this.globalActive = true;
        const ms = rng.int(1000, 4000);
        await redis.stop(rng.chance(0.5) ? 'SIGKILL' : 'SIGTERM');
        await sleep(ms);
        await redis.start();
        this.globalActive = false;
        return this.record(kind, at, { detail: `down ${ms} ms` });
      }
      case 'pg_restart': {
        if (this.globalActive) return;
        this.globalActive = true;
        try {
          await pg.restart();
        } finally {
          this.globalActive = false;
        }
        return this.record(kind, at, { detail: 'pg_ctl restart -m immediate (private cluster)' });
      }
      case 'tenant_flood': {
        if (this.floods >= MAX_FLOODS) return;
        this.floods++;
        const n = rng.int(40, 80);
        await this.d.driver.flood(n);
        return this.record(kind, at, { detail: `${n} runs of tenant flood` });
      }
    }
  }

  /**
   * A rolling deploy: each worker of version 1 in turn is replaced by one of version 2 (loaded
   * with both versions): the new one serves first, then the old one drains (SIGTERM) while
   * version 1 runs are in flight.
   */
  async rollingDeploy(): Promise<void> {
    const at = Date.now();
    this.d.version.current = 2;
    let replaced = 0;
    for (let round = 0; round < 50; round++) {
      const old = this.d.pool.live.find((w) => w.version === 1 && !w.busy && !w.exited);
      if (!old) {
        if (!this.d.pool.live.some((w) => w.version === 1 && !w.exited)) break;
        await sleep(500); // a fault is acting on it: wait for it to heal
        continue;
      }
      old.busy = true;
      await this.d.pool.spawn(2);
      await this.d.pool.stop(old);
      replaced++;
    }
    this.record('rolling_deploy', at, { detail: `${replaced} workers replaced by version 2` });
  }

  /** Injects faults until `until`; the rolling deploy starts at `deployAt`. Waits for every fault to heal. */
  async run(until: number, deployAt: number): Promise<void> {
    let deploy: Promise<void> | null = null;
    for (let i = 0; i < 100_000 && Date.now() < until; i++) {
      await sleep(this.d.rng.int(1500, 5000));
      if (!deploy && Date.now() >= deployAt) {
        deploy = this.rollingDeploy().catch((err: unknown) => this.d.log(`deploy failed: ${String(err)}`));
      }
      if (this.active.size >= MAX_ACTIVE || Date.now() >= until) continue;
      const kind = this.d.rng.weighted(WEIGHTS);
      if (GLOBAL.includes(kind) && this.globalActive) continue;
      const p: Promise<void> = this.inject(kind)
        .catch((err: unknown) => this.d.log(`fault ${kind} failed: ${(err as Error).stack ?? String(err)}`))
        .finally(() => this.active.delete(p));
      this.active.add(p);
    }
    await Promise.all([...this.active]);
    if (deploy) await deploy;
  }
}
