import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';

/**
 * Prometheus metrics (prom-client): seconds, `_total` counters, labels bounded to tool class,
 * workflow and model names (all from the loaded definitions) and fixed words — never ids. One
 * Metrics object per process; the API server serves `registry` at /v1/metrics, and
 * `ratchet worker --metrics-port` at /metrics (serveMetrics below).
 *
 * Heartbeat age, lease remaining, worker slots and tool threads are gauges computed at scrape
 * time from what the workers of this process hold (track()), so a heartbeat that has stopped
 * shows as an age that keeps growing, not as the last value an extend happened to record.
 */

/** Labels of an attempt: its tool class, its workflow, and for a model call the model's name. */
export interface AttemptLabels {
  tool_class: string;
  workflow: string;
  model?: string;
}

/** What a worker shows at scrape time. */
export interface WorkerSample {
  /** The attempts its lease keeper holds now. */
  attempts: { labels: AttemptLabels; heartbeatAgeSeconds: number; leaseRemainingSeconds: number }[];
  /** Per tool class it serves: slots in use and its concurrency. */
  slots: { toolClass: string; inUse: number; capacity: number }[];
  /** Its tool threads (isolation: 'thread'), when it has a thread runner. */
  threads?: { threads: number; busy: number };
}

export type ExtensionFailureReason = 'timeout' | 'unavailable' | 'error';
type AttemptLabelName = 'tool_class' | 'workflow' | 'model';

export interface Metrics {
  readonly registry: Registry;
  readonly leasesExpired: Counter<'tool_class' | 'workflow'>;
  /** reason: `timeout` (no answer within the tick's time limit), `unavailable` (connection refused / reset), `error`. */
  readonly extensionFailures: Counter<'reason'>;
  readonly reclaims: Counter<'tool_class' | 'workflow'>;
  readonly resultsRejected: Counter<'tool_class' | 'workflow'>;
  readonly stageDuration: Histogram<AttemptLabelName | 'outcome'>;
  readonly stagesClaimed: Counter<'tool_class' | 'workflow'>;
  readonly ownershipUnknown: Counter<'tool_class' | 'workflow'>;
  readonly unservedClass: Gauge<'tool_class'>;
  /** Adds a worker to what scrapes read; returns its removal (call it when the worker stops). */
  track(sample: () => WorkerSample): () => void;
}

/** A label set without empty values (`model` only for model calls). */
type LabelValues = Partial<Record<AttemptLabelName, string>>;
const present = (labels: AttemptLabels): LabelValues =>
  Object.fromEntries(Object.entries(labels).filter(([, v]) => typeof v === 'string' && v !== '')) as LabelValues;

export function createMetrics(registry = new Registry()): Metrics {
  const buckets = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];
  const sources = new Set<() => WorkerSample>();
  const registers = [registry];
  registerScrapeGauges(registers, () => [...sources].map((s) => s()));
  const byClassAndWorkflow: ('tool_class' | 'workflow')[] = ['tool_class', 'workflow'];
  const counter = <L extends string>(name: string, help: string, labelNames: L[]) =>
    cachedCounter(new Counter<L>({ name, help, labelNames, registers }));
  return {
    registry,
    track(sample) {
      sources.add(sample);
      return () => void sources.delete(sample);
    },
    leasesExpired: counter('ratchet_leases_lost_total', 'Leases found lost (expired or taken over) at a heartbeat', byClassAndWorkflow),
    extensionFailures: counter(
      'ratchet_lease_extension_failures_total',
      'Extend statements that errored or did not answer in time (ownership unknown, not lost), by reason',
      ['reason'],
    ),
    reclaims: counter('ratchet_reclaims_total', 'Claims that took over an expired lease', byClassAndWorkflow),
    resultsRejected: counter(
      'ratchet_results_rejected_total',
      'Finishes the fence refused (stale owner, token, lease)',
      byClassAndWorkflow,
    ),
    stageDuration: cachedHistogram(
      new Histogram({
        name: 'ratchet_stage_duration_seconds',
        help: 'One attempt from claim to finish',
        labelNames: [...ATTEMPT_LABELS, 'outcome'],
        buckets,
        registers,
      }),
    ),
    stagesClaimed: counter('ratchet_stages_claimed_total', 'Attempts claimed', byClassAndWorkflow),
    ownershipUnknown: counter(
      'ratchet_ownership_unknown_total',
      'Attempts whose lease confirmation deadline passed without an answer',
      byClassAndWorkflow,
    ),
    unservedClass: new Gauge({
      name: 'ratchet_class_unserved',
      help: '1 when no worker has served the class recently while it has due stages',
      labelNames: ['tool_class'],
      registers,
    }),
  };
}

