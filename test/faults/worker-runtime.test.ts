import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import { spawnTs, type Child } from '../helpers/child.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { startTcpProxy, type TcpProxy } from '../helpers/tcp-proxy.js';
import { startWitness, type Witness } from '../helpers/witness.js';

/**
 * `ratchet worker` as a real process (issue 9, items 5 and 12), its database link through a
 * TCP proxy the test cuts: its Prometheus metrics (`--metrics-port`) show a stopped heartbeat
 * ageing, and a thread-class tool that ignores its signal loses its slot at the timeout and its
 * thread after the grace, while the database is still cut.
 */
const WORKFLOWS = fileURLToPath(new URL('../fixtures/runtime-workflows', import.meta.url));
/** deaf_thread's timeout, and the thread runner's default grace (DEFAULT_ABANDON_GRACE_MS). */
const TIMEOUT_MS = 8000;
const GRACE_MS = 10_000;
const SLACK_MS = 3000;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Samples of one metric from Prometheus text, with their labels. */
function samples(text: string, name: string): { labels: Record<string, string>; value: number }[] {
  const out: { labels: Record<string, string>; value: number }[] = [];
  for (const line of text.split('\n')) {
    const m = /^([a-z_]+)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    const labels: Record<string, string> = {};
    for (const [, k, v] of (m[2] ?? '').matchAll(/(\w+)="([^"]*)"/g)) labels[k!] = v!;
    out.push({ labels, value: Number(m[3]) });
  }
  return out;
}

