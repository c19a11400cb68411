import type { PrivateRedis } from '../test/helpers/redis-server.js';
import type { Driver } from './driver.js';
import type { FaultKind, FaultRecord } from './history.js';
import type { PrivatePostgres } from './postgres.js';
import type { Prng } from './prng.js';
import type { ChaosReceiver } from './receiver.js';
import { BLOCK_MS, type ChaosWorker, type WorkerPool } from './workers.js';
import { sleep } from './sleep.js';

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
  late_request: 2,
  loop_block: 2,
  redis_flushall: 1,
  redis_restart: 1,
  pg_restart: 1,
  tenant_flood: 1,
} as const satisfies Partial<Record<FaultKind, number>>;
export type RandomFault = keyof typeof WEIGHTS;
export const RANDOM_FAULTS = Object.keys(WEIGHTS) as RandomFault[];
const GLOBAL: FaultKind[] = ['pg_restart', 'redis_restart'];
const MAX_FLOODS = 2;
/** Floods start in the first half of the soak, so their backlog drains before the terminal bound starts counting. */
const FLOOD_BEFORE = 0.5;
/** Longest a planned fault waits for its turn (a free slot, a free worker, no global fault) before it is given up. */
const TURN_WAIT_MS = 20_000;
/** Verdicts of a late request that judged its fence (refused it, replayed the done effect, or wrongly admitted it). */
const LATE_JUDGED = ['stale_fence', 'replayed', 'applied', 'not_stored'];
/** The extra pause / partition past the lease (sigstop, pg_blackhole): at most this long. */
export const PAST_LEASE_MAX_MS = 3000;

/**
 * One planned fault: everything the seed decides about it, drawn at planning time from its own
 * fork (rng.fork('fault-' + k)), before the soak starts. What the moment decides (which workers
 * are free, whether a request comes) is an outcome, recorded in the history, not planned.
 */
export interface PlannedFault {
  k: number;
  kind: RandomFault;
  /** Planned start, ms after the soak's start (a fault waiting for its turn starts later). */
  atMs: number;
  /** Which free worker it hits: index = floor(pick × free workers at that moment). */
  pick: number;
  /** The fault's own duration or size (pause, partition, downtime, flood size...). */
  n: number;
  signal?: 'SIGKILL' | 'SIGTERM';
}

/** The whole fault schedule of a soak of `durationMs`: one shuffled round of every kind first, then weighted draws. */
export function planFaults(rng: Prng, durationMs: number): { faults: PlannedFault[]; deployAtMs: number } {
  const first = rng.fork('first-round');
  const round = [...RANDOM_FAULTS];
  for (let i = round.length - 1; i > 0; i--) {
    const j = first.int(0, i);
    [round[i], round[j]] = [round[j]!, round[i]!];
  }
  // The flood early in the round (its backlog must drain well before the end).
  const fi = round.indexOf('tenant_flood');
  if (fi > 2) [round[fi], round[2]] = [round[2]!, round[fi]!];
  const faults: PlannedFault[] = [];
  let floods = 0;
  let atMs = 0;
  for (let k = 0; k < 10_000; k++) {
    const f = rng.fork(`fault-${k}`);
    atMs += f.int(1500, 5000);
    if (atMs >= durationMs) break;
    let kind: RandomFault = k < round.length ? round[k]! : f.weighted(WEIGHTS);
    while (kind === 'tenant_flood' && (floods >= MAX_FLOODS || (k >= round.length && atMs > durationMs * FLOOD_BEFORE)))
      kind = f.weighted(WEIGHTS);
    if (kind === 'tenant_flood') floods++;
    const n =
      kind === 'sigstop' || kind === 'pg_blackhole'
        ? LEASE_MS + f.int(500, PAST_LEASE_MAX_MS)
        : kind === 'receiver_cut'
          ? f.int(1000, 7000)
          : kind === 'redis_restart'
            ? f.int(1000, 4000)
            : kind === 'tenant_flood'
              ? f.int(20, 40)
              : kind === 'sigkill'
                ? f.int(500, 2000) // the replacement's delay
                : 0;
    faults.push({
      k,
      kind,
      atMs,
      pick: f.next(),
      n,
      ...(kind === 'redis_restart' ? { signal: f.chance(0.5) ? ('SIGKILL' as const) : ('SIGTERM' as const) } : {}),
    });
  }
  const deployAtMs = Math.round(durationMs * (0.3 + 0.3 * rng.fork('deploy').next()));
  return { faults, deployAtMs };
}

