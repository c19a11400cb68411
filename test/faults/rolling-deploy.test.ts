import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import { type FaultHarness, openFaultHarness, reportAndKill, waitRun } from './helpers.js';

const VERSIONS = fileURLToPath(new URL('../fixtures/version-workflows', import.meta.url));

/**
 * A rolling deploy on one PostgreSQL database and one Redis: worker processes of version 1
 * (workflows/v1) and of version 2 (workflows/v2, a step added) run side by side while runs of
 * both versions are submitted, then the version 1 workers drain and stop (SIGTERM, graceful).
 * Every run succeeds on the version it started with: its stages are claimed only by workers
 * that loaded its definition (the claim events' owners) and the tool code that ran was its
 * version's (the witness's observations), with no attempt spent on a worker that lacked it.
 */
describe('rolling deploy: version 1 and version 2 workers on one database', () => {
  let h: FaultHarness;
  let r: Ratchet;
  beforeAll(async () => {
    h = await openFaultHarness('rolling', { redis: true });
    r = await createRatchet({ databaseUrl: h.db.url, redisUrl: h.redis!.url, workflowsDir: VERSIONS, logger: silentLogger(), poolSize: 3 });
  });
  afterEach(reportAndKill(() => h.workers));
  afterAll(async () => {
    await r?.close();
    await h.close();
  });

  it('every run succeeds on its own version while v1 workers drain and stop mid-stream', async () => {
    expect(r.registry.get('roll')!.version).toBe(2); // the submitter has both; the newest is the default
    const v1Env = { WORKFLOWS_DIR: `${VERSIONS}/v1` };
    const v2Env = { WORKFLOWS_DIR: `${VERSIONS}/v2` };
    const runs: { id: string; version: 1 | 2 }[] = [];
    const submit = async (count: number, versions: (1 | 2)[]) => {
      for (let i = 0; i < count; i++) {
        const version = versions[i % versions.length]!;
        const { id } = await r.submit('roll', { n: runs.length }, version === 1 ? { version: 1 } : {});
        runs.push({ id, version });
      }
    };

    const [v1a, v1b] = await Promise.all([h.workers.spawn('v1a', v1Env), h.workers.spawn('v1b', v1Env)]);
    await submit(10, [1]);
    const [v2a, v2b] = await Promise.all([h.workers.spawn('v2a', v2Env), h.workers.spawn('v2b', v2Env)]);
    await submit(20, [1, 2]);
    // Mid-stream: the first v1 worker drains and stops while both versions have stages in flight.
    await h.witness.waitFor(() => h.witness.observations.filter((o) => o.version === 2).length >= 3, 30_000, 'v2 stages running');
    v1a!.proc.kill('SIGTERM');
    await submit(10, [1, 2]);
    expect(await v1a!.exit).toEqual({ code: 0, signal: null });
    // The second v1 worker drains what is left of version 1, then stops too.
    for (const run of runs.filter((x) => x.version === 1))
      await waitRun(r, run.id, (x) => x.state === 'succeeded', 120_000, `v1 run ${run.id}`);
    v1b!.proc.kill('SIGTERM');
    expect(await v1b!.exit).toEqual({ code: 0, signal: null });
    await submit(10, [2]);
    for (const run of runs) await waitRun(r, run.id, (x) => x.state !== 'queued' && x.state !== 'running', 120_000, `run ${run.id}`);

    const owners = { 1: new Set([v1a!.owner, v1b!.owner]), 2: new Set([v2a!.owner, v2b!.owner]) };
    const pids = { 1: new Set([v1a!.proc.pid, v1b!.proc.pid]), 2: new Set([v2a!.proc.pid, v2b!.proc.pid]) };
    const steps = { 1: ['roll_prepare', 'roll_finish'], 2: ['roll_prepare', 'roll_check', 'roll_finish'] };
    for (const { id, version } of runs) {
      const run = (await r.getRun(id))!;
      expect(run.state, `run ${id} of version ${version}: ${JSON.stringify(run.error)}`).toBe('succeeded');
      expect((run.result as { version: number }).version).toBe(version);
      expect(run.stages.map((s) => [s.name, s.state, s.attempt])).toEqual(steps[version].map((name) => [name, 'succeeded', 1]));
      const claims = (await r.events(id)).filter((e) => e.type === 'job_claimed' || e.type === 'lease_reclaimed');
      expect(claims).toHaveLength(steps[version].length);
      for (const c of claims) {
        expect(owners[version].has((c.data as { owner: string }).owner), `stage ${c.stageId} claimed by ${JSON.stringify(c.data)}`).toBe(
          true,
        );
      }
      const ran = h.witness.observations.filter((o) => o.kind === 'ran' && o.runId === id);
      expect(ran.map((o) => o.tool)).toEqual(steps[version]);
      for (const o of ran) {
        expect(o.version).toBe(version);
        expect(pids[version].has(o.pid as number)).toBe(true);
      }
    }
    const [bad] = await h.db.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM ratchet.events WHERE type IN ('stage_failed', 'run_failed', 'attempts_exhausted')`,
    );
    expect(bad!.n).toBe(0);
    // Both versions really overlapped: v1 stages ran after the first v2 stage had started.
    const firstV2 = h.witness.observations.findIndex((o) => o.version === 2);
    expect(h.witness.observations.slice(firstV2).some((o) => o.version === 1)).toBe(true);
  });
});
