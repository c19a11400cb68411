import { setMaxListeners } from 'node:events';
import { traceAttempt } from '../observability/tracing.js';
import type { Logger } from 'pino';
import { z } from 'zod';
import { CONTROL_CLASS_NAME } from '../definitions/builtin.js';
import type { Registry } from '../definitions/registry.js';
import { InvalidInputError } from '../errors.js';
import { MAX_CLAIM_DEFINITIONS, monotonicNow, type ClaimLimits, type ClaimedStage, type Extender, type Store } from '../store/index.js';
import { parseInput } from '../store/validate.js';
import { laneOf } from '../transport/lane.js';
import type { StageReady, Transport } from '../transport/transport.js';
import { EventWriter } from './event-writer.js';
import { executeStage, inlineRunner, type AttemptEnd, type ExecutorDeps, type Slot, type ToolRunner } from './executor.js';
import { DbLanes, DEFAULT_DB_LANES, dbLanesFromEnv } from './db-lanes.js';
import { FinishBatcher, FINISH_BATCH_WINDOW_MS } from './finish-batcher.js';
import { LeaseKeeper } from './lease-keeper.js';
import { makeOwnerId } from './owner-id.js';
import { Sweeper } from './sweeper.js';
import type { RetentionAges } from '../store/index.js';
import { processMetrics, type Metrics, type WorkerSample } from '../observability/metrics.js';

/** The tool classes a worker asked for `classes` serves (default: every class of the loaded workflows); an unknown one is refused. */
export function servedClasses(registry: Registry, classes: string[] | undefined): string[] {
  const known = registry.toolClasses().map((c) => c.name);
  for (const [i, c] of (classes ?? []).entries()) {
    if (!known.includes(c))
      throw new InvalidInputError(`no workflow uses tool class "${c}" (known: ${known.join(', ') || 'none'})`, `worker.classes[${i}]`);
  }
  return classes ?? known;
}

export const workerOptionsSchema = z
  .object({
    /** Tool classes this worker serves (default: every class in the registry). */
    classes: z.array(z.string().min(1)).min(1).optional(),
    /** Stages of each class run at once in this worker (default 10). */
    concurrency: z.number().int().min(1).max(1000).optional(),
    /** How often to look for work in PostgreSQL when wake-ups cannot be trusted (default 1000 ms); 5x that while they can. */
    pollIntervalMs: z.number().int().min(10).max(60_000).optional(),
    /** On stop: how long in-flight stages may take before their leases are released (default 10 s). */
    graceMs: z.number().int().min(0).max(3_600_000).optional(),
    /** A readable prefix for the owner id (host by default). */
    name: z.string().min(1).max(100).optional(),
    /** Claim the next stage of a run in the finish of the one before it, when this worker serves it (default true). */
    fastPath: z.boolean().optional(),
    /** Finishes within this many ms commit together (default 2; 0 = never batch). */
    finishBatchMs: z.number().int().min(0).max(100).optional(),
    /** How often the sweeper re-sends due stages and expired leases to the transport (default 5000 ms). */
    sweepIntervalMs: z.number().int().min(50).max(600_000).optional(),
    /**
     * Claim and finish statements that the live workers of this database keep in flight together
     * (default 4), shared out: each worker's share is this divided by the live workers (from
     * ratchet.workers), at least 1. 0 or `Infinity` (or RATCHET_DB_LANES=0 for every worker of the process) turns the limit off.
     */
    dbLanes: z.number().int().min(0).max(100_000).or(z.literal(Infinity)).optional(),
    /** Opt-in: fail stages of classes that no worker has served for this long (default: never). */
    failUnservedAfterMs: z
      .number()
      .int()
      .min(1000)
      .max(2 ** 31 - 1)
      .optional(),
  })
  .strict();
export type WorkerOptions = z.input<typeof workerOptionsSchema>;

