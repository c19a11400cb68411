import { ApiError } from '../src/api/errors.js';
import type { RatchetClient } from '../src/client/index.js';
import type { FaultRecord, SubmitRecord } from './history.js';
import type { Prng } from './prng.js';
import { MAP_ITEMS_MAX, SIGNAL_NAME } from './workflows/_flows.js';
import { sleep } from './sleep.js';

/**
 * The soak's client side: a steady stream of submits over the HTTP API, with duplicate
 * submits (one idempotency key sent again, or twice at once), cancels at random points, the
 * retry of failed runs, and one tenant's flood. Every loop is bounded in count and time.
 *
 * WORKFLOW_MIX weighs the soak's workflows (chaos/workflows/_flows.ts), the run graph's among
 * them (fan-out and join, a map, a child run), and waits: the driver approves or rejects a gated
 * call, or sends a run its signal (sometimes twice with one Signal-Id), at a seeded moment after
 * the submit, through the HTTP API (fault kinds approve, reject, signal).
 */
export const WORKFLOW_MIX = {
  chaos_pipeline: 22,
  chaos_limited: 10,
  chaos_flaky: 8,
  chaos_tenant: 18,
  chaos_agent: 12,
  chaos_roll: 12,
  chaos_fanout: 8,
  chaos_map: 8,
  chaos_parent: 8,
  chaos_approval: 6,
  chaos_signal: 6,
} as const;
type MixWorkflow = keyof typeof WORKFLOW_MIX;

export const SMALL_TENANTS = ['acme', 'globex', 'initech', 'umbrella', 'hooli'];
export const FLOOD_TENANT = 'flood';

/** One submit as the seed plans it: drawn from its own fork, before the soak starts. */
export interface PlannedSubmit {
  /** Its name: the stream's number, or flood<k>-<j>. */
  id: string;
  atMs: number;
  workflow: MixWorkflow;
  key: string;
  input: Record<string, unknown>;
  twiceAtOnce: boolean;
  /** Sent again with its key this long after the answer (null: not). */
  againAfterMs: number | null;
  /** Cancelled this long after the answer (null: not). */
  cancelAfterMs: number | null;
  /** chaos_approval: approved (or rejected) this long after the answer; null: left to time out. */
  decideAfterMs?: number | null;
  approve?: boolean;
  /** chaos_signal: signalled this long after the answer (null: left to time out), and sent twice with one Signal-Id. */
  signalAfterMs?: number | null;
  signalTwice?: boolean;
}

const numberOf = (id: string) => {
  const m = /^flood(\d+)-(\d+)$/.exec(id);
  const d = /^deploy(\d+)$/.exec(id);
  return m ? 1_000_000 * (Number(m[1]) + 1) + Number(m[2]) : d ? 900_000 + Number(d[1]) : Number(id);
};

/** Every choice of one submit, drawn at once from `rng` (its own fork). */
export function planSubmit(rng: Prng, seed: number, id: string, atMs: number, only?: MixWorkflow): PlannedSubmit {
  const workflow = only ?? rng.weighted(WORKFLOW_MIX);
  const n = numberOf(id);
  const work = rng.int(100, 1500); // long enough that a fault usually finds stages in flight
  const input =
    workflow === 'chaos_agent'
      ? { ref: `s${seed}-${id}` }
      : workflow === 'chaos_roll'
        ? { n }
        : workflow === 'chaos_tenant'
          ? { tenant: only ? FLOOD_TENANT : rng.pick(SMALL_TENANTS), n, work }
          : workflow === 'chaos_map'
            ? { n, work, items: rng.int(2, MAP_ITEMS_MAX) }
            : { n, work };
  const twiceAtOnce = rng.chance(0.02);
  const again = rng.chance(0.06);
  const cancel = rng.chance(0.04);
  const againAfter = rng.int(0, 2000);
  const cancelAfter = rng.int(0, 3000);
  const waits =
    workflow === 'chaos_approval'
      ? { decideAfterMs: rng.chance(0.9) ? rng.int(0, 6000) : null, approve: rng.chance(0.8) }
      : workflow === 'chaos_signal'
        ? { signalAfterMs: rng.chance(0.9) ? rng.int(0, 8000) : null, signalTwice: rng.chance(0.3) }
        : {};
  return {
    ...waits,
    id,
    atMs,
    workflow,
    key: `chaos-${seed}-${id}`,
    input,
    twiceAtOnce,
    againAfterMs: again ? againAfter : null,
    cancelAfterMs: cancel ? cancelAfter : null,
  };
}

