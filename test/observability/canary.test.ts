import { randomBytes } from 'node:crypto';
import { Writable } from 'node:stream';
import { Redis } from 'ioredis';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { startScriptedModel, type ScriptedModel } from '../../src/agent/scripted-model.js';
import { createServer, type ApiServer } from '../../src/api/server.js';
import { createClient } from '../../src/client/index.js';
import { defineAgent } from '../../src/definitions/agent.js';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { REDIS_URL } from '../setup/services.js';

/**
 * A canary secret placed in a tool input, a tool result and a model answer appears nowhere in
 * the logs (at the default level, info), the events table, Redis, the live stream or the
 * dashboard's HTML: they carry ids, hashes and sizes, never payloads. (The runs' and stages'
 * own input / result columns hold it: that is the durable state the API returns.)
 */
const SECRET = `canary-${randomBytes(12).toString('hex')}`;
const TOKEN = 'canary-token-0123456789';

const io = defineToolClass({ name: 'canary-io', lease: '3s', heartbeat: '1s', jitter: '200ms', timeout: '5s', maxDuration: '30s' });
const llm = defineToolClass({ name: 'canary-llm', lease: '5s', heartbeat: '1s', jitter: '200ms', timeout: '4s', maxDuration: '30s' });
const keep = defineTool({
  name: 'keep_secret',
  description: 'returns what it was given',
  class: io,
  input: z.object({ secret: z.string() }),
  output: z.object({ kept: z.string() }),
  run: async (i) => ({ kept: `result:${i.secret}` }),
});
const after = defineTool({
  name: 'after_secret',
  description: 'reads the previous result',
  class: io,
  input: z.object({ kept: z.string() }),
  output: z.object({ again: z.string() }),
  run: async (i) => ({ again: i.kept }),
});
const staticFlow = defineWorkflow({
  name: 'canary_static',
  input: z.object({ secret: z.string() }),
  steps: [{ tool: keep }, { tool: after, input: ({ results }) => results.keep_secret as { kept: string } }],
});

let db: TestDatabase;
let model: ScriptedModel;
let ratchet: Ratchet;
let server: ApiServer;
let logs = '';
let served = 0;

beforeAll(async () => {
  db = await createTestDatabase('canary');
  model = await startScriptedModel({
    script: () =>
      served++ % 2 === 0 ? { toolCalls: [{ name: 'keep_secret', arguments: { secret: SECRET } }] } : { content: `the answer is ${SECRET}` },
  });
  const agentFlow = defineAgent({
    name: 'canary_agent',
    input: z.object({ ask: z.string() }),
    model: { name: 'scripted', class: llm, baseURL: model.baseURL },
    instructions: 'keep the secret',
    tools: [keep],
    maxActions: 2,
  });
  // The same agent with a streaming model: the pieces of its answer go to the run's SSE stream (by
  // design, README "Token streaming"), never to the logs, the events table or Redis.
  const streamFlow = defineAgent({
    name: 'canary_stream_agent',
    input: z.object({ ask: z.string() }),
    model: { name: 'scripted-stream', class: llm, baseURL: model.baseURL, stream: true },
    instructions: 'keep the secret',
    tools: [keep],
    maxActions: 2,
  });
  const sink = new Writable({
    write(chunk, _enc, done) {
      logs += chunk.toString();
      done();
    },
  });
  ratchet = await createRatchet({
    databaseUrl: db.url,
    redisUrl: REDIS_URL,
    workflows: [staticFlow, agentFlow, streamFlow],
    logger: pino({ level: 'info' }, sink),
  });
  await ratchet.worker({ pollIntervalMs: 50 }).start();
  server = await createServer({ ratchet, tokens: [TOKEN], port: 0 });
});
afterAll(async () => {
  await server?.close();
  await ratchet?.close();
  await model?.close();
  await db?.drop();
});

/** Every value in Redis, as text (strings, hashes, lists, sets, sorted sets, streams). */
async function redisText(): Promise<string> {
  const redis = new Redis(REDIS_URL);
  try {
    let out = '';
    let cursor = '0';
    do {
      const [next, keys] = await redis.scan(cursor, 'COUNT', 1000);
      cursor = next;
      for (const key of keys) {
        const type = await redis.type(key);
        out += key;
        if (type === 'string') out += await redis.get(key);
        else if (type === 'hash') out += JSON.stringify(await redis.hgetall(key));
        else if (type === 'list') out += JSON.stringify(await redis.lrange(key, 0, -1));
        else if (type === 'set') out += JSON.stringify(await redis.smembers(key));
        else if (type === 'zset') out += JSON.stringify(await redis.zrange(key, 0, -1));
        else if (type === 'stream') out += JSON.stringify(await redis.xrange(key, '-', '+'));
      }
    } while (cursor !== '0');
    return out;
  } finally {
    redis.disconnect();
  }
}

