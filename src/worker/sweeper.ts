import { performance } from 'node:perf_hooks';
import type { Logger } from 'pino';
import { LIVE_WORKER_MS, type ExpiredRuns, type Store } from '../store/index.js';
import { laneOf } from '../transport/lane.js';
import type { Transport } from '../transport/transport.js';
import type { Metrics } from '../observability/metrics.js';
import type { RetentionAges } from '../store/index.js';
import { applyRetention } from './retention.js';
import type { Registry } from '../definitions/registry.js';
import { toolsOf } from '../definitions/agent.js';
import { stepIndexOf } from '../planner/map.js';
import { decideRefusal } from '../planner/waits.js';
import { wakeDueWaits, type DueApproval } from '../store/wake-waits.js';
import { recordApprovalDecision, recordWaitEnded } from '../observability/wait-metrics.js';

/** Stages re-sent per class kind and sweep. */
const SWEEP_BATCH = 500;
/** Runs expired per statement, and statements per sweep at most (the rest wait for the next sweep). */
const DEADLINE_BATCH = 200;
const DEADLINE_BATCHES = 5;
/** The lease wake comes this long after the first lease's expiry (the database rounds to the millisecond). */
const LEASE_WAKE_MARGIN_MS = 50;
/** Waits whose time came (a sleep's end, a signal's or an approval's timeout) ended per statement, and statements per sweep at most. */
const WAKE_BATCH = 200;
const WAKE_BATCHES = 5;
/** The orphan pass (child runs left active under an ended parent) runs at the first tick, then this often at most. */
const ORPHAN_SWEEP_EVERY_MS = 60_000;
/** Parents the orphan pass reads per statement, and statements per pass at most. */
const ORPHAN_BATCH = 100;
const ORPHAN_BATCHES = 5;
/** A class no worker has announced within this long is reported unserved (explain, metric). */
export const UNSERVED_AFTER_MS = 30_000;
/** The tick after the first comes this soon at most: workers started together learn of each other. */
const SECOND_TICK_MS = 1000;

/**
 * Losing Redis loses nothing: from PostgreSQL alone, in bounded batches, the sweeper re-sends
 * due `queued` stages and expired leases to the transport (job ids dedupe repeats), and keeps
 * this worker's row in ratchet.workers fresh (explain uses it to say no worker serves a class).
 * It also expires runs past their deadline, so a run expires within one sweep whatever its
 * stages wait for (a retry delay, a class nobody serves, a long stage), and once a minute cancels
 * child runs left active under an ended parent (the orphan pass).
 */
export class Sweeper {
  private timer: NodeJS.Timeout | null = null;
  /** A one-shot wake at the first live lease's expiry, when that comes before the next tick. */
  private leaseTimer: NodeJS.Timeout | null = null;
  private running: Promise<void> | null = null;
  private stopped = false;
  /** The tick after start's first comes sooner (SECOND_TICK_MS). */
  private secondTickSoon = false;
  /** When the orphan pass last ran (performance.now()), null before the first. */
  private orphansSweptAt: number | null = null;

  constructor(
    private readonly store: Store,
    private readonly transport: Transport,
    private readonly owner: string,
    /** The classes this worker serves, each with the hashes of its loaded definitions. */
    private readonly definitions: ReadonlyMap<string, readonly string[]>,
    /** Every class this worker's registry knows: watched for "no worker serves it". */
    private readonly known: string[],
    private readonly intervalMs: number,
    private readonly logger: Logger,
    private readonly metrics: Metrics,
    /** Opt-in: fail stages of classes no worker served for this long (null: never). */
    private readonly failUnservedAfterMs: number | null = null,
    /** The retention policy (createRatchet({ retention })), applied each tick in bounded batches (null: keep every run). */
    private readonly retention: RetentionAges | null = null,
    /** Fires the cron schedules that have a tick due (src/schedules/fire.ts); null: none. */
    private readonly fireSchedules: (() => Promise<void>) | null = null,
    /** The loaded definitions, to refuse approvals whose timeout passed (issue 10); null: waits are not swept here. */
    private readonly registry: Registry | null = null,
    /** The live workers of the database (this one included), at each tick: the worker's share of the statement lanes and its pass-on cap. */
    private readonly onPeers: ((live: number) => void) | null = null,
  ) {}

  start(): void {
    this.stopped = false;
    this.secondTickSoon = true;
    this.orphansSweptAt = null;
    void this.tick();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    if (this.leaseTimer) clearTimeout(this.leaseTimer);
    this.leaseTimer = null;
    const r = this.running;
    this.running = null;
    await r;
  }

  private schedule(): void {
    const delay = this.secondTickSoon ? Math.min(this.intervalMs, SECOND_TICK_MS) : this.intervalMs;
    this.secondTickSoon = false;
    this.timer = setTimeout(() => void this.tick(), delay);
    this.timer.unref();
  }