export interface InjectorDeps {
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

/** Idempotency key and fence of the first whole HTTP request in `bytes` (a held request), or null. */
export function heldRequest(bytes: Buffer): { key: string; fence: string } | null {
  const text = bytes.toString('latin1');
  const end = text.indexOf('\r\n\r\n');
  if (end < 0) return null;
  const head = text.slice(0, end);
  if (!head.startsWith('POST /effect')) return null;
  const key = /\r\nidempotency-key: *([^\r\n]+)/i.exec(head)?.[1];
  const fence = /\r\nx-execution-fence: *(\d+)/i.exec(head)?.[1];
  return key && fence ? { key: key.trim(), fence } : null;
}

export class FaultInjector {
  private readonly active = new Set<Promise<void>>();
  private globalActive = false;
  /** When the rolling deploy began (null until it does). */
  deployStartedAt: number | null = null;
  constructor(private readonly d: InjectorDeps) {}

  private record(kind: FaultKind, at: number, extra: Partial<FaultRecord> = {}): void {
    this.d.faults.push({ kind, at, endAt: Date.now(), ...extra });
    this.d.log(`fault ${kind} ${extra.worker ?? ''} ${extra.detail ?? ''} (${Date.now() - at} ms)`);
  }

  /** A live worker no fault is acting on, leaving KEEP_HEALTHY others alone (waits for one, bounded); marked busy. */
  private async target(pick: number): Promise<ChaosWorker | null> {
    for (const until = Date.now() + TURN_WAIT_MS; ; ) {
      const free = this.d.pool.live.filter((w) => !w.busy && !w.exited);
      if (free.length > KEEP_HEALTHY) {
        const w = free[Math.min(free.length - 1, Math.floor(pick * free.length))]!;
        w.busy = true;
        return w;
      }
      if (Date.now() >= until) return null;
      await sleep(200);
    }
  }

