import { Gauge, type Registry } from 'prom-client';
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
