import type { Logger } from 'pino';
import { z } from 'zod';
import type { Registry } from '../definitions/registry.js';
import { InvalidInputError } from '../errors.js';
import { encodeFinishRow, finishEncoded, type ClaimedStage, type FinishRow, type Store } from '../store/index.js';
import { parseInput } from '../store/validate.js';
import type { Transport } from '../transport/transport.js';
import { EventWriter } from './event-writer.js';
import { executeStage, inlineRunner, type AttemptEnd, type ExecutorDeps, type ToolRunner } from './executor.js';
import { LeaseKeeper } from './lease-keeper.js';
import { makeOwnerId } from './owner-id.js';

export const workerOptionsSchema = z.object({
  /** Tool classes this worker serves (default: every class in the registry). */
  classes: z.array(z.string().min(1)).min(1).optional(),
  /** Stages of each class run at once in this worker (default 10). */
  concurrency: z.number().int().min(1).max(1000).optional(),
  /** How often to look for work when no wake-up comes (default 1000 ms). */
  pollIntervalMs: z.number().int().min(10).max(60_000).optional(),
  /** On stop: how long in-flight stages may take before their leases are released (default 10 s). */
  graceMs: z.number().int().min(0).max(3_600_000).optional(),
  /** A readable prefix for the owner id (host by default). */
  name: z.string().min(1).max(100).optional(),
}).strict();
export type WorkerOptions = z.input<typeof workerOptionsSchema>;

export interface WorkerDeps {
  store: Store;
  registry: Registry;
  transport: Transport;
  logger: Logger;
  threadRunner?: ToolRunner;
  random?: () => number;
}

/**
 * Claims stages of the classes it serves (up to `concurrency` at once per class, claiming as
 * many as it has free slots in one statement), runs them under leases kept by one lease
 * keeper, and finishes them fenced. Stateless: any number of workers may share a database.
 */
export class Worker {
  readonly owner: string;
  readonly classes: string[];
  private readonly opts: Required<Omit<WorkerOptions, 'classes' | 'name'>>;
  private readonly keeper: LeaseKeeper;
  private readonly events: EventWriter;
  private readonly inFlight = new Map<string, { stage: ClaimedStage; done: Promise<AttemptEnd> }>();
  private readonly perClass = new Map<string, number>();
  private readonly wakers = new Map<string, () => void>();
  private readonly unsubscribe: (() => void)[] = [];
  private loops: Promise<void>[] = [];
  private running = false;
  /** Counts of how attempts ended (for tests and metrics). */
  readonly ended: Record<AttemptEnd, number> = { succeeded: 0, failed: 0, retry: 0, rejected: 0, abandoned: 0, unknown: 0 };

  constructor(private readonly deps: WorkerDeps, options: WorkerOptions = {}) {
    const o = parseInput(workerOptionsSchema, options, 'worker');
    const known = deps.registry.toolClasses().map((c) => c.name);
    this.classes = o.classes ?? known;
    for (const [i, c] of this.classes.entries()) {
      if (!known.includes(c)) throw new InvalidInputError(`no workflow uses tool class "${c}" (known: ${known.join(', ') || 'none'})`, `worker.classes[${i}]`);
    }
    this.opts = { concurrency: o.concurrency ?? 10, pollIntervalMs: o.pollIntervalMs ?? 1000, graceMs: o.graceMs ?? 10_000 };
    this.owner = makeOwnerId(o.name);
    const logger = deps.logger.child({ owner: this.owner });
    this.events = new EventWriter(deps.store, logger);
    this.keeper = new LeaseKeeper(deps.store, this.owner, logger, () => void this.events.flush());
  }

  private get logger(): Logger {
    return this.deps.logger;
  }

  async start(): Promise<void> {
    if (this.running) return;
    this.running = true;
    this.keeper.start();
    for (const cls of this.classes) {
      this.unsubscribe.push(this.deps.transport.subscribe(cls, () => this.wakers.get(cls)?.()));
      this.loops.push(this.claimLoop(cls));
    }
    this.logger.info({ event: 'worker_started', owner: this.owner, classes: this.classes, concurrency: this.opts.concurrency }, 'worker started');
  }