  private tick(): Promise<void> {
    this.running = (async () => {
      await this.expireRuns();
      await this.sweepOrphans();
      await this.wakeWaits();
      await this.fireSchedules?.().catch((err: Error) =>
        this.logger.warn({ event: 'schedules_failed', err: err.message }, 'firing schedules failed'),
      );
      try {
        const lanes = [...this.definitions].flatMap(([toolClass, hashes]) => hashes.map((h) => ({ toolClass, definitionHash: h })));
        // The live workers (this one included) set this worker's share of the statement lanes (DbLanes) and its pass-on cap.
        const live = await this.store.upsertWorker(
          this.owner,
          [...this.definitions.keys()],
          [...new Set(lanes.map((l) => l.definitionHash))],
          Math.max(LIVE_WORKER_MS, 3 * this.intervalMs),
        );
        this.onPeers?.(live);
        const unserved = new Set(await this.store.unservedClasses(this.known, UNSERVED_AFTER_MS));
        for (const c of this.known) this.metrics.unservedClass.set({ tool_class: c }, unserved.has(c) ? 1 : 0);
        if (unserved.size > 0) {
          this.logger.warn({ event: 'class_unserved', classes: [...unserved] }, 'no worker has served these classes recently');
          if (this.failUnservedAfterMs !== null) {
            const failed = await this.store.failUnserved([...unserved], this.failUnservedAfterMs);
            if (failed > 0)
              this.logger.warn({ event: 'no_worker', count: failed }, 'stages of unserved classes failed (failUnservedAfterMs)');
          }
        }
        if (this.transport.kind !== 'in-process' && this.transport.healthy()) {
          // Queued stages younger than one sweep interval still have the wake-up sent when they were queued.
          const due = await this.store.sweep(lanes, SWEEP_BATCH, this.intervalMs);
          for (const s of due) this.transport.notify(laneOf(s.toolClass, s.definitionHash), { stageId: s.stageId, attempt: s.attempt });
          if (due.length > 0) this.logger.debug({ event: 'sweep', count: due.length }, 'due stages re-sent');
          await this.armLeaseTimer(lanes);
        }
        if (this.retention) await applyRetention(this.store, this.retention, this.logger);
      } catch (err) {
        this.logger.warn({ event: 'sweep_failed', err: (err as Error).message }, 'sweep failed');
      }
    })();
    return this.running.finally(() => {
      if (!this.stopped) this.schedule();
    });
  }

  /**
   * Reclaim after a crash within about the lease, not lease + one sweep interval: when the first
   * live lease of this worker's lanes expires before the next tick, wake then (plus a small margin
   * for the clocks' rounding) and re-send the expired leases only. Leases kept alive by heartbeats
   * move on, and the wake finds nothing: one indexed statement (stages_running_lease_idx).
   */
  private async armLeaseTimer(lanes: { toolClass: string; definitionHash: string }[]): Promise<void> {
    if (this.leaseTimer || this.stopped) return;
    const waitMs = await this.store.nextLeaseExpiryMs(lanes);
    if (waitMs === null || this.stopped) return;
    const delay = waitMs + LEASE_WAKE_MARGIN_MS;
    if (delay >= this.intervalMs) return; // the next tick comes first
    this.leaseTimer = setTimeout(() => {
      this.leaseTimer = null;
      if (this.stopped || this.transport.kind === 'in-process' || !this.transport.healthy()) return;
      void (async () => {
        try {
          const due = (await this.store.sweep(lanes, SWEEP_BATCH, this.intervalMs)).filter((s) => s.attempt > 1);
          for (const s of due) this.transport.notify(laneOf(s.toolClass, s.definitionHash), { stageId: s.stageId, attempt: s.attempt });
          if (due.length > 0) this.logger.debug({ event: 'sweep_leases', count: due.length }, 'expired leases re-sent');
          await this.armLeaseTimer(lanes);
        } catch (err) {
          this.logger.warn({ event: 'sweep_failed', err: (err as Error).message }, 'sweep of expired leases failed');
        }
      })();
    }, delay);
    this.leaseTimer.unref();
  }

