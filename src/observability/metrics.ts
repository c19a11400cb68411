import { Counter, Gauge, Histogram, Registry } from 'prom-client';

/**
 * Prometheus metrics (prom-client): seconds, `_total` counters, labels bounded to tool class
 * (never ids). One Metrics object per process; the API server serves `registry` at /metrics.
 */
export interface Metrics {
  readonly registry: Registry;
  readonly heartbeatAge: Histogram<'tool_class'>;
  readonly leaseRemaining: Histogram<'tool_class'>;
  readonly leasesExpired: Counter<'tool_class'>;
  readonly extensionFailures: Counter<never>;
  readonly reclaims: Counter<'tool_class'>;
  readonly resultsRejected: Counter<'tool_class'>;
  readonly stageDuration: Histogram<'tool_class' | 'outcome'>;
  readonly stagesClaimed: Counter<'tool_class'>;
  readonly ownershipUnknown: Counter<'tool_class'>;
  readonly unservedClass: Gauge<'tool_class'>;
}

export function createMetrics(registry = new Registry()): Metrics {
  const buckets = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];
  return {
    registry,
    heartbeatAge: new Histogram({ name: 'ratchet_heartbeat_age_seconds', help: 'Time since the previous confirmed heartbeat when a lease is extended', labelNames: ['tool_class'], buckets, registers: [registry] }),
    leaseRemaining: new Histogram({ name: 'ratchet_lease_remaining_seconds', help: 'Lease time left when a heartbeat confirmed it', labelNames: ['tool_class'], buckets, registers: [registry] }),
    leasesExpired: new Counter({ name: 'ratchet_leases_lost_total', help: 'Leases found lost (expired or taken over) at a heartbeat', labelNames: ['tool_class'], registers: [registry] }),
    extensionFailures: new Counter({ name: 'ratchet_lease_extension_failures_total', help: 'Extend statements that errored or did not answer (ownership unknown, not lost)', registers: [registry] }),
    reclaims: new Counter({ name: 'ratchet_reclaims_total', help: 'Claims that took over an expired lease', labelNames: ['tool_class'], registers: [registry] }),
    resultsRejected: new Counter({ name: 'ratchet_results_rejected_total', help: 'Finishes refused by the fence (stale owner, token or lease)', labelNames: ['tool_class'], registers: [registry] }),
    stageDuration: new Histogram({ name: 'ratchet_stage_duration_seconds', help: 'One attempt from claim to finish', labelNames: ['tool_class', 'outcome'], buckets, registers: [registry] }),
    stagesClaimed: new Counter({ name: 'ratchet_stages_claimed_total', help: 'Attempts claimed', labelNames: ['tool_class'], registers: [registry] }),
    ownershipUnknown: new Counter({ name: 'ratchet_ownership_unknown_total', help: 'Attempts whose lease confirmation deadline passed without an answer', labelNames: ['tool_class'], registers: [registry] }),
    unservedClass: new Gauge({ name: 'ratchet_class_unserved', help: '1 when no worker has served the class recently while it has due stages', labelNames: ['tool_class'], registers: [registry] }),
  };
}

/** The process-wide default (what the worker and the API server use unless given one). */
let defaultMetrics: Metrics | null = null;
export function processMetrics(): Metrics {
  defaultMetrics ??= createMetrics();
  return defaultMetrics;
}
