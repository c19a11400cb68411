import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { startTcpProxy } from '../helpers/tcp-proxy.js';
import { type FaultHarness, openFaultHarness, reportAndKill, waitRun } from './helpers.js';

/**
 * A database blip between stages never fails a run: a real worker process reaches PostgreSQL
 * through the TCP proxy, and the proxy resets every connection (and refuses new ones) for 2 s
 * at the moment step 2 of 4 has sent its effect — before the worker reads the results the
 * next step's input needs and before it finishes step 2.
 */
describe('a database cut between stages', () => {
  let harness: FaultHarness;
  beforeAll(async () => {
    harness = await openFaultHarness('db_cut');
  });
  afterEach(reportAndKill(() => harness.workers));
  afterAll(async () => {
    await harness.close();
  });

  it('PostgreSQL cut for 2 s exactly between two stages of a 4-step workflow: the run succeeds, each effect once', async () => {
    const { db, witness, r, workers } = harness;
    const proxy = await startTcpProxy({ target: { host: '127.0.0.1', port: Number(new URL(db.url).port) } });
    let cuts = 0;
    let restored = false;
    const gate: Server = createServer((_req, res) => {
      if (cuts++ === 0) {
        proxy.setMode('reset');
        setTimeout(() => {
          proxy.setMode('pass');
          restored = true;
        }, 2000);
      }
      res.end('cut');
    });
    await new Promise<void>((ok) => gate.listen(0, '127.0.0.1', ok));
    try {
      await workers.spawn('w1', { DATABASE_URL: proxy.url(db.url), GATE_URL: `http://127.0.0.1:${(gate.address() as AddressInfo).port}/` });
      const { id } = await r.submit('four_between', {});
      const done = await waitRun(r, id, (run) => ['succeeded', 'failed', 'cancelled', 'expired'].includes(run.state), 60_000, 'run ended');
      expect(cuts).toBe(1);
      expect(restored).toBe(true);
      expect(done.error).toBeNull();
      expect(done.state).toBe('succeeded');
      expect(done.stages.map((s) => [s.state, s.attempt])).toEqual([1, 2, 3, 4].map(() => ['succeeded', 1]));

      const applied = await witness.appliedPerKey();
      for (let seq = 1; seq <= 4; seq++) {
        const key = `${id}:${seq}:between_step`;
        expect(applied.get(key), `effect of step ${seq}`).toBe(1);
        expect(
          witness.requests.filter((q) => q.key === key),
          `requests of step ${seq}`,
        ).toHaveLength(1);
      }
      expect(witness.staleAccepted()).toEqual([]);
      // Each step's input names the fence of the step before it: computed from persisted results.
      const inputs = await db.query<{ seq: number; input: { after: string | null } }>(
        'SELECT seq, input FROM ratchet.stages WHERE run_id = $1 ORDER BY seq',
        [id],
      );
      expect(inputs.map((s) => s.input.after)).toEqual([null, ...done.stages.slice(0, 3).map((s) => s.fence)]);
      expect((await r.events(id)).map((e) => e.type)).not.toContain('result_rejected');
    } finally {
      await proxy.close();
      await new Promise<void>((ok) => gate.close(() => ok()));
    }
  });
});