  /**
   * Waits whose time came by the database clock (issue 10), in bounded batches shared with other
   * workers' sweepers (SKIP LOCKED): a sleep's end and a signal's timeout queue the stage again
   * (its claim ends it); an approval's timeout is refused here (approval_timeout, settled like a
   * rejection) when this worker has the run's definition, else left for one that has it.
   */
  private async wakeWaits(): Promise<void> {
    const registry = this.registry;
    if (!registry) return;
    try {
      for (let i = 0; i < WAKE_BATCHES; i++) {
        const r = await wakeDueWaits(
          this.store.db,
          WAKE_BATCH,
          (due) => refuseTimedOut(registry, due),
          registry.list().map((w) => w.hash),
        );
        const reg = this.metrics.registry;
        for (const w of r.woken) {
          this.transport.notify(laneOf(w.toolClass, w.definitionHash), { stageId: w.id, attempt: w.attempt });
          recordWaitEnded(reg, w.kind, w.kind === 'sleep' ? 'woken' : 'timed_out');
        }
        for (const t of r.decisions) {
          recordWaitEnded(reg, 'approval', 'timed_out');
          recordApprovalDecision(reg, t.waitedMs / 1000, 'timed_out');
        }
        for (const s of r.settled)
          for (const q of s.queued) this.transport.notify(laneOf(q.toolClass, q.definitionHash), { stageId: q.id, attempt: q.attempt });
        if (r.woken.length + r.timedOut.length > 0)
          this.logger.info({ event: 'waits_woken', woken: r.woken.length, timedOut: r.timedOut.length }, 'waits whose time came ended');
        if (r.seen < WAKE_BATCH) break;
      }
    } catch (err) {
      this.logger.warn({ event: 'wake_waits_failed', err: (err as Error).message }, 'ending waits whose time came failed');
    }
  }

  /** Child runs left active under an ended parent (a failure's follow-up lost with its process), cancelled. */
  private async sweepOrphans(): Promise<void> {
    if (this.stopped || (this.orphansSweptAt !== null && performance.now() - this.orphansSweptAt < ORPHAN_SWEEP_EVERY_MS)) return;
    this.orphansSweptAt = performance.now();
    try {
      for (let i = 0; i < ORPHAN_BATCHES && !this.stopped; i++) {
        const d = await this.store.sweepOrphans(ORPHAN_BATCH);
        for (const kind of d.waitsClosed) recordWaitEnded(this.metrics.registry, kind, 'cancelled');
        if (d.runIds.length > 0)
          this.logger.warn(
            { event: 'orphans_cancelled', count: d.runIds.length, runningStages: d.runningStageIds.length },
            'child runs left active under an ended parent were cancelled',
          );
        if (d.parents < ORPHAN_BATCH) break;
      }
    } catch (err) {
      this.logger.warn({ event: 'orphan_sweep_failed', err: (err as Error).message }, 'cancelling child runs of ended parents failed');
    }
  }

  /** Runs past their deadline become `expired`, in bounded batches (deadline.sql.ts). */
  private async expireRuns(): Promise<void> {
    try {
      for (let i = 0; i < DEADLINE_BATCHES; i++) {
        const { expired } = this.expired(await this.store.expireRuns(DEADLINE_BATCH));
        if (expired < DEADLINE_BATCH) break;
      }
    } catch (err) {
      this.logger.warn({ event: 'expire_failed', err: (err as Error).message }, 'expiring runs past their deadline failed');
    }
  }

  /** One run whose deadline a claim found passed before any sweep expired it (the executor): expired now, as a sweep would. Throws what the store throws. */
  async expireRun(runId: string): Promise<void> {
    this.expired(await this.store.expireRun(runId));
  }

  /** After an expiry: the waits it closed counted, the parent stages it queued woken, a log line. */
  private expired(e: ExpiredRuns): ExpiredRuns {
    const { expired, runningStageIds, woken, childrenCancelled, waitsExpired, waitsCancelled } = e;
    for (const kind of waitsExpired ?? []) recordWaitEnded(this.metrics.registry, kind, 'expired');
    for (const kind of waitsCancelled ?? []) recordWaitEnded(this.metrics.registry, kind, 'cancelled');
    // A parent stage an expired child run queued again: its next claim fails it with child_run_expired.
    for (const w of woken) this.transport.notify(laneOf(w.toolClass, w.definitionHash), { stageId: w.stageId, attempt: w.attempt });
    if (expired > 0) {
      const runningStages = runningStageIds.length;
      this.logger.info(
        { event: 'run_expired', count: expired, runningStages, parentsWoken: woken.length, childrenCancelled },
        'runs past their deadline expired',
      );
    }
    return e;
  }
}

/**
 * The refusal of an approval whose timeout passed: approval_timeout, decided at the timeout, an
 * agent's call kept as a value (the model hears it), a static step's failing the run unless it
 * continues on error. null when this process lacks the run's definition (left for another).
 */
export function refuseTimedOut(registry: Registry, due: DueApproval): { error: unknown; asValue: boolean } | null {
  const wf = registry.byHash(due.definitionHash);
  if (!wf) return null;
  const tool = toolsOf(wf).find((t) => t.name === due.tool);
  if (!tool) return null;
  const step = wf.agent ? null : (wf.steps[stepIndexOf(due.seq)] ?? null);
  const d = decideRefusal(wf, step, tool, { outcome: 'timed_out', decidedBy: null, decidedAt: due.until, reason: null });
  return { error: d.error, asValue: d.kind !== 'fail_run' };
}