const ATTEMPT_LABELS: AttemptLabelName[] = ['tool_class', 'workflow', 'model'];

/*
 * prom-client validates and hashes a call's labels every time (~2% of a worker's CPU for
 * stage_duration's observe and stages_claimed's inc per stage, PERF-NOTES §15). The executor
 * passes frozen label sets, made once per tool class/workflow/model (and outcome): for such a
 * set, the value cell prom-client made for it at its first call (validated, hashed, stored under
 * its hash) is kept by the set's identity and counted into directly — the same cell the next
 * slow call would find, so the scrape is the same. A cell is used only while prom-client still
 * holds it under that hash (a reset, a remove or a zero() replace it: the next call goes the slow
 * way and keeps the new one). A label set that is not frozen (it could change), a value that is
 * not a plain finite number, or a cell that cannot be found (prom-client's hash spelled
 * differently) always go the slow way.
 */
type Cells = Record<string, { labels: object; value?: number; sum?: number; count?: number; bucketValues?: Record<string, number> }>;
interface Kept<E> {
  hash: string;
  cell: E;
}

/** prom-client's key for a label set (its hashObject over the sorted label names), or null for a set with other names. */
function cellKey(sortedNames: readonly string[], labels: Record<string, unknown>): string | null {
  let key = '';
  for (const name of Object.keys(labels)) if (!sortedNames.includes(name)) return null;
  for (const name of sortedNames) {
    const value = labels[name];
    if (value !== undefined) key += `${name}:${String(value)},`;
  }
  return key;
}

/** The cell prom-client now holds for a frozen label set, if it can be found (see above). */
function findCell(metric: object, labels: object): Kept<Cells[string]> | null {
  const m = metric as unknown as { hashMap: Cells; sortedLabelNames: string[] };
  if (!Object.isFrozen(labels) || !m.hashMap || !Array.isArray(m.sortedLabelNames)) return null;
  const hash = cellKey(m.sortedLabelNames, labels as Record<string, unknown>);
  const cell = hash === null ? undefined : m.hashMap[hash];
  if (hash === null || cell === undefined) return null;
  // The cell's own labels must be this set's (a cell made from an equal set is as good).
  const own = cell.labels as Record<string, unknown>;
  for (const [k, v] of Object.entries(labels)) if (own[k] !== v) return null;
  for (const [k, v] of Object.entries(own)) if ((labels as Record<string, unknown>)[k] !== v) return null;
  return { hash, cell };
}

/** A counter whose inc(frozenLabels[, n]) adds to its kept cell (see above); anything else is prom-client's own inc. */
function cachedCounter<L extends string>(counter: Counter<L>): Counter<L> {
  const m = counter as unknown as { inc: (labels?: unknown, value?: unknown) => void; hashMap: Cells };
  const slow = m.inc.bind(counter);
  const kept = new WeakMap<object, Kept<Cells[string]>>();
  m.inc = (labels?: unknown, value?: unknown) => {
    if (typeof labels === 'object' && labels !== null) {
      const k = kept.get(labels);
      if (
        k !== undefined &&
        m.hashMap[k.hash] === k.cell &&
        (value === undefined || (typeof value === 'number' && Number.isFinite(value) && value >= 0))
      ) {
        k.cell.value! += value === undefined ? 1 : value;
        return;
      }
      slow(labels, value);
      const found = findCell(counter, labels);
      if (found && typeof found.cell.value === 'number') kept.set(labels, found);
      return;
    }
    slow(labels, value);
  };
  return counter;
}

/** A histogram whose observe(frozenLabels, seconds) counts into its kept cell (see above); anything else is prom-client's own observe. */
function cachedHistogram<L extends string>(histogram: Histogram<L>): Histogram<L> {
  const m = histogram as unknown as { observe: (labels?: unknown, value?: unknown) => void; hashMap: Cells; upperBounds: number[] };
  if (!Array.isArray(m.upperBounds)) return histogram;
  const bounds = m.upperBounds;
  const slow = m.observe.bind(histogram);
  const kept = new WeakMap<object, Kept<Cells[string]>>();
  m.observe = (labels?: unknown, value?: unknown) => {
    if (typeof labels === 'object' && labels !== null && typeof value === 'number' && Number.isFinite(value)) {
      const k = kept.get(labels);
      if (k !== undefined && m.hashMap[k.hash] === k.cell) {
        const cell = k.cell;
        cell.sum! += value;
        cell.count! += 1;
        // prom-client's findBound: the first upper bound at or over the value; past the last, no bucket (+Inf is the count).
        for (const bound of bounds) {
          if (value <= bound) {
            if (Object.hasOwn(cell.bucketValues!, bound)) cell.bucketValues![bound]! += 1;
            break;
          }
        }
        return;
      }
      slow(labels, value);
      const found = findCell(histogram, labels);
      if (found && typeof found.cell.sum === 'number' && typeof found.cell.count === 'number' && found.cell.bucketValues)
        kept.set(labels, found);
      return;
    }
    slow(labels, value);
  };
  return histogram;
}