export interface WorkerDeps {
  store: Store;
  registry: Registry;
  transport: Transport;
  logger: Logger;
  threadRunner?: ToolRunner;
  random?: () => number;
  metrics?: Metrics;
  /** The retention policy its sweeper applies (createRatchet({ retention })). */
  retention?: RetentionAges;
  /** One firing pass of the cron schedules (src/schedules/fire.ts), run by the sweeper each tick. */
  fireSchedules?: (owner: string) => Promise<void>;
}

const NO_WAITERS: (() => void)[] = [];
/** A hand-off waits at most this many poll intervals for this worker's own claim before it goes to the transport. */
const HAND_OFF_POLLS = 1;
/**
 * A full claim passes on at most one wake-up per live worker per lane, and at least this many (passOnHanded):
 * before the sweeper's first count a worker knows only itself, and a wake-up may come back to the full worker that sent it.
 */
const MIN_PASS_ON = 2;
/** A wake-up held for this worker's own claim (Worker.onQueued). */
interface Handed {
  lane: string;
  ready: StageReady;
  /** Numbered with the claims (Worker.handSeq). */
  seq: number;
  /** Monotonic ms: sent to the transport then if no claim proved it. */
  until: number;
}
/** Resolves wake-ups (a BullMQ job is acknowledged once its promise resolves). */
const answer = (waiters: (() => void)[]) => {
  for (const r of waiters) r();
};

/**
 * The built-in `$control` class (child-run stages, workflow tools, waits: no user code) joins the
 * classes a worker serves whenever one of the workflows it serves has such stages, explicit
 * `classes` included: otherwise a worker told `--classes io` would run a parent's tools and leave
 * its child-run stages to nobody.
 */
export function withControl(registry: Pick<Registry, 'hashesOf'>, classes: readonly string[]): string[] {
  if (classes.includes(CONTROL_CLASS_NAME)) return [...classes];
  const control = new Set(registry.hashesOf(CONTROL_CLASS_NAME));
  const serves = classes.some((c) => registry.hashesOf(c).some((h) => control.has(h)));
  return serves ? [...classes, CONTROL_CLASS_NAME] : [...classes];
}

/**
 * Claims stages of the classes it serves (up to `concurrency` at once per class, as many as it
 * has free slots in one claim), runs them under leases kept by one lease keeper, and finishes
 * them fenced. Wake-ups come from the transport; PostgreSQL is polled too (faster while the
 * transport is unhealthy), and a sweeper re-sends what PostgreSQL says is due. Stateless: any
 * number of workers may share a database.
 */
export class Worker {
  readonly owner: string;
  readonly classes: string[];
  /** Per class served: the hashes of the loaded definitions (every version) with stages of it; claims keep to them. */
  readonly definitions: ReadonlyMap<string, readonly string[]>;
  private readonly opts: Required<Omit<WorkerOptions, 'classes' | 'name' | 'failUnservedAfterMs' | 'dbLanes'>>;
  private readonly keeper: LeaseKeeper;
  /** The keeper's own database connection (outside the pool). */
  private readonly extender: Extender;
  private readonly metrics: Metrics;
  private untrack: (() => void) | null = null;
  private readonly events: EventWriter;
  private readonly batcher: FinishBatcher;
  /** This worker's share of the database's claim and finish statements in flight (DbLanes). */
  private readonly lanes: DbLanes;
  /** Aborted by stop(): ends a claim loop's wait for a lane. */
  private stopping = new AbortController();
  private readonly sweeper: Sweeper;
  private readonly limits = new Map<string, ClaimLimits | undefined>();
  private readonly inFlight = new Map<string, { stage: ClaimedStage; done: Promise<AttemptEnd> }>();
  private readonly perClass = new Map<string, number>();
  private readonly wakers = new Map<string, () => void>();
  private readonly unsubscribe: (() => Promise<void>)[] = [];
  private readonly claimWaiters = new Map<string, (() => void)[]>();
  /** Wake-ups of stages this worker queued on its own lanes, held for its own claims (see onQueued). */
  private readonly handed = new Map<string, Map<string, Handed>>();
  /** Numbers the hand-offs and claims of this worker: a claim answers the hand-offs numbered before it began. */
  private handSeq = 0;
  private readonly lastHanded = new Map<string, number>();
  private handTimer: NodeJS.Timeout | null = null;
  private handTimerAt = Infinity;
  private readonly executorDeps: ExecutorDeps;
  private loops: Promise<void>[] = [];
  private running = false;
  /** How attempts ended (for tests and metrics). */
  readonly ended: Record<AttemptEnd, number> = { succeeded: 0, failed: 0, retry: 0, rejected: 0, abandoned: 0, unknown: 0, waiting: 0 };