  /** Injects one planned fault; false when the moment did not allow it (not recorded). */
  private async inject(f: PlannedFault): Promise<boolean | void> {
    const { pool, redis, pg, receiver } = this.d;
    const { kind } = f;
    const needsWorker = !['redis_flushall', 'redis_restart', 'pg_restart', 'tenant_flood'].includes(kind);
    const w = needsWorker ? await this.target(f.pick) : null;
    if (needsWorker && !w) {
      this.d.log(`fault ${kind} #${f.k}: no free worker in ${TURN_WAIT_MS} ms (not injected)`);
      return false;
    }
    // The fault starts now, once its worker was found (the wait for a free one is not part of it:
    // a kill's reclaim latency is measured from here).
    const at = Date.now();
    switch (kind) {
      case 'sigkill': {
        await pool.kill(w!);
        this.record(kind, at, { worker: w!.name, owner: w!.owner });
        await sleep(f.n);
        await pool.spawn(this.d.version.current);
        return;
      }
      case 'sigstop': {
        w!.child.proc.kill('SIGSTOP');
        await sleep(f.n);
        w!.child.proc.kill('SIGCONT');
        w!.busy = false;
        return this.record(kind, at, { worker: w!.name, owner: w!.owner, detail: `paused ${f.n} ms` });
      }
      case 'loop_block': {
        const n = ++w!.blocks;
        w!.child.proc.kill('SIGUSR2');
        // The block is real only once the worker says it is blocking (its busy loop started).
        await w!.child.line((o) => o.blocking === true && o.n === n, 10_000);
        await sleep(BLOCK_MS + 200);
        w!.busy = false;
        return this.record(kind, at, { worker: w!.name, owner: w!.owner, detail: `blocked ${BLOCK_MS} ms` });
      }
      case 'pg_blackhole': {
        w!.pgProxy.setMode('blackhole');
        await sleep(f.n);
        w!.pgProxy.setMode('reset'); // frees the backends the partition left behind (their locks too)
        w!.pgProxy.setMode('pass');
        w!.busy = false;
        return this.record(kind, at, { worker: w!.name, owner: w!.owner, detail: `partitioned ${f.n} ms` });
      }
      case 'receiver_cut': {
        const fired = await receiver.cutAfterNext(w!.name, () => w!.rxProxy.setMode('blackhole'), 8000);
        if (fired) await sleep(f.n); // the tool waits for its answer (timeout, or its lease's end)
        w!.rxProxy.setMode('reset');
        w!.rxProxy.setMode('pass');
        w!.busy = false;
        // Counted only when an effect was applied and its answer lost; otherwise it did nothing.
        if (fired) return this.record(kind, at, { worker: w!.name, owner: w!.owner, detail: 'answer lost after the effect' });
        this.d.log(`fault receiver_cut #${f.k} on ${w!.name}: no applied request in 8 s (not counted)`);
        return false;
      }
      case 'late_request':
        return this.lateRequest(f, w!, at);
      case 'redis_flushall': {
        // Not while a Redis restart has it down (seed 30, 1800 s: 6 flushes refused, injection_failed).
        await this.globalTurn();
        try {
          await redis.flushAll();
        } finally {
          this.globalActive = false;
        }
        return this.record(kind, at);
      }
      case 'redis_restart': {
        await this.globalTurn();
        try {
          await redis.stop(f.signal ?? 'SIGTERM');
          await sleep(f.n);
          await redis.start();
        } finally {
          this.globalActive = false;
        }
        return this.record(kind, at, { detail: `down ${f.n} ms (${f.signal})` });
      }
      case 'pg_restart': {
        await this.globalTurn();
        try {
          await pg.restart();
        } finally {
          this.globalActive = false;
        }
        return this.record(kind, at, { detail: 'pg_ctl restart -m immediate (private cluster)' });
      }
      case 'tenant_flood': {
        await this.d.driver.flood(f.k, f.n);
        return this.record(kind, at, { detail: `${f.n} runs of tenant flood` });
      }
    }
  }

  /** Waits (bounded) until no other global fault acts, then takes the global slot. */
  private async globalTurn(): Promise<void> {
    for (const until = Date.now() + TURN_WAIT_MS; this.globalActive && Date.now() < until; ) await sleep(200);
    if (this.globalActive) throw new Error('another global fault held the slot for too long');
    this.globalActive = true;
  }

  /**
   * A late request: the worker's link to the receiver holds its bytes once an effect request
   * was sent; the worker is paused past its lease, so another worker reclaims the stage and
   * sends the same key with a higher fence, which the receiver admits (and answers 503, so the
   * key stays open); only then are the held bytes released: the old fence arrives late and must
   * be refused stale_fence.
   */
  private async lateRequest(f: PlannedFault, w: ChaosWorker, at: number): Promise<boolean | void> {
    let req = null as { key: string; fence: string } | null;
    w.rxProxy.setMode('hold');
    try {
      for (const until = Date.now() + 10_000; !req && Date.now() < until; ) {
        await sleep(20);
        const held = w.rxProxy.held();
        for (const b of held) req ??= heldRequest(b);
        // Another request (a /flaky probe) caught in the hold: let it through and keep holding.
        if (!req && held.length > 0 && held.every((b) => b.includes('\r\n\r\n') && !b.toString('latin1').startsWith('POST /effect'))) {
          w.rxProxy.setMode('pass');
          w.rxProxy.setMode('hold');
        }
      }
      if (!req) {
        this.d.log(`fault late_request #${f.k} on ${w.name}: no effect request in 10 s (not injected)`);
        return false;
      }
      w.child.proc.kill('SIGSTOP'); // no heartbeat: the lease lapses and another worker reclaims
      const answered = await this.d.receiver.failNextAbove(req.key, req.fence, 20_000);
      w.rxProxy.setMode('pass'); // the late request arrives now
      // The held request's arrival after the higher fence's admission (what the checker judges).
      const ledger = this.d.receiver.ledger;
      const admitted = ledger.find((l) => l.key === req!.key && l.verdict === 'not_stored' && BigInt(l.fence) > BigInt(req!.fence));
      const late = () =>
        ledger.find(
          (l) => l.key === req!.key && l.fence === req!.fence && l.answeredAt !== null && admitted !== undefined && l.seq > admitted.seq,
        );
      for (const until = Date.now() + 5000; !late() && Date.now() < until; ) await sleep(50);
      w.child.proc.kill('SIGCONT');
      const arrived = late();
      if (!answered || !arrived) {
        this.d.log(
          `fault late_request #${f.k} on ${w.name}: ${req.key} ${answered ? 'held request not delivered' : 'not reclaimed in 20 s'} (not counted)`,
        );
        return false;
      }
      // Judged on its fence or not at all: the guard was down (error) or another request of the
      // key held it (in_progress). Such a try proves nothing either way; it is tried again.
      if (!LATE_JUDGED.includes(arrived.verdict)) {
        this.d.log(`fault late_request #${f.k} on ${w.name}: ${req.key} fence ${req.fence} answered ${arrived.verdict} (not counted)`);
        return false;
      }
      // Counted whatever the verdict: the checker requires stale_fence (or replayed) of every one.
      return this.record('late_request', at, {
        worker: w.name,
        owner: w.owner,
        key: req.key,
        fence: req.fence,
        detail: `${req.key} fence ${req.fence} released late: ${arrived.verdict}`,
      });
    } finally {
      if (w.rxProxy.mode === 'hold') w.rxProxy.setMode('pass');
      w.child.proc.kill('SIGCONT');
      w.busy = false;
    }
  }