/** Sums a per-worker number by tool class. */
function byClass(samples: WorkerSample[], value: (slot: WorkerSample['slots'][number]) => number): Map<string, number> {
  const sum = new Map<string, number>();
  for (const s of samples) for (const slot of s.slots) sum.set(slot.toolClass, (sum.get(slot.toolClass) ?? 0) + value(slot));
  return sum;
}

/** One value per label set of the held attempts, folded with `pick` (the oldest heartbeat, the least lease). */
type HeldAttempt = WorkerSample['attempts'][number];
function perLabels(samples: WorkerSample[], pick: (a: number, b: number) => number, value: (a: HeldAttempt) => number) {
  const out = new Map<string, { labels: LabelValues; value: number }>();
  for (const sample of samples) {
    for (const a of sample.attempts) {
      const labels = present(a.labels);
      const key = JSON.stringify(labels);
      const seen = out.get(key);
      out.set(key, { labels, value: seen ? pick(seen.value, value(a)) : value(a) });
    }
  }
  return out.values();
}

/** The gauges computed at scrape time from the tracked workers (nothing sets them in between). */
function registerScrapeGauges(registers: Registry[], read: () => WorkerSample[]): void {
  new Gauge({
    name: 'ratchet_heartbeat_age_seconds',
    help: 'Time since the last confirmed heartbeat (or claim) of the held attempts, the oldest per label set, at scrape time',
    labelNames: ATTEMPT_LABELS,
    registers,
    collect() {
      this.reset();
      for (const { labels, value } of perLabels(read(), Math.max, (a) => a.heartbeatAgeSeconds)) this.set(labels, value);
    },
  });
  new Gauge({
    name: 'ratchet_lease_remaining_seconds',
    help: 'Lease time the worker can still vouch for (its confirmation deadline), the least per label set, at scrape time',
    labelNames: ATTEMPT_LABELS,
    registers,
    collect() {
      this.reset();
      for (const { labels, value } of perLabels(read(), Math.min, (a) => a.leaseRemainingSeconds)) this.set(labels, value);
    },
  });
  new Gauge({
    name: 'ratchet_worker_slots_in_use',
    help: 'Stages of the class whose tool a worker runs now (a slot is freed when the tool settles or is left behind)',
    labelNames: ['tool_class'],
    registers,
    collect() {
      this.reset();
      for (const [toolClass, n] of byClass(read(), (slot) => slot.inUse)) this.set({ tool_class: toolClass }, n);
    },
  });
  new Gauge({
    name: 'ratchet_worker_slots',
    help: "Slots per tool class (the workers' concurrency)",
    labelNames: ['tool_class'],
    registers,
    collect() {
      this.reset();
      for (const [toolClass, n] of byClass(read(), (slot) => slot.capacity)) this.set({ tool_class: toolClass }, n);
    },
  });
  new Gauge({
    name: 'ratchet_tool_threads',
    help: 'Tool threads (isolation: thread) alive, busy with a call or idle',
    labelNames: ['state'],
    registers,
    collect() {
      this.reset();
      const threads = read().flatMap((s) => (s.threads ? [s.threads] : []));
      if (threads.length === 0) return;
      this.set(
        { state: 'busy' },
        threads.reduce((n, t) => n + t.busy, 0),
      );
      this.set(
        { state: 'idle' },
        threads.reduce((n, t) => n + t.threads - t.busy, 0),
      );
    },
  });
}

/** The process-wide default (what the worker and the API server use unless given one). */
let defaultMetrics: Metrics | null = null;
export function processMetrics(): Metrics {
  defaultMetrics ??= createMetrics();
  return defaultMetrics;
}

/**
 * Serves `registry` as Prometheus text at GET /metrics (and /) on host:port (port 0: any free
 * port). Returns the URL and a close().
 */
export async function serveMetrics(
  registry: Registry,
  opts: { port: number; host?: string },
): Promise<{ url: string; close(): Promise<void> }> {
  const host = opts.host ?? '127.0.0.1';
  const server = createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    if (req.method !== 'GET' || (path !== '/metrics' && path !== '/')) {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('not found: GET /metrics\n');
      return;
    }
    registry.metrics().then(
      (text) => res.writeHead(200, { 'content-type': registry.contentType }).end(text),
      (err: unknown) => res.writeHead(500, { 'content-type': 'text/plain' }).end(`metrics failed: ${(err as Error).message}\n`),
    );
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://${host.includes(':') ? `[${host}]` : host}:${port}/metrics`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