  constructor(
    private readonly deps: WorkerDeps,
    options: WorkerOptions = {},
  ) {
    const o = parseInput(workerOptionsSchema, options, 'worker');
    const classes = deps.registry.toolClasses();
    const known = classes.map((c) => c.name);
    this.classes = withControl(deps.registry, servedClasses(deps.registry, o.classes));
    this.definitions = new Map(this.classes.map((c) => [c, deps.registry.hashesOf(c)]));
    for (const [c, hashes] of this.definitions) {
      if (hashes.length > MAX_CLAIM_DEFINITIONS) {
        throw new InvalidInputError(
          `${hashes.length} loaded definitions use tool class "${c}"; a worker serves at most ${MAX_CLAIM_DEFINITIONS} ` + 'per class',
          'worker.classes',
        );
      }
    }
    this.opts = {
      concurrency: o.concurrency ?? 10,
      pollIntervalMs: o.pollIntervalMs ?? 1000,
      graceMs: o.graceMs ?? 10_000,
      fastPath: o.fastPath ?? true,
      finishBatchMs: o.finishBatchMs ?? FINISH_BATCH_WINDOW_MS,
      sweepIntervalMs: o.sweepIntervalMs ?? 5000,
    };
    // Limits travel with the claim, so they hold on every path that claims.
    const keyed = new Set(
      deps.registry.list().flatMap((w) =>
        w.steps
          // a workflow's concurrency key, or a map's maxParallel (its items hold a key per run and step)
          .filter((s) => w.concurrencyKey || (s.kind === 'map' && s.map!.maxParallel !== null))
          .map((s) => s.tool.class.name),
      ),
    );
    for (const c of classes) {
      const limits: ClaimLimits = {
        ...(c.concurrency !== null ? { classConcurrency: c.concurrency } : {}),
        ...(c.rateLimit ? { rate: { max: c.rateLimit.max, windowMs: c.rateLimit.perMs } } : {}),
        ...(keyed.has(c.name) ? { keyed: true } : {}),
      };
      this.limits.set(c.name, Object.keys(limits).length > 0 ? limits : undefined);
    }
    this.owner = makeOwnerId(o.name);
    const logger = deps.logger.child({ owner: this.owner });
    this.events = new EventWriter(deps.store, logger);
    const metrics = deps.metrics ?? processMetrics();
    this.metrics = metrics;
    this.extender = deps.store.openExtender();
    this.keeper = new LeaseKeeper(this.extender, this.owner, logger, () => void this.events.flush(), metrics);
    this.lanes = new DbLanes(o.dbLanes ?? dbLanesFromEnv() ?? DEFAULT_DB_LANES);
    this.batcher = new FinishBatcher(deps.store.db, this.owner, this.opts.finishBatchMs, this.lanes);
    this.sweeper = new Sweeper(
      deps.store,
      deps.transport,
      this.owner,
      this.definitions,
      known,
      this.opts.sweepIntervalMs,
      logger,
      metrics,
      o.failUnservedAfterMs ?? null,
      deps.retention ?? null,
      deps.fireSchedules ? () => deps.fireSchedules!(this.owner) : null,
      deps.registry,
      (live) => this.lanes.setPeers(live),
    );
    this.executorDeps = {
      store: deps.store,
      keeper: this.keeper,
      events: this.events,
      registry: deps.registry,
      owner: this.owner,
      logger: deps.logger,
      runners: { inline: inlineRunner, thread: deps.threadRunner },
      random: deps.random,
      metrics,
      finish: (row, confirmedUntil) => this.batcher.finish(row, confirmedUntil),
      onQueued: (toolClass, definitionHash, ready, delayMs) => this.onQueued(toolClass, definitionHash, ready, delayMs),
      expireRun: (runId) => this.sweeper.expireRun(runId),
      canClaimNext: (nextClass, currentClass) =>
        this.running &&
        this.opts.fastPath &&
        this.classes.includes(nextClass) &&
        this.limits.get(nextClass) === undefined &&
        this.free(nextClass) + (nextClass === currentClass ? 1 : 0) > 0,
      onClaimed: (stage) => this.launch(stage),
    };
  }

