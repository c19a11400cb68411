import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { InvalidInputError } from '../../src/errors.js';
import { silentLogger } from '../../src/logger.js';
import { createBullmqTransport } from '../../src/transport/bullmq.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { REDIS_URL } from '../setup/services.js';

/**
 * Several versions of one workflow on one PostgreSQL database: submit starts the newest or the
 * one asked for; a worker claims only stages of definitions it has loaded and leaves the rest,
 * no attempt spent, to a worker that has them (explain says so); a wake-up reaches a worker of
 * the stage's own version.
 */
const cls = defineToolClass({ name: 'versioned', lease: '5s', heartbeat: '1s', jitter: '200ms', timeout: '10s', maxDuration: '30s' });
const input = z.object({ n: z.number() });
const out = z.object({ n: z.number(), version: z.number() });
const v1Tool = defineTool({
  name: 'compute',
  description: 'v1',
  class: cls,
  input,
  output: out,
  run: async (i) => ({ n: i.n, version: 1 }),
});
const v2Tool = defineTool({
  name: 'compute',
  description: 'v2: another output',
  class: cls,
  input,
  output: out.extend({ doubled: z.number() }),
  run: async (i) => ({ n: i.n, version: 2, doubled: i.n * 2 }),
});
const v1 = defineWorkflow({ name: 'calc', input, steps: [{ tool: v1Tool }] });
const v2 = defineWorkflow({ name: 'calc', version: 2, input, steps: [{ tool: v2Tool }] });

describe('workflow versions on PostgreSQL', () => {
  let db: TestDatabase;
  const open: Ratchet[] = [];
  const ratchet = async (workflows: (typeof v1)[], extra: Parameters<typeof createRatchet>[0] = {}) => {
    const r = await createRatchet({ databaseUrl: db.url, workflows, logger: silentLogger(), poolSize: 3, ...extra });
    open.push(r);
    return r;
  };
  const waitFor = async <T>(read: () => Promise<T>, done: (v: T) => boolean, what: string): Promise<T> => {
    let v = await read();
    for (let i = 0; i < 600 && !done(v); i++) {
      await new Promise((res) => setTimeout(res, 50));
      v = await read();
    }
    if (!done(v)) throw new Error(`timed out waiting for ${what}: ${JSON.stringify(v)}`);
    return v;
  };
  beforeAll(async () => {
    db = await createTestDatabase('versions');
  });
  afterAll(async () => {
    for (const r of open) await r.close();
    await db.drop();
  });

  it('submit starts the newest loaded version, or the one asked for; an unknown version is a typed error that writes nothing', async () => {
    const both = await ratchet([v1, v2]);
    expect(both.registry.get('calc')).toBe(v2);
    expect(both.registry.byHash(v1.hash)).toBe(v1);
    const a = await both.submit('calc', { n: 1 });
    const b = await both.submit('calc', { n: 1 }, { version: 1 });
    expect((await both.store.getRun(a.id))!.definitionHash).toBe(v2.hash);
    expect((await both.store.getRun(b.id))!.definitionHash).toBe(v1.hash);
    const [before] = await db.query(
      'SELECT (SELECT count(*) FROM ratchet.runs)::int AS runs, (SELECT count(*) FROM ratchet.stages)::int AS stages',
    );
    const err = await both.submit('calc', { n: 1 }, { version: 3 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(InvalidInputError);
    expect(err).toMatchObject({ code: 'invalid_input', path: 'version', details: { reason: 'unknown_version', loaded: [1, 2] } });
    await expect(both.submit('calc', { n: 1 }, { version: 0 })).rejects.toMatchObject({
      code: 'invalid_input',
      path: 'submit.options.version',
    });
    const [after] = await db.query(
      'SELECT (SELECT count(*) FROM ratchet.runs)::int AS runs, (SELECT count(*) FROM ratchet.stages)::int AS stages',
    );
    expect(after).toEqual(before);
    await both.cancel(a.id);
    await both.cancel(b.id);
  });

  it("one idempotency key with another version asked for is a conflict, not a replay of the other version's run", async () => {
    const both = await ratchet([v1, v2]);
    const first = await both.submit('calc', { n: 5 }, { version: 1, idempotencyKey: 'calc-5' });
    expect(await both.submit('calc', { n: 5 }, { version: 1, idempotencyKey: 'calc-5' })).toMatchObject({ id: first.id, created: false });
    await expect(both.submit('calc', { n: 5 }, { version: 2, idempotencyKey: 'calc-5' })).rejects.toMatchObject({
      details: { reason: 'idempotency_conflict' },
    });
    await both.cancel(first.id);
  });

  it("a worker without a run's version spends no attempt on it and explain says so with the hash; a worker with it runs it on that version", async () => {
    const submitter = await ratchet([v1, v2]);
    const { id } = await submitter.submit('calc', { n: 7 }, { version: 1 });
    const v2only = await ratchet([v2]);
    await v2only.worker({ pollIntervalMs: 20 }).start();
    const why = await waitFor(
      () => submitter.explain(id),
      (x) => x.verdict === 'queued_no_worker_for_version',
      'the verdict',
    );
    expect(why.evidence).toMatchObject({
      toolClass: 'versioned',
      workflow: 'calc',
      definitionHash: v1.hash,
      version: 1,
      workersWithDefinition: 0,
    });
    await new Promise((res) => setTimeout(res, 300)); // ~15 more polls of the v2 worker
    const [row] = await db.query(`SELECT state, attempt FROM ratchet.stages WHERE run_id = $1`, [id]);
    expect(row).toEqual({ state: 'queued', attempt: 0 });
    expect((await submitter.events(id)).map((e) => e.type)).toEqual(['run_submitted']);

    const v1only = await ratchet([v1]);
    await v1only.worker({ pollIntervalMs: 20 }).start();
    const run = await waitFor(
      () => submitter.getRun(id),
      (x) => x?.state === 'succeeded',
      'the run',
    );
    expect(run!.result).toEqual({ n: 7, version: 1 });
    expect(run!.stages.map((s) => s.attempt)).toEqual([1]);
    for (const r of [v2only, v1only]) await r.close();
  });

  it("a wake-up reaches a worker of the stage's version (one lane per class and definition), with polling all but off", async () => {
    const prefix = `ratchet-test-${randomBytes(4).toString('hex')}`;
    const transport = () => createBullmqTransport({ redisUrl: REDIS_URL, prefix, logger: silentLogger(), dueIn: async () => 0 });
    const submitter = await ratchet([v1, v2], { transport: transport() });
    const w1 = await ratchet([v1], { transport: transport() });
    const w2 = await ratchet([v2], { transport: transport() });
    // Polls every 60 s, five times slower while BullMQ is healthy: only a wake-up can start these runs within the test.
    await w1.worker({ pollIntervalMs: 60_000, sweepIntervalMs: 600_000 }).start();
    await w2.worker({ pollIntervalMs: 60_000, sweepIntervalMs: 600_000 }).start();
    await new Promise((res) => setTimeout(res, 500)); // both workers' first claims (of nothing) are done
    const ids: { id: string; version: number }[] = [];
    for (let n = 0; n < 10; n++) {
      const version = n % 2 === 0 ? 1 : 2;
      ids.push({ id: (await submitter.submit('calc', { n }, { version })).id, version });
    }
    for (const { id, version } of ids) {
      const run = await waitFor(
        () => submitter.getRun(id),
        (x) => x?.state === 'succeeded',
        `run ${id} (version ${version})`,
      );
      expect((run!.result as { version: number }).version).toBe(version);
    }
  });
});