describe('canary secret', () => {
  it('is nowhere in the logs, events, Redis, the stream or the dashboard', async () => {
    const client = createClient({ baseUrl: server.url, token: TOKEN });
    const a = await client.submit('canary_static', { secret: SECRET });
    const b = await client.submit('canary_agent', { ask: 'keep it' });
    let streamed = '';
    for (const id of [a.id, b.id]) {
      const res = await fetch(`${server.url}/v1/runs/${id}/stream`, { headers: { authorization: `Bearer ${TOKEN}` } });
      streamed += await res.text(); // the whole stream, to the run's terminal event
    }
    const runA = await client.get(a.id);
    const runB = await client.get(b.id);
    expect(runA).toMatchObject({ state: 'succeeded', result: { again: `result:${SECRET}` } });
    expect(runB.state).toBe('succeeded');
    expect(JSON.stringify(runB.result)).toContain(SECRET); // the model's answer is the run's result
    expect(model.requests.some((r) => JSON.stringify(r.messages).includes(`result:${SECRET}`))).toBe(true); // the tool result reached the model
    expect(streamed).toContain('run_succeeded');

    const cookie = `ratchet_token=${TOKEN}`;
    let dashboard = '';
    for (const path of ['/', `/runs/${a.id}`, `/runs/${b.id}`, `/runs/${a.id}/panel`, `/runs/${b.id}/panel`]) {
      const res = await fetch(`${server.url}${path}`, { headers: { cookie, accept: 'text/html' } });
      expect(res.status).toBe(200);
      dashboard += await res.text();
    }
    expect(dashboard).toContain(a.id);

    const events = (await db.query<{ t: string }>(`SELECT coalesce(string_agg(e::text, E'\\n'), '') AS t FROM ratchet.events e`))[0]!.t;
    expect(events).toContain('run_succeeded');
    const redis = await redisText();
    expect(logs).toContain('job_claimed'); // the logs were captured at the default level
    expect(logs).toMatch(/"resultHash":"[0-9a-f]{16}","resultBytes":\d+/); // a result is logged as its hash and size
    // The secret did flow through the run (the search would find it): the stages hold it as their input and result.
    expect((await db.query<{ t: string }>(`SELECT string_agg(s::text, '') AS t FROM ratchet.stages s`))[0]!.t).toContain(SECRET);

    const where = { logs, events, redis, streamed, dashboard };
    const found = Object.entries(where)
      .filter(([, text]) => text.includes(SECRET))
      .map(([name, text]) => {
        const i = text.indexOf(SECRET);
        return `${name}: …${text.slice(Math.max(0, i - 200), i + 60)}…`;
      });
    expect(found).toEqual([]);
  }, 60_000);
});

describe('the canary with a streaming model (stream: true)', () => {
  it('its answer streams to the SSE stream only: nowhere in the logs, the events table or Redis', async () => {
    const client = createClient({ baseUrl: server.url, token: TOKEN });
    const served0 = served;
    const { id } = await client.submit('canary_stream_agent', { ask: 'keep it' });
    // Watching while it runs: the pieces are published to this stream as the model answers.
    const res = await fetch(`${server.url}/v1/runs/${id}/stream`, { headers: { authorization: `Bearer ${TOKEN}` } });
    const streamed = await res.text(); // to the run's terminal event
    expect(streamed).toContain('run_succeeded');
    const run = await client.get(id);
    expect(run.state).toBe('succeeded');
    expect(served - served0).toBeGreaterThanOrEqual(2); // the tool call, then the streamed answer
    expect(JSON.stringify(run.result)).toContain(SECRET); // the streamed answer is the run's result (durable state)
    // (The stream is allowed to carry the pieces: documented. Not asserted either way.)
    const events = (await db.query<{ t: string }>(`SELECT coalesce(string_agg(e::text, E'\\n'), '') AS t FROM ratchet.events e`))[0]!.t;
    expect(events).toContain('run_succeeded');
    const redis = await redisText();
    expect(logs).toContain('job_claimed');
    const where = { logs, events, redis };
    const found = Object.entries(where)
      .filter(([, text]) => text.includes(SECRET))
      .map(([name, text]) => {
        const i = text.indexOf(SECRET);
        return `${name}: …${text.slice(Math.max(0, i - 200), i + 60)}…`;
      });
    expect(found).toEqual([]);
  }, 60_000);
});

describe('logPayload', () => {
  it('logs a hash and a size by default, the payload only with RATCHET_LOG_PAYLOADS=1', async () => {
    const { logPayload } = await import('../../src/observability/log-payload.js');
    const before = process.env.RATCHET_LOG_PAYLOADS;
    try {
      delete process.env.RATCHET_LOG_PAYLOADS;
      expect(logPayload('result', { a: SECRET })).toEqual({
        resultHash: expect.stringMatching(/^[0-9a-f]{16}$/),
        resultBytes: JSON.stringify({ a: SECRET }).length,
      });
      process.env.RATCHET_LOG_PAYLOADS = '1';
      expect(logPayload('result', { a: 1 })).toMatchObject({ result: { a: 1 } });
    } finally {
      if (before === undefined) delete process.env.RATCHET_LOG_PAYLOADS;
      else process.env.RATCHET_LOG_PAYLOADS = before;
    }
  });
});