  /**
   * This worker's share of the database's claim and finish statements in flight (DbLanes), how many it has in flight
   * now, and the live workers of the database (this one included) at the sweeper's last count, which set the share and
   * the pass-on cap (passOnHanded).
   */
  get dbLanes(): { width: number; inFlight: number; peers: number } {
    return { width: this.lanes.width, inFlight: this.lanes.inFlight, peers: this.lanes.peers };
  }

  private get logger(): Logger {
    return this.deps.logger;
  }

  async start(): Promise<void> {
    if (this.running) return;
    this.running = true;
    this.stopping = new AbortController();
    setMaxListeners(0, this.stopping.signal); // one listener per class's claim loop waiting for a lane
    this.untrack = this.metrics.track(() => this.sample());
    this.keeper.start();
    this.sweeper.start();
    for (const cls of this.classes) {
      // One wake-up lane per definition: a wake-up only reaches workers that can claim its stage.
      for (const hash of this.definitions.get(cls)!) {
        this.unsubscribe.push(
          this.deps.transport.subscribe(laneOf(cls, hash), (ready) => this.onWake(cls, ready), { concurrency: this.opts.concurrency }),
        );
      }
      this.loops.push(this.claimLoop(cls));
    }
    this.logger.info(
      {
        event: 'worker_started',
        owner: this.owner,
        classes: this.classes,
        concurrency: this.opts.concurrency,
        transport: this.deps.transport.kind,
      },
      'worker started',
    );
  }

