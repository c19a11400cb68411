import { fileURLToPath } from 'node:url';
import pino, { type Logger } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import { createMetrics } from '../../src/observability/metrics.js';
import type { ExtendResult } from '../../src/store/index.js';
import { Attempt } from '../../src/worker/attempt.js';
import { EventWriter } from '../../src/worker/event-writer.js';
import { LeaseKeeper, type LeaseExtender } from '../../src/worker/lease-keeper.js';
import { Worker } from '../../src/worker/worker.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { startTcpProxy } from '../helpers/tcp-proxy.js';
import { startWitness, type Witness } from '../helpers/witness.js';

/**
 * The lease keeper on real PostgreSQL (issue 9, item 8): a tick never waits on one hung
 * statement — it has a time limit shorter than the least lease time left, and the next tick
 * runs on a fresh connection — and a finish that races an extend is not a lost lease.
 */
const workflowsDir = fileURLToPath(new URL('../fixtures/runtime-workflows/', import.meta.url));

function captureLogger(): { logger: Logger; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  return {
    logger: pino(
      { level: 'debug' },
      {
        write: (l: string) => {
          lines.push(JSON.parse(l) as Record<string, unknown>);
        },
      },
    ),
    lines,
  };
}
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('lease keeper on PostgreSQL', () => {
  let db: TestDatabase;
  let witness: Witness;
  let direct: Ratchet;
  beforeAll(async () => {
    db = await createTestDatabase('keeper');
    witness = await startWitness(db.url);
    process.env.WITNESS_URL = witness.url;
    direct = await createRatchet({ databaseUrl: db.url, workflowsDir, logger: silentLogger(), poolSize: 3 });
  });
  afterAll(async () => {
    await direct.close();
    await witness.close();
    await db.drop();
  });

  it('a tick against a hung connection gives up at its time limit; the next tick, on a fresh connection, extends every lease', async () => {
    const proxy = await startTcpProxy({ target: { host: '127.0.0.1', port: Number(new URL(db.url).port) } });
    const metrics = createMetrics();
    const { logger, lines } = captureLogger();
    // The pool's own answer limit stays at its 10 s default: far past the 3 s lease.
    const viaProxy = await createRatchet({ databaseUrl: proxy.url(db.url), workflowsDir, logger, poolSize: 4 });
    const w = new Worker(
      { store: viaProxy.store, registry: viaProxy.registry, transport: viaProxy.transport, logger, metrics },
      { classes: ['hold'], pollIntervalMs: 100 },
    );
    try {
      await w.start();
      const ids: string[] = [];
      for (let i = 0; i < 3; i++) ids.push((await direct.submit('hold', { i })).id);
      await witness.waitFor(() => witness.observations.filter((o) => o.kind === 'hold_started').length === 3, 30_000, 'three leases held');
      await sleep(1500); // a heartbeat or two on the keeper's connection
      const cutAt = await direct.store.clock.now();
      proxy.setMode('blackhole'); // every connection open now hangs for good...
      proxy.setMode('pass'); // ...while new ones work
      await sleep(4500); // past the 3 s lease: only extensions made after the cut keep it

      const rows = await db.query<{ heartbeat_at: Date; lease_until: Date; now: Date; state: string; attempt: number }>(
        'SELECT s.heartbeat_at, s.lease_until, ratchet.db_now() AS now, s.state, s.attempt FROM ratchet.stages s WHERE s.run_id = ANY($1::uuid[])',
        [ids],
      );
      expect(rows).toHaveLength(3);
      for (const row of rows) {
        expect(row.state).toBe('running');
        expect(row.attempt).toBe(1);
        expect(row.heartbeat_at.getTime()).toBeGreaterThan(cutAt.getTime() + 1000);
        expect(row.lease_until.getTime()).toBeGreaterThan(row.now.getTime());
      }
      expect(witness.observations.filter((o) => o.kind === 'hold_aborted')).toEqual([]); // no tool was told to stop
      expect(lines.filter((l) => l.event === 'ownership_unknown' || l.event === 'heartbeat_lost')).toEqual([]);
      const failures = (await metrics.extensionFailures.get()).values;
      expect(failures.find((v) => v.labels.reason === 'timeout')?.value ?? 0).toBeGreaterThanOrEqual(1);

      for (const id of ids) await direct.cancel(id);
      await witness.waitFor(
        () => witness.observations.filter((o) => o.kind === 'hold_aborted' && o.reason === 'cancelled').length === 3,
        15_000,
        'tools cancelled',
      );
    } finally {
      proxy.setMode('reset');
      proxy.setMode('pass');
      await w.stop({ graceMs: 0 });
      await viaProxy.close();
      await proxy.close();
    }
  }, 60_000);

  it('a finish that races an extend is neither counted nor logged nor recorded as a lost lease', async () => {
    const store = direct.store;
    const metrics = createMetrics();
    const { logger, lines } = captureLogger();
    const { id: runId } = await store.createRun({
      workflow: 'w',
      definitionHash: 'h',
      input: {},
      stages: [{ name: 's', tool: 't', toolClass: 'race', leaseMs: 3000, timeoutMs: 60_000, maxDurationMs: 120_000, maxAttempts: 3 }],
    });
    const [stage] = await store.claim({ owner: 'me', toolClass: 'race', limit: 1 });
    // The keeper's one dependency, held at a gate: its statement is sent (the attempt is in the
    // tick) but reaches the database only after the attempt's own finish has committed.
    let entered!: () => void;
    const inTick = new Promise<void>((r) => {
      entered = r;
    });
    let open!: () => void;
    const gate = new Promise<void>((r) => {
      open = r;
    });
    const answers: ExtendResult[][] = [];
    const gated: LeaseExtender = {
      async extend(...args: Parameters<LeaseExtender['extend']>) {
        entered();
        await gate;
        const out = await store.extend(...args);
        answers.push(out);
        return out;
      },
    };
    const attempt = new Attempt(stage!, 100, new EventWriter(store, logger), logger);
    const keeper = new LeaseKeeper(gated, 'me', logger, () => {}, metrics);
    keeper.add(attempt);
    keeper.start();
    try {
      await inTick;
      attempt.finishing = true;
      const [verdict] = await store.finish('me', [
        { stageId: stage!.id, fence: stage!.fence, outcome: 'succeeded', result: {}, run: { state: 'succeeded', result: {} } },
      ]);
      expect(verdict!.accepted).toBe(true);
      open();
      for (let i = 0; i < 100 && answers.length === 0; i++) await sleep(20);
      await sleep(50);
    } finally {
      await keeper.stop();
      attempt.end();
    }
    expect(answers[0]!.map((a) => a.verdict)).toEqual(['finished']);
    expect(attempt.abortReason).toBeNull();
    expect((await metrics.leasesExpired.get()).values.reduce((n, v) => n + v.value, 0)).toBe(0);
    expect(lines.filter((l) => l.event === 'heartbeat_lost')).toEqual([]);
    expect((await store.listEvents(runId)).map((e) => e.type)).not.toContain('heartbeat_lost');
  }, 30_000);
});