  /**
   * Graceful stop: claim nothing more, let in-flight stages finish within the grace period,
   * then abort the rest (reason `shutdown`) and hand their leases back at once.
   */
  async stop(opts: { graceMs?: number } = {}): Promise<void> {
    if (!this.running) return;
    this.running = false;
    for (const u of this.unsubscribe.splice(0)) u();
    for (const wake of this.wakers.values()) wake();
    await Promise.all(this.loops);
    const grace = opts.graceMs ?? this.opts.graceMs;
    const all = Promise.all([...this.inFlight.values()].map((f) => f.done));
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([all, new Promise<void>((r) => { timer = setTimeout(r, grace); })]);
    clearTimeout(timer);
    const left = [...this.inFlight.values()].map((f) => f.stage);
    if (left.length > 0) {
      for (const s of left) this.keeper.abort(s.id, 'shutdown', 'the worker is shutting down');
      try {
        const released = await this.deps.store.release({ owner: this.owner, leases: left.map((s) => ({ stageId: s.id, fence: s.fence })) });
        for (const r of released) this.deps.transport.notify(r.toolClass, r.stageId);
        this.logger.info({ event: 'lease_released', count: released.length }, 'leases handed back at shutdown');
      } catch (err) {
        this.logger.error({ event: 'release_failed', err: (err as Error).message }, 'could not release leases: they will expire');
      }
    }
    await this.keeper.stop();
    await this.events.drain();
    this.logger.info({ event: 'worker_stopped', owner: this.owner }, 'worker stopped');
  }

  get inFlightCount(): number {
    return this.inFlight.size;
  }

  private async claimLoop(cls: string): Promise<void> {
    let backoff = 100;
    while (this.running) {
      const free = this.opts.concurrency - (this.perClass.get(cls) ?? 0);
      if (free <= 0) {
        await this.sleep(cls, this.opts.pollIntervalMs);
        continue;
      }
      let claimed: ClaimedStage[];
      try {
        claimed = await this.deps.store.claim({ owner: this.owner, toolClass: cls, limit: free });
        backoff = 100;
      } catch (err) {
        this.logger.warn({ event: 'claim_failed', toolClass: cls, err: (err as Error).message }, 'claim failed');
        await this.sleep(cls, backoff);
        backoff = Math.min(backoff * 2, 5000);
        continue;
      }
      for (const stage of claimed) this.launch(stage);
      if (claimed.length < free) await this.sleep(cls, this.opts.pollIntervalMs);
    }
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

  private launch(stage: ClaimedStage): void {
    this.perClass.set(stage.toolClass, (this.perClass.get(stage.toolClass) ?? 0) + 1);
    const done = executeStage(this.executorDeps(), stage).then(
      (end) => end,
      (err: unknown) => {
        this.logger.error({ event: 'executor_crashed', stageId: stage.id, err: (err as Error).stack }, 'executor crashed');
        return 'unknown' as const;
      },
    ).then((end) => {
      this.ended[end]++;
      this.inFlight.delete(stage.id);
      this.perClass.set(stage.toolClass, (this.perClass.get(stage.toolClass) ?? 1) - 1);
      this.wakers.get(stage.toolClass)?.();
      return end;
    });
    this.inFlight.set(stage.id, { stage, done });
  }

  private executorDeps(): ExecutorDeps {
    const { store, registry, transport, random } = this.deps;
    const owner = this.owner;
    return {
      store,
      keeper: this.keeper,
      events: this.events,
      registry,
      owner,
      logger: this.logger,
      runners: { inline: inlineRunner, thread: this.deps.threadRunner },
      finish: async (row: FinishRow) => {
        const [v] = await finishEncoded(store.db, owner, [encodeFinishRow(row)]);
        return v!;
      },
      onQueued: (toolClass, stageId, delayMs) => transport.notify(toolClass, stageId, delayMs),
      random,
    };
  }
}
