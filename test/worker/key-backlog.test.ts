import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * One key's backlog never delays another key's stages (DESIGN.md "Operations"): a worker on
 * PostgreSQL with tenant A's 2,000 queued stages at limit 2 still runs tenant B's 20, and
 * neither tenant ever runs more than its limit at once.
 */
const HOLD_MS = 50;
const cls = defineToolClass({ name: 'tenant_work', lease: '5s', heartbeat: '1s', jitter: '200ms', timeout: '20s', maxDuration: '60s' });
const live = new Map<string, number>();
const peak = new Map<string, number>();
const step = defineTool({
  name: 'tenant_step',
  description: 'holds its slot a little',
  class: cls,
  input: z.object({ tenant: z.string(), n: z.number() }),
  output: z.object({ n: z.number() }),
  run: async (i) => {
    live.set(i.tenant, (live.get(i.tenant) ?? 0) + 1);
    peak.set(i.tenant, Math.max(peak.get(i.tenant) ?? 0, live.get(i.tenant)!));
    await new Promise((r) => setTimeout(r, HOLD_MS));
    live.set(i.tenant, live.get(i.tenant)! - 1);
    return { n: i.n };
  },
});
const job = defineWorkflow({
  name: 'tenant_job',
  input: z.object({ tenant: z.string(), n: z.number() }),
  concurrencyKey: { key: (i) => i.tenant, limit: 2 },
  steps: [{ tool: step }],
});

describe('per-key concurrency under a backlog', () => {
  let db: TestDatabase;
  let r: Ratchet;
  beforeAll(async () => {
    db = await createTestDatabase('key_backlog');
    r = await createRatchet({ databaseUrl: db.url, workflows: [job], logger: silentLogger(), poolSize: 6 });
  });
  afterAll(async () => {
    await r.close();
    await db.drop();
  });

  it("tenant B's 20 stages all finish while tenant A (limit 2) still has more than 1,500 of its 2,000 waiting", async () => {
    for (let i = 0; i < 2000; i += 50)
      await Promise.all(Array.from({ length: 50 }, (_, j) => r.submit('tenant_job', { tenant: 'a', n: i + j })));
    for (let i = 0; i < 20; i++) await r.submit('tenant_job', { tenant: 'b', n: i });
    await r.worker({ concurrency: 8, pollIntervalMs: 50 }).start();

    const counts = async () => {
      const [c] = await db.query<{ b_done: number; a_waiting: number }>(`SELECT
        count(*) FILTER (WHERE concurrency_key = 'b' AND state = 'succeeded')::int AS b_done,
        count(*) FILTER (WHERE concurrency_key = 'a' AND state = 'queued')::int AS a_waiting
        FROM ratchet.stages`);
      return c!;
    };
    let c = await counts();
    // Bounded: ends when B is done, or when A's backlog has shrunk past the point the test is about.
    for (let i = 0; i < 1200 && c.b_done < 20 && c.a_waiting > 1500; i++) {
      await new Promise((res) => setTimeout(res, 50));
      c = await counts();
    }
    expect(c.b_done).toBe(20);
    expect(c.a_waiting).toBeGreaterThan(1500);
    expect(peak.get('a')).toBe(2);
    expect(peak.get('b')).toBe(2);
  });
});
