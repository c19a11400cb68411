import type { Logger } from 'pino';
import type { RetentionAges, Store } from '../store/index.js';

/** Per sweeper tick, at most this many batches per state (of DEFAULT_PRUNE_BATCH runs each): a backlog is worked off over later ticks. */
export const RETENTION_BATCHES_PER_TICK = 4;

/**
 * The retention policy (`createRatchet({ retention })`), applied by each worker's sweeper on
 * every tick: finished runs past their state's age go with their stages and events, in bounded
 * batches (src/store/prune.ts). Several workers share the work (the batches skip locked runs).
 * A failure is logged and left for the next tick; it never stops the sweeper.
 */
export async function applyRetention(store: Store, ages: RetentionAges, logger: Logger): Promise<void> {
  try {
    const r = await store.prune({ olderThan: ages, maxBatchesPerState: RETENTION_BATCHES_PER_TICK });
    if (r.runs > 0) {
      logger.info(
        { event: 'runs_pruned', runs: r.runs, stages: r.stages, events: r.events, batches: r.batches, complete: r.complete },
        'finished runs pruned (retention policy)',
      );
    }
  } catch (err) {
    logger.warn({ event: 'retention_failed', err: (err as Error).message }, 'retention pass failed; the next sweep tries again');
  }
}