  /**
   * A rolling deploy: each worker of version 1 in turn is replaced by one of version 2 (loaded
   * with both versions): the new one serves first, then the old one drains (SIGTERM) while
   * version 1 runs are in flight.
   */
  async rollingDeploy(): Promise<void> {
    await this.d.driver.beforeDeploy(3); // version-1 runs in flight as the deploy begins
    const at = Date.now();
    this.deployStartedAt = at;
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

  /**
   * Runs the planned faults (each at its planned moment, or later when it must wait for its
   * turn: at most MAX_ACTIVE at once, a slot waited for until an active fault ends; nothing is
   * skipped for timing) and the rolling deploy at its planned moment. An injection that throws is recorded as `injection_failed` (the soak fails).
   */
  async run(startedAt: number, plan: { faults: PlannedFault[]; deployAtMs: number }): Promise<void> {
    const deploy = (async () => {
      await sleep(Math.max(0, startedAt + plan.deployAtMs - Date.now()));
      await this.rollingDeploy();
    })().catch((err: unknown) => this.failed('rolling_deploy', err));
    for (const f of plan.faults) {
      await sleep(Math.max(0, startedAt + f.atMs - Date.now()));
      // A free slot: wait for an active fault to end (each is bounded in time by its own waits,
      // TURN_WAIT_MS and the like, so this wait is too; at most 10 × MAX_ACTIVE rounds for the count).
      for (let i = 0; this.active.size >= MAX_ACTIVE && i < 10 * MAX_ACTIVE; i++) await Promise.race(this.active);
      if (this.active.size >= MAX_ACTIVE) {
        this.failed(f.kind, new Error(`no free slot of ${MAX_ACTIVE} active faults`));
        continue;
      }
      // A global fault waits for the other's end here, bounded; globalTurn (in inject) waits again, bounded, and throws.
      if (GLOBAL.includes(f.kind))
        for (const until = Date.now() + TURN_WAIT_MS; this.globalActive && Date.now() < until; ) await sleep(100);
      // A fault the moment did not allow (no free worker, no request in time) is tried again, twice at most.
      const attempt = async () => {
        for (let i = 0; i < 3; i++) if ((await this.inject(f)) !== false) return;
      };
      const p: Promise<void> = attempt()
        .catch((err: unknown) => this.failed(f.kind, err))
        .finally(() => this.active.delete(p));
      this.active.add(p);
    }
    await Promise.all([...this.active]);
    await deploy;
  }

  private failed(kind: string, err: unknown): void {
    const at = Date.now();
    this.record('injection_failed', at, { detail: `${kind}: ${((err as Error).stack ?? String(err)).slice(0, 500)}` });
  }
}
