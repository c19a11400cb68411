import { randomBytes } from 'node:crypto';
import { Queue } from 'bullmq';
import { afterAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../src/logger.js';
import { createBullmqTransport } from '../../src/transport/bullmq.js';
import { REDIS_URL } from '../setup/services.js';
import { startPrivateRedis } from '../helpers/redis-server.js';
import { transportConformance } from './conformance.js';

const prefix = () => `ratchet-test-${randomBytes(4).toString('hex')}`;
const redis = new URL(REDIS_URL);
const queueFor = (p: string, cls: string) =>
  new Queue(`class-${cls}`, { prefix: p, connection: { host: redis.hostname, port: Number(redis.port) } });

transportConformance('bullmq', async () =>
  createBullmqTransport({ redisUrl: REDIS_URL, prefix: prefix(), logger: silentLogger(), dueIn: async () => 0 }),
);

describe('BullMQ specifics', () => {
  const queues: Queue[] = [];
  afterAll(async () => {
    for (const q of queues) {
      await q.obliterate({ force: true }).catch(() => {});
      await q.close();
    }
  });

  it('one queue per class, job id <stage>-<attempt>, ids only in the data, repeats collapse', async () => {
    const p = prefix();
    const t = createBullmqTransport({ redisUrl: REDIS_URL, prefix: p, logger: silentLogger(), dueIn: async () => 0 });
    const q = queueFor(p, 'io');
    queues.push(q);
    try {
      t.notify('io', { stageId: '42', attempt: 3 });
      t.notify('io', { stageId: '42', attempt: 3 });
      t.notify('io', { stageId: '42', attempt: 3 });
      for (let i = 0; i < 100 && (await q.getJobCountByTypes('wait', 'prioritized')) < 1; i++) await new Promise((r) => setTimeout(r, 20));
      const job = await q.getJob('42-3');
      expect(job?.id).toBe('42-3');
      expect(job?.data).toEqual({ stageId: '42', attempt: 3 });
      expect(await q.getJobCountByTypes('wait', 'prioritized', 'delayed')).toBe(1);
    } finally {
      await t.close();
    }
  });

  it('acknowledges a job once the claim was tried and removes it; a delayed job that fires early is delayed again', async () => {
    const p = prefix();
    let dueChecks = 0;
    // The database says the stage is due only from the second look on (its clock is ahead of Redis's timer).
    const t = createBullmqTransport({
      redisUrl: REDIS_URL,
      prefix: p,
      logger: silentLogger(),
      dueIn: async () => (dueChecks++ === 0 ? 400 : 0),
    });
    const q = queueFor(p, 'io');
    queues.push(q);
    try {
      const woken: number[] = [];
      let release!: () => void;
      const claimTried = new Promise<void>((r) => {
        release = r;
      });
      await t.subscribe('io', async () => {
        woken.push(Date.now());
        await claimTried;
      });
      await new Promise((r) => setTimeout(r, 200));
      const sent = Date.now();
      t.notify('io', { stageId: '7', attempt: 1 }, 50); // a retry's delay, shorter than the database says
      for (let i = 0; i < 300 && woken.length === 0; i++) await new Promise((r) => setTimeout(r, 10));
      expect(woken).toHaveLength(1);
      expect(woken[0]! - sent).toBeGreaterThanOrEqual(350); // re-delayed by what the database said
      expect(dueChecks).toBe(2);
      expect(await (await q.getJob('7-1'))?.getState()).toBe('active'); // held until the claim was tried
      release();
      for (let i = 0; i < 100 && (await q.getJob('7-1')); i++) await new Promise((r) => setTimeout(r, 20));
      expect(await q.getJob('7-1')).toBeUndefined(); // finished jobs are removed
    } finally {
      await t.close();
    }
  });

  it('with concurrency n, up to n wake-ups wait for their claim at once; each is acknowledged when its onWake resolves', async () => {
    const p = prefix();
    const t = createBullmqTransport({ redisUrl: REDIS_URL, prefix: p, logger: silentLogger(), dueIn: async () => 0 });
    const q = queueFor(p, 'io');
    queues.push(q);
    try {
      const waiting: (() => void)[] = [];
      const got: string[] = [];
      await t.subscribe(
        'io',
        (r) =>
          new Promise<void>((res) => {
            got.push(r!.stageId);
            waiting.push(res);
          }),
        { concurrency: 3 },
      );
      await new Promise((r) => setTimeout(r, 200));
      for (let i = 0; i < 5; i++) t.notify('io', { stageId: `c${i}`, attempt: 1 });
      for (let i = 0; i < 200 && waiting.length < 3; i++) await new Promise((r) => setTimeout(r, 20));
      await new Promise((r) => setTimeout(r, 200));
      expect(waiting).toHaveLength(3); // three held, none acknowledged yet, the other two wait in Redis
      for (const res of waiting.splice(0)) res();
      for (let i = 0; i < 200 && got.length < 5; i++) {
        for (const res of waiting.splice(0)) res();
        await new Promise((r) => setTimeout(r, 20));
      }
      for (const res of waiting.splice(0)) res();
      expect(got.sort()).toEqual(['c0', 'c1', 'c2', 'c3', 'c4']);
      for (let i = 0; i < 100 && (await q.getJobCountByTypes('wait', 'active')) > 0; i++) await new Promise((r) => setTimeout(r, 20));
      expect(await q.getJobCountByTypes('wait', 'active', 'completed')).toBe(0);
    } finally {
      await t.close();
    }
  });

  it('while Redis is away, notify does not throw or hang and the transport reports itself unhealthy', async () => {
    const priv = await startPrivateRedis();
    const t = createBullmqTransport({ redisUrl: priv.url, prefix: prefix(), logger: silentLogger(), dueIn: async () => 0 });
    try {
      await t.subscribe('io', async () => {});
      await priv.stop();
      const t0 = Date.now();
      for (let i = 0; i < 20; i++) t.notify('io', { stageId: String(i), attempt: 1 });
      expect(Date.now() - t0).toBeLessThan(100);
      for (let i = 0; i < 100 && t.healthy(); i++) await new Promise((r) => setTimeout(r, 50));
      expect(t.healthy()).toBe(false);
    } finally {
      await t.close();
      await priv.close();
    }
  });
});