/** The driver's actions every soak plans early: within this long (or the first half of a shorter soak). */
export const ENSURE_WITHIN_MS = 60_000;

/**
 * The stream's submits for `durationMs` at `rate` per second: submit i from rng.fork('submit-' + i).
 * Then, from rng.fork('ensure'), what the draws may have left out of the first ENSURE_WITHIN_MS:
 * a cancel soon after the answer of a three-stage run (so it hits stages still to run), a
 * duplicate submit, and a flaky run (its deliberate failure is what the driver retries). A
 * stream that has them already is left as drawn.
 */
export function planStream(rng: Prng, seed: number, durationMs: number, rate: number): PlannedSubmit[] {
  const gap = 1000 / rate;
  const out: PlannedSubmit[] = [];
  let atMs = 0;
  for (let i = 1; i <= durationMs * rate; i++) {
    const f = rng.fork(`submit-${i}`);
    atMs += gap * (0.5 + f.next());
    if (atMs >= durationMs) break;
    out.push(planSubmit(f, seed, String(i), Math.round(atMs)));
  }
  const early = out.filter((p) => p.atMs < Math.min(ENSURE_WITHIN_MS, durationMs / 2));
  const e = rng.fork('ensure');
  // Pipelines only: their input is every other plain workflow's ({ n, work }), and three stages leave work to cancel.
  const pipelines = () => early.filter((p) => p.workflow === 'chaos_pipeline' && p.cancelAfterMs === null && p.againAfterMs === null);
  if (!early.some((p) => p.workflow === 'chaos_pipeline' && p.cancelAfterMs !== null && p.cancelAfterMs <= 500)) {
    const p = pipelines().length ? e.pick(pipelines()) : null;
    if (p) p.cancelAfterMs = e.int(0, 500);
  }
  if (!early.some((p) => p.againAfterMs !== null || p.twiceAtOnce)) {
    const p = pipelines().length ? e.pick(pipelines()) : null;
    if (p) p.againAfterMs = e.int(0, 2000);
  }
  if (!early.some((p) => p.workflow === 'chaos_flaky')) {
    const p = pipelines().length ? e.pick(pipelines()) : null;
    if (p) p.workflow = 'chaos_flaky';
  }
  return out;
}

export interface DriverOptions {
  client: RatchetClient;
  rng: Prng;
  seed: number;
  /** Submits per second. */
  rate: number;
  /** The version the deploy is at (chaos_roll runs are submitted for it). */
  deployVersion: () => 1 | 2;
  faults: FaultRecord[];
  log: (line: string) => void;
}

/** Most requests the driver has in the air at once. */
const MAX_IN_FLIGHT = 64;
const SUBMIT_TRIES = 10;

const retryable = (err: unknown) => !(err instanceof ApiError) || err.status === 0 || err.status >= 500;

export class Driver {
  readonly submits: SubmitRecord[] = [];
  /** Run id -> the chaos_roll version it was submitted for. */
  readonly versions: Record<string, number> = {};
  readonly accepted = new Map<string, { workflow: string; key: string }>();
  private readonly inFlight = new Set<Promise<unknown>>();
  private retried = new Set<string>();
  private readonly retryRng: Prng;

  constructor(private readonly o: DriverOptions) {
    this.retryRng = o.rng.fork('retry');
  }

  private track(p: Promise<unknown>): void {
    const q = p.catch((err: unknown) => this.o.log(`driver: ${(err as Error).message}`)).finally(() => this.inFlight.delete(q));
    this.inFlight.add(q);
  }

