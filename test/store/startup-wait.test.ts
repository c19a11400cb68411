import { afterAll, beforeAll, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { defineSchedule } from '../../src/schedules/index.js';
import { createRatchet } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import pino, { type Logger } from 'pino';
import { openStore } from '../../src/store/index.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { startTcpProxy, type TcpProxy } from '../helpers/tcp-proxy.js';

/**
 * A process started while PostgreSQL does not answer (restarting, a link down) waits for it and
 * starts, instead of dying before it is ready on "Connection terminated unexpectedly" (seen in a
 * 30-minute soak: a worker started during a PostgreSQL fault). Every connection through the proxy is
 * reset until it passes again.
 */
const cls = defineToolClass({ name: 'startup-wait', lease: '3s', heartbeat: '1s', jitter: '200ms', timeout: '2s', maxDuration: '10s' });
const echo = defineTool({
  name: 'startup_wait_echo',
  description: 'echo',
  class: cls,
  input: z.object({ n: z.number() }),
  output: z.object({ n: z.number() }),
  run: async (i) => i,
});
const wf = defineWorkflow({ name: 'startup_wait_wf', input: z.object({ n: z.number() }), steps: [{ tool: echo }] });
let db: TestDatabase;
let proxy: TcpProxy;

beforeAll(async () => {
  db = await createTestDatabase('startup_wait', { empty: true });
  const u = new URL(db.url);
  proxy = await startTcpProxy({ target: { host: u.hostname, port: Number(u.port || 5432) }, mode: 'reset' });
});
afterAll(async () => {
  await proxy?.close();
  await db?.drop();
});

function warnings(): { logger: Logger; seen: Array<Record<string, unknown>> } {
  const seen: Array<Record<string, unknown>> = [];
  const logger = pino({ level: 'warn' }, { write: (line: string) => void seen.push(JSON.parse(line) as Record<string, unknown>) });
  return { logger, seen };
}

it('opening waits through reset connections, then migrates once the database answers', async () => {
  proxy.setMode('reset');
  const { logger, seen } = warnings();
  const started = Date.now();
  const opening = openStore({ databaseUrl: proxy.url(db.url), poolSize: 2, connectionTimeoutMs: 2000, startupWaitMs: 20_000, logger });
  await new Promise((r) => setTimeout(r, 1500));
  expect(proxy.stats().accepted).toBeGreaterThan(1); // it tried more than once while the link was down
  proxy.setMode('pass');
  const store = await opening;
  try {
    expect(Date.now() - started).toBeGreaterThanOrEqual(1500);
    const [row] = await store.db.query(
      `SELECT count(*)::int AS n FROM information_schema.tables WHERE table_schema = 'ratchet' AND table_name = 'stages'`,
    );
    expect(row!.n).toBe(1);
    expect(seen.length).toBeGreaterThan(0);
    expect(seen[0]).toMatchObject({ event: 'database_unavailable_at_start', step: 'migrations' });
  } finally {
    await store.close();
  }
});

it('createRatchet with schedules starts once the database is back (migrations and the schedules sync wait)', async () => {
  proxy.setMode('reset');
  const { logger, seen } = warnings();
  const opening = createRatchet({
    databaseUrl: proxy.url(db.url),
    workflows: [wf],
    schedules: [defineSchedule({ name: 'startup-wait-hourly', cron: '0 * * * *', workflow: wf, input: { n: 1 } })],
    logger,
    connectionTimeoutMs: 2000,
    startupWaitMs: 20_000,
  });
  await new Promise((r) => setTimeout(r, 800));
  proxy.setMode('pass');
  const ratchet = await opening;
  try {
    expect((await ratchet.schedules.list()).map((s) => s.name)).toEqual(['startup-wait-hourly']);
    expect(seen.some((w) => w.event === 'database_unavailable_at_start')).toBe(true);
  } finally {
    await ratchet.close();
  }
});

it('startupWaitMs 0 tries once: a typed database_unavailable error, at once', async () => {
  proxy.setMode('reset');
  const started = Date.now();
  const err = await openStore({ databaseUrl: proxy.url(db.url), poolSize: 1, startupWaitMs: 0, logger: silentLogger() }).catch(
    (e: unknown) => e,
  );
  expect(err).toMatchObject({ code: 'database_unavailable' });
  expect(Date.now() - started).toBeLessThan(5000);
});

it('a wait that runs out ends in database_unavailable; an error that is not about the link is not retried', async () => {
  proxy.setMode('reset');
  const err = await openStore({ databaseUrl: proxy.url(db.url), poolSize: 1, startupWaitMs: 700, logger: silentLogger() }).catch(
    (e: unknown) => e,
  );
  expect(err).toMatchObject({ code: 'database_unavailable' });

  proxy.setMode('pass');
  const missing = new URL(proxy.url(db.url));
  missing.pathname = '/ratchet_no_such_database_here';
  const accepted = proxy.stats().accepted;
  const other = await openStore({ databaseUrl: missing.toString(), poolSize: 1, startupWaitMs: 20_000, logger: silentLogger() }).catch(
    (e: unknown) => e,
  );
  // database does not exist: database_unavailable (the CLI's exit 4) naming it, at the first try
  expect(other).toMatchObject({ code: 'database_unavailable' });
  expect((other as Error).message).toContain('ratchet_no_such_database_here');
  expect(proxy.stats().accepted - accepted).toBe(1);
});
