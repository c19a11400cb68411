import type { Logger } from 'pino';
import type { RetentionAges, Store } from '../store/index.js';
import { pruneScheduleTicks } from '../store/prune.js';

/** Per sweeper tick, at most this many batches per state (of DEFAULT_PRUNE_BATCH runs each): a backlog is worked off over later ticks. */
export const RETENTION_BATCHES_PER_TICK = 4;

/**
 * The retention policy (`createRatchet({ retention })`), applied by each worker's sweeper on
 * every tick: finished runs past their state's age go with their stages and events, in bounded
 * batches (src/store/prune.ts), then the schedule ticks nothing needs any more: those of deleted
 * schedules, and decided ticks whose run is gone beyond each schedule's latest TICKS_KEPT_PER_SCHEDULE.
 * Several workers share the work (the batches skip locked rows).
 * A failure is logged and left for the next tick; it never stops the sweeper.
 */
export async function applyRetention(store: Store, ages: RetentionAges, logger: Logger): Promise<void> {
  try {
    const r = await store.prune({ olderThan: ages, maxBatchesPerState: RETENTION_BATCHES_PER_TICK });
    // Then the schedule ticks whose runs are gone (src/store/prune.ts, pruneScheduleTicks), as bounded.
    const t = await pruneScheduleTicks(store.db, { maxBatches: RETENTION_BATCHES_PER_TICK });
    if (t.ticks > 0) {
      logger.info({ event: 'schedule_ticks_pruned', ticks: t.ticks, batches: t.batches, complete: t.complete }, 'schedule ticks pruned');
    }
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