  /** One submit with its key, retried with the same key while the API does not answer (a lost answer is not a new run). */
  private async submitOnce(workflow: string, input: unknown, key: string, duplicate: boolean, version?: number): Promise<string | null> {
    const tenant = (input as { tenant?: string }).tenant;
    for (let attempt = 1; attempt <= SUBMIT_TRIES; attempt++) {
      const at = Date.now();
      try {
        const res = await this.o.client.submit(workflow, input, { idempotencyKey: key, ...(version ? { version } : {}) });
        this.submits.push({
          key,
          workflow,
          at,
          runId: res.id,
          status: res.status,
          duplicate,
          tries: attempt,
          ...(tenant ? { tenant } : {}),
          ...(version ? { version } : {}),
        });
        return res.id;
      } catch (err) {
        if (!retryable(err) || attempt === SUBMIT_TRIES) {
          this.submits.push({ key, workflow, at, runId: null, status: (err as ApiError).code ?? String(err), duplicate, tries: attempt });
          return null;
        }
        await sleep(300 * attempt);
      }
    }
    return null;
  }

  /** One planned submit: its duplicates and cancel as planned; the chaos_roll version is the deploy's at that moment (an outcome). */
  private async submit(p: PlannedSubmit): Promise<void> {
    const { workflow, key, input } = p;
    const version = workflow === 'chaos_roll' ? this.o.deployVersion() : undefined;
    if (p.twiceAtOnce) this.o.faults.push({ kind: 'duplicate_submit', at: Date.now(), endAt: Date.now(), detail: `${key} twice at once` });
    const [id] = await Promise.all([
      this.submitOnce(workflow, input, key, false, version),
      ...(p.twiceAtOnce ? [this.submitOnce(workflow, input, key, true, version)] : []),
    ]);
    if (id === null) return;
    this.accepted.set(id, { workflow, key });
    if (version) this.versions[id] = version;
    if (p.againAfterMs !== null) {
      await sleep(p.againAfterMs);
      this.o.faults.push({ kind: 'duplicate_submit', at: Date.now(), endAt: Date.now(), detail: key });
      await this.submitOnce(workflow, input, key, true, version);
    }
    if (p.decideAfterMs != null) await this.decide(id, p.decideAfterMs, p.approve !== false);
    if (p.signalAfterMs != null) await this.signal(id, p.signalAfterMs, p.key, (input as { n: number }).n, p.signalTwice === true);
    if (p.cancelAfterMs !== null) {
      await sleep(p.cancelAfterMs);
      const at = Date.now();
      try {
        const res = await this.o.client.cancel(id);
        this.o.faults.push({ kind: 'cancel', at, endAt: Date.now(), runId: id, detail: `${id} ${JSON.stringify(res).slice(0, 200)}` });
      } catch (err) {
        this.o.faults.push({ kind: 'cancel', at, endAt: Date.now(), runId: id, detail: `${id} refused: ${(err as Error).message}` });
      }
    }
  }

  /**
   * Approves or rejects the run's gated call `afterMs` after its submit was answered, through the
   * API; while the call is not awaiting yet (409), asked again every 500 ms, 10 times at most.
   */
  private async decide(id: string, afterMs: number, approve: boolean): Promise<void> {
    await sleep(afterMs);
    const kind = approve ? 'approve' : 'reject';
    for (let i = 0; i < 10; i++) {
      const at = Date.now();
      try {
        const res = approve
          ? await this.o.client.approve(id, { by: 'chaos' })
          : await this.o.client.reject(id, { reason: 'chaos', by: 'chaos' });
        this.o.faults.push({ kind, at, endAt: Date.now(), detail: `${id} ${JSON.stringify(res).slice(0, 200)}` });
        return;
      } catch (err) {
        if (i === 9 || !(err instanceof ApiError) || (err.status !== 409 && err.status < 500 && err.status !== 0)) {
          this.o.faults.push({ kind, at, endAt: Date.now(), detail: `${id} refused: ${(err as Error).message.slice(0, 200)}` });
          return;
        }
        await sleep(500);
      }
    }
  }

  /** Sends the run its signal `afterMs` after its submit was answered (Signal-Id: the submit's key), twice when asked. */
  private async signal(id: string, afterMs: number, key: string, n: number, twice: boolean): Promise<void> {
    await sleep(afterMs);
    for (let i = 0; i < (twice ? 2 : 1); i++) {
      const at = Date.now();
      try {
        const res = await this.o.client.signal(id, SIGNAL_NAME, { n }, { signalId: key });
        this.o.faults.push({ kind: 'signal', at, endAt: Date.now(), detail: `${id} ${JSON.stringify(res).slice(0, 200)}` });
      } catch (err) {
        this.o.faults.push({ kind: 'signal', at, endAt: Date.now(), detail: `${id} refused: ${(err as Error).message.slice(0, 200)}` });
      }
    }
  }

