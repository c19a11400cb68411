import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { startPrivateRedis, type PrivateRedis } from './redis-server.js';

describe('private redis-server', () => {
  let redis: PrivateRedis | undefined;
  const clients: Redis[] = [];

  afterAll(async () => {
    for (const c of clients) c.disconnect();
    await redis?.close();
  });

  /** A client that fails at once instead of queueing or reconnecting forever. */
  function client(url: string): Redis {
    const c = new Redis(url, {
      maxRetriesPerRequest: 0,
      enableOfflineQueue: false,
      retryStrategy: () => null,
      connectTimeout: 1_000,
      lazyConnect: true,
    });
    c.on('error', () => {});
    clients.push(c);
    return c;
  }

  it('starts, flushes, stops, restarts on the same port, closes', async () => {
    redis = await startPrivateRedis();
    expect(redis.port).toBeGreaterThan(0);
    expect(redis.url).toBe(`redis://127.0.0.1:${redis.port}`);
    expect(redis.port).not.toBe(6379);

    const a = client(redis.url);
    await a.connect();
    await a.set('k', 'v');
    expect(await a.get('k')).toBe('v');
    await redis.flushAll();
    expect(await a.get('k')).toBeNull();

    await a.set('k', 'v');
    await redis.stop();
    expect(redis.running()).toBe(false);
    await expect(a.get('k')).rejects.toThrow();
    const refused = client(redis.url);
    await expect(refused.connect()).rejects.toThrow(/ECONNREFUSED|closed/i);

    await redis.start();
    expect(redis.running()).toBe(true);
    const b = client(redis.url);
    await b.connect();
    expect(await b.get('k')).toBeNull(); // no persistence across restarts
    await b.set('k2', 'v2');
    expect(await b.get('k2')).toBe('v2');

    // A crash (SIGKILL) and a second restart, same port.
    await redis.stop('SIGKILL');
    await redis.start();
    const c = client(redis.url);
    await c.connect();
    expect(await c.ping()).toBe('PONG');

    for (const x of clients) x.disconnect();
    await redis.close();
    expect(redis.running()).toBe(false);
    await redis.close(); // idempotent
  });
});