  /**
   * Graceful stop: claim nothing more, let in-flight stages finish within the grace period,
   * then abort the rest (reason `shutdown`) and hand their leases back at once.
   */
  async stop(opts: { graceMs?: number } = {}): Promise<void> {
    if (!this.running) return;
    this.running = false;
    this.stopping.abort(); // a claim loop waiting for a lane ends now
    await Promise.all(this.unsubscribe.splice(0).map((u) => u()));
    for (const wake of this.wakers.values()) wake();
    await Promise.all(this.loops);
    this.flushHanded(Infinity, true); // no claim of ours will come: the transport carries them
    await this.sweeper.stop();
    const grace = opts.graceMs ?? this.opts.graceMs;
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      this.allSettled(),
      new Promise<void>((r) => {
        timer = setTimeout(r, grace);
      }),
    ]);
    clearTimeout(timer);
    // Attempts that began an irreversible request are not handed back: their lease expires and
    // the next claim sees a reclaim, so it reconciles before acting again.
    const left = [...this.inFlight.values()].map((f) => f.stage).filter((s) => !this.keeper.effectStarted(s.id));
    for (const f of this.inFlight.values()) this.keeper.abort(f.stage.id, 'shutdown', 'the worker is shutting down');
    await this.events.settle(); // tool_request_started lands before any lease is released
    if (left.length > 0) {
      try {
        const released = await this.deps.store.release({ owner: this.owner, leases: left.map((s) => ({ stageId: s.id, fence: s.fence })) });
        for (const r of released) {
          const s = left.find((x) => x.id === r.stageId)!;
          this.deps.transport.notify(laneOf(r.toolClass, s.definitionHash), { stageId: r.stageId, attempt: s.attempt });
        }
        this.logger.info({ event: 'lease_released', count: released.length }, 'leases handed back at shutdown');
      } catch (err) {
        this.logger.error({ event: 'release_failed', err: (err as Error).message }, 'could not release leases: they will expire');
      }
    }
    await this.keeper.stop();
    await this.extender.close();
    this.untrack?.();
    this.untrack = null;
    await this.events.drain();
    await this.deps.store.deleteWorker(this.owner).catch(() => {});
    this.logger.info({ event: 'worker_stopped', owner: this.owner }, 'worker stopped');
  }

  get inFlightCount(): number {
    return this.inFlight.size;
  }

  /** Slots of a class taken now: tools running, or finishes about to hand their slot to the next stage (fast path). */
  slotsInUse(cls: string): number {
    return this.perClass.get(cls) ?? 0;
  }

  /** What a scrape shows of this worker (metrics.ts). */
  private sample(): WorkerSample {
    const now = monotonicNow();
    const runner = this.deps.threadRunner as (ToolRunner & { stats?: () => { threads: number; busy: number } }) | undefined;
    return {
      attempts: this.keeper.held().map((a) => ({
        labels: a.labels,
        heartbeatAgeSeconds: a.heartbeatAgeSeconds(now),
        leaseRemainingSeconds: a.leaseRemainingSeconds(now),
      })),
      slots: this.classes.map((c) => ({ toolClass: c, inUse: this.slotsInUse(c), capacity: this.opts.concurrency })),
      ...(typeof runner?.stats === 'function' ? { threads: runner.stats() } : {}),
    };
  }

  /** Resolves when no stage is in flight (the fast path may chain new ones meanwhile). */
  private async allSettled(): Promise<void> {
    while (this.inFlight.size > 0) await Promise.all([...this.inFlight.values()].map((f) => f.done));
  }

  /**
   * A transport wake-up: resolves once a claim of the class that began after it arrived has been
   * tried (or found no free slot). Wake-ups that arrive together (or while a claim runs) share one
   * claim: the next one, which takes every stage it can for the free slots, oldest first.
   */
  private onWake(cls: string, _ready: StageReady | null): Promise<void> {
    if (!this.running) return Promise.resolve();
    return new Promise<void>((resolve) => {
      const list = this.claimWaiters.get(cls);
      if (list) list.push(resolve);
      else this.claimWaiters.set(cls, [resolve]);
      this.wakers.get(cls)?.();
    });
  }

  /** The wake-ups the claim about to start answers (those that arrive later wait for the next). */
  private takeWaiters(cls: string): (() => void)[] {
    const list = this.claimWaiters.get(cls);
    if (!list?.length) return NO_WAITERS;
    this.claimWaiters.set(cls, []);
    return list;
  }

  private waiting(cls: string): boolean {
    return (this.claimWaiters.get(cls)?.length ?? 0) > 0;
  }

  private free(cls: string): number {
    return this.opts.concurrency - (this.perClass.get(cls) ?? 0);
  }

  private async claimLoop(cls: string): Promise<void> {
    let backoff = 100;
    const stopping = this.stopping.signal; // this start's: a loop a stop ended never claims again
    while (this.running && !stopping.aborted) {
      // A lane first (DbLanes): the claim then asks for the slots free once it may go.
      // Not for a class with limits: its claim is a transaction serialised on the class lock, whose waits must not hold a lane.
      const release = this.free(cls) > 0 && this.limits.get(cls) === undefined ? await this.lanes.acquire(stopping) : null;
      if (!this.running || stopping.aborted) {
        release?.();
        break;
      }
      const answering = this.takeWaiters(cls);
      const began = ++this.handSeq; // hand-offs numbered below this were committed before the claim began
      const free = this.free(cls);
      if (free <= 0) {
        release?.();
        answer(answering); // no slot: the wake-up is answered; polling or a finish brings us back
        this.passOnHanded(cls, began); // and what was handed to us goes to a worker with room
        await this.sleep(cls, this.pollMs());
        continue;
      }
      let claimed: ClaimedStage[];
      try {
        claimed = await this.deps.store
          .claim({
            owner: this.owner,
            toolClass: cls,
            limit: free,
            definitions: [...this.definitions.get(cls)!],
            limits: this.limits.get(cls),
          })
          .finally(() => release?.()); // the lane is the statement's alone, never held across a sleep
        backoff = 100;
      } catch (err) {
        this.logger.warn({ event: 'claim_failed', toolClass: cls, err: (err as Error).message }, 'claim failed');
        answer(answering);
        await this.sleep(cls, backoff);
        backoff = Math.min(backoff * 2, 5000);
        continue;
      }
      answer(answering);
      this.settleHanded(cls, claimed, claimed.length < free, began);
      for (const stage of claimed) this.launch(stage);
      // Wake-ups (and hand-offs) that came during the claim may name stages it could not see yet: claim again for them.
      if (claimed.length < free && !this.waiting(cls) && (this.lastHanded.get(cls) ?? 0) < began) await this.sleep(cls, this.pollMs());
    }
    answer(this.takeWaiters(cls));
  }

  /**
   * A stage became ready. Its wake-up goes to the transport, except when it is due now, on a lane
   * this worker serves, of a class without limits, over BullMQ: then it is handed to this worker's
   * next claim (which begins after the stage was committed) instead of a Redis round trip. A claim
   * that takes the stage proves the wake-up was not needed, and so does a claim that came back with
   * room to spare (it took every due stage it could see). A claim that came back full, or a claim
   * turn with no free slot, lets go of the hand-offs committed before it at once, with at most one
   * wake-up per live worker (passOnHanded): other workers with room take a fan-out's other branches
   * now. Hand-offs still held HAND_OFF_POLLS poll intervals later (a claim that failed, or none began
   * meanwhile) go to the transport then, a wake-up each (flushHanded), and all of them at stop.
   * The proof has the gaps a poll has: a due stage row-locked by another claim that then fails, or
   * one behind more queued stages of ended runs than a claim walks, waits for the next poll or
   * sweep, as it would after a lost Redis message. Losing them (a crash) costs what a lost Redis
   * message costs: the stage waits for a poll or the sweeper; it stays queued in PostgreSQL, never
   * lost.
   */
  private onQueued(toolClass: string, definitionHash: string, ready: StageReady, delayMs?: number): void {
    const lane = laneOf(toolClass, definitionHash);
    const local =
      this.running &&
      !(delayMs !== undefined && delayMs > 0) &&
      this.deps.transport.kind !== 'in-process' &&
      this.limits.get(toolClass) === undefined &&
      (this.definitions.get(toolClass)?.includes(definitionHash) ?? false);
    if (!local) {
      this.deps.transport.notify(lane, ready, delayMs);
      return;
    }
    let held = this.handed.get(toolClass);
    if (!held) this.handed.set(toolClass, (held = new Map()));
    const seq = ++this.handSeq;
    const until = monotonicNow() + this.opts.pollIntervalMs * HAND_OFF_POLLS;
    held.set(ready.stageId, { lane, ready, seq, until });
    this.lastHanded.set(toolClass, seq);
    if (until < this.handTimerAt) this.armHandTimer(until);
    this.wakers.get(toolClass)?.();
  }

  /**
   * After a claim of `cls` that began at `began`: drop the hand-offs it proves (see onQueued). A
   * claim that came back full could not take them all: the ones committed before it began are let go
   * at once, with a wake-up per live worker at most (passOnHanded), so an idle worker takes a fan-out's
   * other branches now, not after the hold.
   */
  private settleHanded(cls: string, claimed: ClaimedStage[], roomLeft: boolean, began: number): void {
    const held = this.handed.get(cls);
    if (!held?.size) return;
    for (const s of claimed) held.delete(s.id);
    if (!roomLeft) {
      this.passOnHanded(cls, began);
      return;
    }
    for (const [id, h] of held) if (h.seq < began) held.delete(id);
  }

  /**
   * This worker has no room for the hand-offs of `cls` committed before `began`: they go to the
   * transport now, as stages queued by another worker would, so a worker with room takes a
   * fan-out's other branches at once. A woken worker claims every due stage it has room for (oldest
   * first), so a lane gets at most one wake-up per live worker (MIN_PASS_ON at least), not one per
   * hand-off: when every worker is full, each further wake-up only costs Redis round trips at a
   * worker with no room. Delivery is best effort (any subscriber may take a wake-up, this worker
   * too), as it was with one per hand-off. The stages without a wake-up stay queued in PostgreSQL:
   * every worker claims again at each slot it frees and at its poll (5 poll intervals while Redis
   * is healthy), never later. Later hand-offs stay held for the next claim.
   */
  private passOnHanded(cls: string, began: number): void {
    const held = this.handed.get(cls);
    if (!held?.size) return;
    const cap = Math.max(MIN_PASS_ON, this.lanes.peers);
    const sent = new Map<string, number>();
    for (const [id, h] of held) {
      if (h.seq >= began) continue;
      held.delete(id);
      const n = sent.get(h.lane) ?? 0;
      if (n >= cap) continue;
      sent.set(h.lane, n + 1);
      this.deps.transport.notify(h.lane, h.ready);
    }
  }

  /**
   * The hand-offs whose time ran out (this worker's claim failed, or none began within the hold) go
   * to the transport, each with its own wake-up, not capped as passOnHanded is (rare: no claim of
   * this worker proved them); at stop (`all`), every one.
   */
  private flushHanded(now: number, all = false): void {
    let next = Infinity;
    for (const held of this.handed.values()) {
      for (const [id, h] of held) {
        if (all || h.until <= now) {
          held.delete(id);
          this.deps.transport.notify(h.lane, h.ready);
        } else next = Math.min(next, h.until);
      }
    }
    if (this.handTimer) clearTimeout(this.handTimer);
    this.handTimer = null;
    this.handTimerAt = Infinity;
    // Coarse ticks (a quarter of the hold at the soonest): one pass over the held hand-offs per tick, not per hand-off.
    if (Number.isFinite(next)) this.armHandTimer(Math.max(next, now + (this.opts.pollIntervalMs * HAND_OFF_POLLS) / 4));
  }

  private armHandTimer(at: number): void {
    if (this.handTimer) clearTimeout(this.handTimer);
    this.handTimerAt = at;
    this.handTimer = setTimeout(() => this.flushHanded(monotonicNow()), Math.max(0, at - monotonicNow()) + 1);
    this.handTimer.unref();
  }

  private pollMs(): number {
    return this.deps.transport.kind === 'bullmq' && this.deps.transport.healthy() ? this.opts.pollIntervalMs * 5 : this.opts.pollIntervalMs;
  }

  /** Sleeps until a wake-up for the class, a slot frees up, or `ms` pass. */
  private sleep(cls: string, ms: number): Promise<void> {
    return new Promise((resolve) => {
      const t = setTimeout(done, ms);
      function done() {
        clearTimeout(t);
        resolve();
      }
      this.wakers.set(cls, done);
    });
  }

  /** Takes a slot of a class; release() gives it back (once) and wakes the class's claim loop. */
  private takeSlot(cls: string): Slot {
    this.perClass.set(cls, (this.perClass.get(cls) ?? 0) + 1);
    let held = true;
    return {
      release: () => {
        if (!held) return;
        held = false;
        this.perClass.set(cls, (this.perClass.get(cls) ?? 1) - 1);
        this.wakers.get(cls)?.();
      },
    };
  }

  private launch(stage: ClaimedStage): void {
    const slot = this.takeSlot(stage.toolClass);
    const done = traceAttempt(stage, () => executeStage(this.executorDeps, stage, slot)) // issue 12: the attempt's span
      .then(
        (end) => end,
        (err: unknown) => {
          this.logger.error({ event: 'executor_crashed', stageId: stage.id, err: (err as Error).stack }, 'executor crashed');
          return 'unknown' as const;
        },
      )
      .then((end) => {
        this.ended[end]++;
        if (this.inFlight.get(stage.id)?.stage === stage) this.inFlight.delete(stage.id);
        slot.release();
        return end;
      });
    this.inFlight.set(stage.id, { stage, done });
  }
}