describe('ratchet worker process: metrics and escalation while its database is cut', () => {
  let db: TestDatabase;
  let witness: Witness;
  let r: Ratchet;
  let proxy: TcpProxy;
  let worker: Child | null = null;
  beforeAll(async () => {
    db = await createTestDatabase('worker_runtime');
    witness = await startWitness(db.url);
    r = await createRatchet({ databaseUrl: db.url, workflowsDir: WORKFLOWS, logger: silentLogger(), poolSize: 3 });
  });
  afterEach(async (ctx) => {
    if (ctx.task.result?.state === 'fail' && worker) console.error(worker.stderr().slice(-20_000));
    if (worker && worker.proc.exitCode === null && worker.proc.signalCode === null) worker.proc.kill('SIGKILL');
    await worker?.exit;
    worker = null;
    await proxy.close();
  });
  afterAll(async () => {
    await r.close();
    await witness.close();
    await db.drop();
  });

  async function spawnWorker(classes: string): Promise<{ scrape(): Promise<string> }> {
    proxy = await startTcpProxy({ target: { host: '127.0.0.1', port: Number(new URL(db.url).port) } });
    worker = spawnTs('bin/ratchet.mjs', ['worker', '--json', '--classes', classes, '--workflows-dir', WORKFLOWS, '--metrics-port', '0'], {
      DATABASE_URL: proxy.url(db.url),
      WITNESS_URL: witness.url,
      RATCHET_LOG_LEVEL: 'info',
      REDIS_URL: '',
    });
    const ready = await worker.line((o) => o.ready === true, 60_000);
    expect(ready.metrics).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/metrics$/);
    return {
      async scrape() {
        const res = await fetch(String(ready.metrics));
        expect(res.status).toBe(200);
        expect(res.headers.get('content-type')).toMatch(/^text\/plain/);
        return res.text();
      },
    };
  }

  it('--metrics-port serves Prometheus text; a stopped heartbeat shows: its age grows at every scrape, failures carry a reason', async () => {
    const { scrape } = await spawnWorker('hold');
    const { id } = await r.submit('deaf-hold', {}); // keeps working through ownership_unknown: only its heartbeat stops
    await witness.waitFor(
      () => witness.observations.find((o) => o.kind === 'deaf_alive' && o.tool === 'deaf_hold_tool'),
      30_000,
      'the tool running',
    );
    await sleep(1500);
    const healthy = await scrape();
    const labels = { tool_class: 'hold', workflow: 'deaf-hold' };
    const age = (text: string) => samples(text, 'ratchet_heartbeat_age_seconds').find((s) => s.labels.tool_class === 'hold')!;
    const left = (text: string) => samples(text, 'ratchet_lease_remaining_seconds').find((s) => s.labels.tool_class === 'hold')!;
    expect(age(healthy).labels).toMatchObject(labels);
    expect(age(healthy).value).toBeLessThan(2.5); // heartbeat every 1 s (± 200 ms jitter), the extend's round trip, a late timer
    expect(left(healthy).value).toBeGreaterThan(0.5);
    expect(samples(healthy, 'ratchet_worker_slots_in_use').find((s) => s.labels.tool_class === 'hold')?.value).toBe(1);
    expect(healthy).not.toContain(id); // labels are bounded: never run ids

    proxy.setMode('blackhole');
    await sleep(3000);
    const cut1 = await scrape();
    await sleep(1500);
    const cut2 = await scrape();
    expect(age(cut1).value).toBeGreaterThan(2.5);
    expect(age(cut2).value - age(cut1).value).toBeGreaterThan(1); // computed at scrape time: it keeps growing
    expect(left(cut2).value).toBe(0);
    const failures = samples(cut2, 'ratchet_lease_extension_failures_total');
    expect(failures.find((s) => s.labels.reason === 'timeout')?.value ?? 0).toBeGreaterThanOrEqual(1);
    expect(samples(cut2, 'ratchet_ownership_unknown_total').find((s) => s.labels.tool_class === 'hold')?.value).toBe(1);
  }, 90_000);

  it('a thread-class tool ignoring its signal, database cut past the lease: slot free within timeout, thread gone within timeout + grace', async () => {
    const { scrape } = await spawnWorker('deaf_thread');
    await r.submit('deaf-thread', {});
    const first = await witness.waitFor(
      () => witness.observations.find((o) => o.kind === 'deaf_alive' && o.tool === 'deaf_thread_tool'),
      30_000,
      'the tool running',
    );
    const called = performance.now();
    const slots = async () =>
      samples(await scrape(), 'ratchet_worker_slots_in_use').find((s) => s.labels.tool_class === 'deaf_thread')?.value;
    const busyThreads = async () => samples(await scrape(), 'ratchet_tool_threads').find((s) => s.labels.state === 'busy')?.value;
    expect(await slots()).toBe(1);
    expect(await busyThreads()).toBe(1);
    proxy.setMode('blackhole');

    const poll = async (what: string, bound: number, probe: () => Promise<boolean>) => {
      while (!(await probe())) {
        if (performance.now() - called > bound) throw new Error(`${what} not within ${bound} ms`);
        await sleep(100);
      }
      return performance.now() - called;
    };
    const logged = (event: string) =>
      worker!
        .stderr()
        .split('\n')
        .some((l) => l.includes(`"event":"${event}"`));
    await poll('ownership_unknown', TIMEOUT_MS + SLACK_MS, async () => logged('ownership_unknown'));
    expect(await slots()).toBe(1); // ownership unknown alone frees nothing
    await poll('the slot freed', TIMEOUT_MS + SLACK_MS, async () => (await slots()) === 0);
    await poll('the thread terminated', TIMEOUT_MS + GRACE_MS + SLACK_MS, async () => (await busyThreads()) === 0);
    const alive = () => witness.observations.filter((o) => o.kind === 'deaf_alive' && o.fence === first.fence).length;
    const n = alive();
    await sleep(800);
    expect(alive()).toBe(n); // the tool stopped with its thread
    const events = worker!
      .stderr()
      .split('\n')
      .flatMap((l) => {
        try {
          return [JSON.parse(l) as { event?: string }];
        } catch {
          return [];
        }
      })
      .map((o) => o.event);
    expect(events.indexOf('ownership_unknown')).toBeGreaterThanOrEqual(0);
    expect(events.indexOf('ownership_unknown')).toBeLessThan(events.indexOf('attempt_escalated')); // unknown first, then the timeout
    expect(events).toContain('tool_thread_terminated');
  }, 90_000);
});
