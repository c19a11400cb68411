import { createRequire } from 'node:module';
import { DelayedError, Queue, Worker as BullWorker, type ConnectionOptions, type Job } from 'bullmq';
import type { Logger } from 'pino';
import type { StageReady, Transport } from './transport.js';

export interface BullmqTransportOptions {
  redisUrl: string;
  /** Key prefix in Redis (default `ratchet`). */
  prefix?: string;
  logger: Logger;
  /**
   * Milliseconds until a stage is due by the database clock (0 when due, or no longer
   * queued). A delayed job that fires early is delayed again by this much.
   */
  dueIn(stageId: string): Promise<number>;
}

/** ioredis options from a redis:// URL. */
function connectionFrom(url: string, extra: Record<string, unknown>): ConnectionOptions {
  const u = new URL(url);
  return {
    host: u.hostname || '127.0.0.1',
    port: Number(u.port || 6379),
    ...(u.password ? { password: decodeURIComponent(u.password) } : {}),
    ...(u.username ? { username: decodeURIComponent(u.username) } : {}),
    ...(u.pathname.length > 1 ? { db: Number(u.pathname.slice(1)) } : {}),
    // Reconnect quickly and forever: Redis going away is a normal event, not a crash.
    retryStrategy: (times: number) => Math.min(100 * times, 2000),
    ...extra,
  } as ConnectionOptions;
}

let ioredisLoaded = false;
/**
 * BullMQ requires ioredis lazily, at the first Queue or Worker: at `worker.start()` (0.2-0.4 s of
 * module loading, PERF-NOTES §1) or at the first wake-up sent. Loaded here instead, when the
 * transport is created, from bullmq's own location (the same module instance it will require).
 */
function preloadIoredis(): void {
  if (ioredisLoaded) return;
  ioredisLoaded = true;
  try {
    createRequire(createRequire(import.meta.url).resolve('bullmq'))('ioredis');
  } catch {
    // BullMQ gives its own error where it needs the driver.
  }
}

/**
 * Wake-ups on BullMQ: one queue per tool class (per lane: class and definition, ./lane.ts); job data holds ids only; the job id is
 * `<stage>-<attempt the claim will create>` (BullMQ refuses `:`), so repeated notices of one
 * attempt collapse into one job; finished jobs are removed. A job is acknowledged once the
 * worker has tried a claim, never held for the stage's life, so BullMQ's stall clock never
 * competes with the lease. Adds fail within seconds while Redis is away (the sweeper re-sends later).
 */
export function createBullmqTransport(opts: BullmqTransportOptions): Transport {
  preloadIoredis();
  const prefix = opts.prefix ?? 'ratchet';
  const queues = new Map<string, Queue>();
  const workers = new Set<BullWorker>();
  let lastError = 0;
  let lastReady = Date.now();
  const log = opts.logger.child({ transport: 'bullmq' });

  const markError = (err: Error) => {
    if (Date.now() - lastError > 5000)
      log.warn({ event: 'transport_unhealthy', err: err.message }, 'Redis error: polling PostgreSQL until it is back');
    lastError = Date.now();
  };

  const queue = (toolClass: string): Queue => {
    let q = queues.get(toolClass);
    if (!q) {
      q = new Queue(`class-${toolClass}`, {
        prefix,
        // Commands wait for a (re)connection, but only through one retry: while Redis is away an
        // add fails within seconds instead of piling up (the sweeper re-sends from PostgreSQL).
        connection: connectionFrom(opts.redisUrl, { maxRetriesPerRequest: 1, connectTimeout: 2000 }),
      });
      q.on('error', markError);
      queues.set(toolClass, q);
    }
    return q;
  };

  return {
    kind: 'bullmq',
    notify(toolClass, ready, delayMs = 0) {
      const jobId = `${ready.stageId}-${ready.attempt}`;
      queue(toolClass)
        .add(
          'wake',
          { stageId: ready.stageId, attempt: ready.attempt },
          {
            jobId,
            delay: Math.max(0, Math.min(delayMs, 2 ** 31 - 1)),
            removeOnComplete: true,
            removeOnFail: true,
          },
        )
        .catch((err: Error) => markError(err));
    },
    subscribe(toolClass, onWake, subOpts) {
      const worker = new BullWorker(
        `class-${toolClass}`,
        async (job: Job<StageReady>, token?: string) => {
          lastReady = Date.now();
          // Only a delayed job can fire early; an immediate one costs no extra query.
          const wait = job.opts.delay ? await opts.dueIn(job.data.stageId).catch(() => 0) : 0;
          if (wait > 0 && token) {
            // Fired before available_at by the database clock: delay it again.
            await job.moveToDelayed(Date.now() + wait, token);
            throw new DelayedError();
          }
          await onWake(job.data);
        },
        {
          prefix,
          connection: connectionFrom(opts.redisUrl, { maxRetriesPerRequest: null, connectTimeout: 2000 }),
          // Several wake-ups held at once share the subscriber's next claim (one statement for all).
          concurrency: Math.max(1, subOpts?.concurrency ?? 1),
          // The processor is short (a claim): a long BullMQ lock would only delay redelivery.
          lockDuration: 30_000,
          removeOnComplete: { count: 0 },
          removeOnFail: { count: 0 },
        },
      );
      worker.on('error', markError);
      worker.on('ready', () => {
        lastReady = Date.now();
      });
      workers.add(worker);
      return async () => {
        workers.delete(worker);
        await worker.close(true).catch(() => {});
      };
    },
    healthy: () => Date.now() - lastError > 3000 && lastReady > 0,
    async close() {
      await Promise.all([...workers].map((w) => w.close(true).catch(() => {})));
      workers.clear();
      await Promise.all([...queues.values()].map((q) => q.close().catch(() => {})));
      queues.clear();
    },
  };
}
