import { ApiError } from '../src/api/errors.js';
import type { RatchetClient } from '../src/client/index.js';
import type { FaultRecord, SubmitRecord } from './history.js';
import type { Prng } from './prng.js';

/**
 * The soak's client side: a steady stream of submits over the HTTP API, with duplicate
 * submits (one idempotency key sent again, or twice at once), cancels at random points, the
 * retry of failed runs, and one tenant's flood. Every loop is bounded in count and time.
 *
 * WORKFLOW_MIX is the hook for what the engine does not have yet: when fan-out (`after`),
 * `map` and waits with approvals land, add their workflows to chaos/workflows/_flows.ts and a
 * weight here (a wait needs the driver to send its signal or approval at a random point: a new
 * action in `afterAccepted`, recorded as a fault kind of its own).
 */
export const WORKFLOW_MIX = {
  chaos_pipeline: 30,
  chaos_limited: 10,
  chaos_flaky: 8,
  chaos_tenant: 20,
  chaos_agent: 16,
  chaos_roll: 16,
  // TODO(fan-out, map, waits): not in the engine yet (DESIGN.md "Run graph"); add them here when they exist.
} as const;
type MixWorkflow = keyof typeof WORKFLOW_MIX;

export const SMALL_TENANTS = ['acme', 'globex', 'initech', 'umbrella', 'hooli'];
export const FLOOD_TENANT = 'flood';

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

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
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
  private n = 0;
  private retried = new Set<string>();
  private readonly floodRng: Prng;
  private readonly retryRng: Prng;

  constructor(private readonly o: DriverOptions) {
    this.floodRng = o.rng.fork('flood');
    this.retryRng = o.rng.fork('retry');
  }

  private track(p: Promise<unknown>): void {
    const q = p.catch((err: unknown) => this.o.log(`driver: ${(err as Error).message}`)).finally(() => this.inFlight.delete(q));
    this.inFlight.add(q);
  }

  private inputFor(workflow: MixWorkflow, i: number, rng: Prng, tenant?: string): unknown {
    const work = rng.int(100, 1500); // long enough that a fault usually finds stages in flight
    switch (workflow) {
      case 'chaos_agent':
        return { ref: `s${this.o.seed}-${i}` };
      case 'chaos_roll':
        return { n: i };
      case 'chaos_tenant':
        return { tenant: tenant ?? rng.pick(SMALL_TENANTS), n: i, work };
      default:
        return { n: i, work };
    }
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
          ...(tenant ? { tenant } : {}),
          ...(version ? { version } : {}),
        });
        return res.id;
      } catch (err) {
        if (!retryable(err) || attempt === SUBMIT_TRIES) {
          this.submits.push({ key, workflow, at, runId: null, status: (err as ApiError).code ?? String(err), duplicate });
          return null;
        }
        await sleep(300 * attempt);
      }
    }
    return null;
  }

  /** Every random choice of one submit is drawn before its first await, so the stream's choices follow the seed. */
  private async submit(workflow: MixWorkflow, rng: Prng, tenant?: string): Promise<void> {
    const i = ++this.n;
    const key = `chaos-${this.o.seed}-${i}`;
    const input = this.inputFor(workflow, i, rng, tenant);
    const version = workflow === 'chaos_roll' ? this.o.deployVersion() : undefined;
    const twiceAtOnce = rng.chance(0.02);
    const again = rng.chance(0.06);
    const cancel = rng.chance(0.04);
    const againAfter = rng.int(0, 2000);
    const cancelAfter = rng.int(0, 3000);
    if (twiceAtOnce) this.o.faults.push({ kind: 'duplicate_submit', at: Date.now(), endAt: Date.now(), detail: `${key} twice at once` });
    const [id] = await Promise.all([
      this.submitOnce(workflow, input, key, false, version),
      ...(twiceAtOnce ? [this.submitOnce(workflow, input, key, true, version)] : []),
    ]);
    if (id === null) return;
    this.accepted.set(id, { workflow, key });
    if (version) this.versions[id] = version;
    if (again) {
      await sleep(againAfter);
      this.o.faults.push({ kind: 'duplicate_submit', at: Date.now(), endAt: Date.now(), detail: key });
      await this.submitOnce(workflow, input, key, true, version);
    }
    if (cancel) {
      await sleep(cancelAfter);
      const at = Date.now();
      try {
        const res = await this.o.client.cancel(id);
        this.o.faults.push({ kind: 'cancel', at, endAt: Date.now(), detail: `${id} ${JSON.stringify(res).slice(0, 200)}` });
      } catch (err) {
        this.o.faults.push({ kind: 'cancel', at, endAt: Date.now(), detail: `${id} refused: ${(err as Error).message}` });
      }
    }
  }

  /** The steady stream until `until` (epoch ms), at most rate × duration × 2 submits. */
  async stream(until: number): Promise<void> {
    const gap = 1000 / this.o.rate;
    const max = Math.ceil(((until - Date.now()) / 1000) * this.o.rate * 2) + 10;
    for (let i = 0; i < max && Date.now() < until; i++) {
      while (this.inFlight.size >= MAX_IN_FLIGHT && Date.now() < until) await sleep(20);
      this.track(this.submit(this.o.rng.weighted(WORKFLOW_MIX), this.o.rng));
      await sleep(gap * (0.5 + this.o.rng.next()));
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

  /** One tenant floods its concurrency key: `count` submits, 8 at a time. */
  async flood(count: number): Promise<void> {
    const queue = Array.from({ length: count }, () => () => this.submit('chaos_tenant', this.floodRng, FLOOD_TENANT));
    await Promise.all(
      Array.from({ length: 8 }, async () => {
        for (let job = queue.shift(); job; job = queue.shift()) await job();
      }),
    );
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
