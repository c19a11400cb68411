import { fileURLToPath } from 'node:url';
import pino, { type Logger } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { createThreadRunner, type ThreadRunner } from '../../src/worker/thread-runner.js';
import type { Worker } from '../../src/worker/worker.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { startTcpProxy, type TcpProxy } from '../helpers/tcp-proxy.js';
import { startWitness, type Witness } from '../helpers/witness.js';

/**
 * Aborts escalate (issue 9, item 5): once `ownership_unknown` has aborted an attempt, a later
 * timeout or lost lease still ends it — its slot is freed, the worker stops waiting for the
 * tool, and a tool thread is terminated after its grace. The worker runs in this process, its
 * database link through a TCP proxy that the test cuts (black-holes) past the lease. Tools
 * report to the witness, not to the database. Classes: lease 3 s, heartbeat 1 s, timeout 8 s.
 */
const workflowsDir = fileURLToPath(new URL('../fixtures/runtime-workflows/', import.meta.url));
const GRACE_MS = 1000;
const TIMEOUT_MS = 8000;
/** Scheduling slack on a loaded 2-core machine. */
const SLACK_MS = 3000;

function captureLogger(): { logger: Logger; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  return {
    logger: pino(
      { level: 'info' },
      {
        write: (l: string) => {
          lines.push(JSON.parse(l) as Record<string, unknown>);
        },
      },
    ),
    lines,
  };
}

async function until<T>(
  what: string,
  timeoutMs: number,
  probe: () => Promise<T | null | undefined | false> | T | null | undefined | false,
): Promise<T> {
  const end = performance.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v) return v;
    if (performance.now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

describe('aborts escalate past ownership_unknown', () => {
  let db: TestDatabase;
  let witness: Witness;
  let proxy: TcpProxy;
  let r: Ratchet | null = null;
  let w: Worker | null = null;
  let runner: ThreadRunner | null = null;
  beforeAll(async () => {
    db = await createTestDatabase('escalation');
    witness = await startWitness(db.url);
    process.env.WITNESS_URL = witness.url; // tools (and tool threads) of this process report here
  });
  afterEach(async () => {
    proxy.setMode('reset');
    proxy.setMode('pass');
    await w?.stop({ graceMs: 0 });
    await r?.close();
    await runner?.close();
    await proxy.close();
    w = null;
    r = null;
    runner = null;
  });
  afterAll(async () => {
    await witness.close();
    await db.drop();
  });

  async function start(classes: string[], logger: Logger, concurrency = 2): Promise<{ r: Ratchet; w: Worker; runner: ThreadRunner }> {
    proxy = await startTcpProxy({ target: { host: '127.0.0.1', port: Number(new URL(db.url).port) } });
    runner = createThreadRunner({ abandonGraceMs: GRACE_MS, logger });
    r = await createRatchet({
      databaseUrl: proxy.url(db.url),
      workflowsDir,
      logger,
      threadRunner: runner,
      queryTimeoutMs: 2000,
      poolSize: 4,
    });
    w = r.worker({ classes, pollIntervalMs: 100, concurrency });
    await w.start();
    return { r, w, runner };
  }
  const alive = (fence: string) => witness.observations.filter((o) => o.kind === 'deaf_alive' && o.fence === fence).length;

  it('a thread-class tool that ignores its signal, database cut past the lease: the slot is free within the timeout, the thread gone after the grace', async () => {
    const { logger, lines } = captureLogger();
    const { r, w, runner } = await start(['deaf_thread'], logger);
    const { id } = await r.submit('deaf-thread', {});
    const first = await witness.waitFor(
      () => witness.observations.find((o) => o.kind === 'deaf_alive' && o.tool === 'deaf_thread_tool'),
      30_000,
      'the tool running',
    );
    const called = performance.now(); // the call started a little earlier: the bounds below are generous by that much
    expect(first.threadId).toBeGreaterThan(0); // it runs in a tool thread
    expect(w.slotsInUse('deaf_thread')).toBe(1);
    proxy.setMode('blackhole');

    await until('ownership_unknown', 5000, () => lines.some((l) => l.event === 'ownership_unknown'));
    expect(w.slotsInUse('deaf_thread')).toBe(1); // ownership unknown only informs the tool: the slot is still taken
    await until('the slot freed', TIMEOUT_MS + SLACK_MS - (performance.now() - called), () => w.slotsInUse('deaf_thread') === 0);
    expect(lines.find((l) => l.event === 'attempt_escalated')).toMatchObject({ from: 'ownership_unknown', reason: 'timeout' });
    await until('the tool thread terminated', GRACE_MS + SLACK_MS, () => runner.stats().threads === 0);
    const n = alive(String(first.fence));
    await new Promise((res) => setTimeout(res, 600));
    expect(alive(String(first.fence))).toBe(n); // the tool has stopped: its thread is gone
    expect(lines.some((l) => l.event === 'tool_thread_terminated')).toBe(true);
    expect((await db.query('SELECT state FROM ratchet.stages WHERE run_id = $1', [id]))[0]!.state).toBe('running'); // never finished while cut
  }, 60_000);

  it('an inline tool that ignores its signal, database cut past the lease: the slot is free within the timeout', async () => {
    const { logger, lines } = captureLogger();
    const { r, w } = await start(['deaf_inline'], logger);
    await r.submit('deaf-inline', {});
    await witness.waitFor(
      () => witness.observations.find((o) => o.kind === 'deaf_alive' && o.tool === 'deaf_inline_tool'),
      30_000,
      'the tool running',
    );
    const called = performance.now();
    proxy.setMode('blackhole');
    await until('ownership_unknown', 5000, () => lines.some((l) => l.event === 'ownership_unknown'));
    expect(w.slotsInUse('deaf_inline')).toBe(1);
    await until('the slot freed', TIMEOUT_MS + SLACK_MS - (performance.now() - called), () => w.slotsInUse('deaf_inline') === 0);
    expect(lines.find((l) => l.event === 'attempt_escalated')).toMatchObject({ from: 'ownership_unknown', reason: 'timeout' });
  }, 60_000);

  it('a lost lease reported after ownership_unknown ends the attempt at once: its slot (the only one) takes the reclaim', async () => {
    const { logger, lines } = captureLogger();
    const { r, w } = await start(['hold'], logger, 1);
    const { id } = await r.submit('deaf-hold', {}); // timeout 60 s: only the lost lease can end attempt 1 soon
    await witness.waitFor(
      () => witness.observations.find((o) => o.kind === 'deaf_alive' && o.tool === 'deaf_hold_tool'),
      30_000,
      'the tool running',
    );
    proxy.setMode('blackhole');
    await until('ownership_unknown', 5000, () => lines.some((l) => l.event === 'ownership_unknown'));
    await new Promise((res) => setTimeout(res, 3500)); // past the 3 s lease
    expect(w.slotsInUse('hold')).toBe(1);
    proxy.setMode('reset');
    proxy.setMode('pass');
    // The keeper's next extend finds the lease lost: the attempt ends although its tool still runs.
    await until('the lease reported lost', 10_000, () => lines.some((l) => l.event === 'heartbeat_lost'));
    const run = await until('the run succeeded on attempt 2', 20_000, async () => {
      const got = await r.getRun(id);
      return got?.state === 'succeeded' ? got : null;
    });
    expect(run.result).toEqual({ attempt: 2 }); // claimed in the slot attempt 1 gave up, though its tool still runs
    expect(lines.some((l) => l.event === 'attempt_escalated' && l.reason === 'lease_lost')).toBe(true);
    expect(w.slotsInUse('hold')).toBe(0);
  }, 60_000);
});
