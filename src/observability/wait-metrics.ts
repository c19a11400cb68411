import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import { WAIT_KINDS } from '../planner/waits.js';
import type { Queryable } from '../store/db.js';

const NAME = 'ratchet_waiting_stages';

/**
 * Stages that wait without a lease (issue 10), by kind — sleep, signal, approval — read from
 * ratchet.waits at each scrape (waits_open_kind_idx), so every process serving /v1/metrics tells
 * the same, database-wide figure. Each kind is always present (0 when none waits).
 */
export async function refreshWaitingStages(registry: Registry, db: Queryable): Promise<void> {
  const gauge =
    (registry.getSingleMetric(NAME) as Gauge<'kind'> | undefined) ??
    new Gauge({
      name: NAME,
      help: 'stages waiting without a lease (no worker holds them), by kind: sleep, signal, approval (database-wide)',
      labelNames: ['kind'],
      registers: [registry],
    });
  const rows = await db.query(
    `SELECT w.kind, count(*)::int AS n FROM ratchet.waits w JOIN ratchet.stages s ON s.id = w.stage_id
     WHERE w.ended_at IS NULL AND s.state IN ('waiting', 'awaiting_approval') GROUP BY w.kind`,
  );
  const by = new Map(rows.map((r) => [r.kind as string, r.n as number]));
  for (const kind of WAIT_KINDS) gauge.set({ kind }, by.get(kind) ?? 0);
}

const ENDED = 'ratchet_waits_ended_total';
const DECISION = 'ratchet_approval_decision_seconds';

/**
 * Waits this process ended, by kind (sleep, signal, approval) and outcome (woken, signalled,
 * timed_out, approved, rejected, cancelled, expired): counted where the wait ends — the API
 * (a signal, a decision, a cancel), a worker's claim (a kept signal taken) or its sweeper (a
 * sleep's end, a timeout, a run's deadline).
 */
export function recordWaitEnded(registry: Registry, kind: string, outcome: string, n = 1): void {
  if (n <= 0) return;
  const counter =
    (registry.getSingleMetric(ENDED) as Counter<'kind' | 'outcome'> | undefined) ??
    new Counter({
      name: ENDED,
      help: 'waits ended by this process, by kind (sleep, signal, approval) and outcome',
      labelNames: ['kind', 'outcome'],
      registers: [registry],
    });
  counter.inc({ kind, outcome }, n);
}

/** How long a person took to decide an approval (its wait's start to the decision, by the database clock); timeouts included. */
export function recordApprovalDecision(registry: Registry, seconds: number, outcome: string): void {
  const histogram =
    (registry.getSingleMetric(DECISION) as Histogram<'outcome'> | undefined) ??
    new Histogram({
      name: DECISION,
      help: 'seconds from an approval request to its decision (approved, rejected, timed_out)',
      labelNames: ['outcome'],
      buckets: [1, 10, 60, 300, 900, 3600, 4 * 3600, 24 * 3600, 7 * 24 * 3600],
      registers: [registry],
    });
  histogram.observe({ outcome }, Math.max(0, seconds));
}