  /**
   * The planned stream from `startedAt`, each submit at its planned moment (later when
   * MAX_IN_FLIGHT requests are in the air); planned submits still due at `until` are not sent.
   */
  async stream(startedAt: number, until: number, plan: PlannedSubmit[]): Promise<void> {
    for (const p of plan) {
      await sleep(Math.max(0, startedAt + p.atMs - Date.now()));
      while (this.inFlight.size >= MAX_IN_FLIGHT && Date.now() < until) await sleep(20);
      if (Date.now() >= until) break;
      this.track(this.submit(p));
    }
  }

  /** Retries failed runs of this soak through the API, every few seconds, until `until`. */
  async retries(until: number): Promise<void> {
    for (let round = 0; round < 10_000 && Date.now() < until; round++) {
      await sleep(this.retryRng.int(2000, 4000));
      let failed: string[] = [];
      try {
        failed = (await this.o.client.list({ state: 'failed', limit: 100 })).runs.map((r) => r.id).filter((id) => this.accepted.has(id));
      } catch {
        continue; // the API may be cut off from PostgreSQL this moment
      }
      for (const id of failed.filter((x) => !this.retried.has(x)).slice(0, 20)) {
        if (Date.now() >= until) break;
        this.retried.add(id);
        const at = Date.now();
        try {
          const res = await this.o.client.retry(id);
          this.o.faults.push({ kind: 'retry', at, endAt: Date.now(), detail: `${id} ${JSON.stringify(res).slice(0, 200)}` });
        } catch (err) {
          this.o.faults.push({ kind: 'retry', at, endAt: Date.now(), detail: `${id} refused: ${(err as Error).message}` });
        }
      }
    }
  }

  /** Flood number `k`: `count` submits of the flooding tenant, planned before the first is sent, 8 in the air at a time. */
  async flood(k: number, count: number): Promise<void> {
    const queue = Array.from({ length: count }, (_, j) =>
      planSubmit(this.o.rng.fork(`flood-${k}-${j}`), this.o.seed, `flood${k}-${j}`, 0, 'chaos_tenant'),
    );
    await Promise.all(
      Array.from({ length: 8 }, async () => {
        for (let p = queue.shift(); p; p = queue.shift()) await this.submit(p);
      }),
    );
  }

  /**
   * Just before the rolling deploy: `count` chaos_roll runs of the current version (planned from
   * their own forks, no duplicate or cancel), resolved once accepted, so old-version runs are in
   * flight when the deploy begins.
   */
  async beforeDeploy(count: number): Promise<void> {
    const plans = Array.from({ length: count }, (_, j) => ({
      ...planSubmit(this.o.rng.fork(`deploy-${j}`), this.o.seed, `deploy${j}`, 0, 'chaos_roll'),
      twiceAtOnce: false,
      againAfterMs: null,
      cancelAfterMs: null,
    }));
    await Promise.all(plans.map((p) => this.submit(p)));
  }

  /** Waits for every request in the air (bounded). */
  async settle(timeoutMs: number): Promise<void> {
    const until = Date.now() + timeoutMs;
    while (this.inFlight.size > 0 && Date.now() < until) await sleep(50);
  }
}

/** The scripted model's answers: two agent_effect calls for the run's reference, then done. */
export function agentScript(request: { messages: { role: string; content?: unknown }[] }) {
  if (request.messages.some((m) => m.role === 'tool')) return { content: 'filed both cases' };
  const user = request.messages.find((m) => m.role === 'user');
  const ref = /"ref":"([^"]+)"/.exec(String(user?.content ?? ''))?.[1] ?? 'unknown';
  return {
    toolCalls: [
      { name: 'agent_effect', arguments: { ref: `${ref}-a` } },
      { name: 'agent_effect', arguments: { ref: `${ref}-b` } },
    ],
  };
}
