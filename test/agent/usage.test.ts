import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { startScriptedModel, type ScriptedModel } from '../../src/agent/scripted-model.js';
import { createServer, type ApiServer } from '../../src/api/server.js';
import { createClient } from '../../src/client/index.js';
import { defineAgent } from '../../src/definitions/agent.js';
import { defineTool, defineToolClass } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import { processMetrics } from '../../src/observability/metrics.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/** Model usage: the scripted model returns `usage`; the run's totals and the Prometheus counters add up. */
const TOKEN = 'usage-token-0123456789';
let db: TestDatabase;
let model: ScriptedModel;
let ratchet: Ratchet;
let server: ApiServer;

const llm = defineToolClass({ name: 'usage-llm', lease: '5s', heartbeat: '1s', jitter: '200ms', timeout: '4s', maxDuration: '30s' });
const io = defineToolClass({ name: 'usage-io', lease: '3s', heartbeat: '1s', jitter: '200ms', timeout: '5s', maxDuration: '30s' });
const lookup = defineTool({
  name: 'lookup',
  description: 'looks up',
  class: io,
  input: z.object({ q: z.string() }),
  output: z.object({ a: z.string() }),
  run: async (i) => ({ a: i.q }),
});

beforeAll(async () => {
  db = await createTestDatabase('usage');
  model = await startScriptedModel({
    // By the request, not by count: two runs ask at once. No tool answer yet: call the tool; else answer.
    script: (req) =>
      !req.messages.some((m) => m.role === 'tool')
        ? { toolCalls: [{ name: 'lookup', arguments: { q: 'x' } }], usage: { prompt_tokens: 100, completion_tokens: 20 } }
        : { content: 'done', usage: { prompt_tokens: 150, completion_tokens: 5 } },
  });
  const agent = defineAgent({
    name: 'usage_agent',
    input: z.object({ ask: z.string() }),
    model: { name: 'scripted-usage', class: llm, baseURL: model.baseURL },
    instructions: 'look it up',
    tools: [lookup],
    maxActions: 1,
  });
  // maxSteps 1 and a model that always calls a tool: its first answer fails the stage (max_steps_exceeded).
  const stuck = defineAgent({
    name: 'usage_stuck',
    input: z.object({ ask: z.string() }),
    model: { name: 'scripted-usage', class: llm, baseURL: model.baseURL },
    instructions: 'look it up',
    tools: [lookup],
    maxActions: 1,
    maxSteps: 1,
    budget: { maxTokens: 100 },
  });
  ratchet = await createRatchet({ databaseUrl: db.url, workflows: [agent, stuck], logger: silentLogger() });
  await ratchet.worker({ pollIntervalMs: 50 }).start();
  server = await createServer({ ratchet, tokens: [TOKEN], port: 0 });
});
afterAll(async () => {
  await server?.close();
  await ratchet?.close();
  await model?.close();
  await db?.drop();
});

const counter = async (direction: string) => {
  const m = await processMetrics().registry.getSingleMetric('ratchet_model_tokens_total')?.get();
  return (
    m?.values.filter((v) => v.labels.model === 'scripted-usage' && v.labels.direction === direction).reduce((s, v) => s + v.value, 0) ?? 0
  );
};

describe('model usage', () => {
  it('tokens in and out per model stage, summed per run in GET /v1/runs/:id, and counted by model and workflow', async () => {
    const client = createClient({ baseUrl: server.url, token: TOKEN });
    const runs = [];
    for (const ask of ['a', 'b']) runs.push((await client.submit('usage_agent', { ask })).id);
    for (const id of runs) {
      for await (const _e of client.watch(id)) {
        /* to the end */
      }
      const run = await client.get(id);
      expect(run.state).toBe('succeeded');
      expect(run.usage).toEqual({ inputTokens: 250, outputTokens: 25, modelCalls: 2 });
    }
    expect(await counter('input')).toBe(500);
    expect(await counter('output')).toBe(50);
    const text = await (await fetch(`${server.url}/v1/metrics`, { headers: { authorization: `Bearer ${TOKEN}` } })).text();
    expect(text).toMatch(/ratchet_model_tokens_total\{model="scripted-usage",workflow="usage_agent",direction="input"\} 500/);
    const [ev] = await db.query(
      `SELECT data FROM ratchet.events WHERE run_id = $1 AND type = 'stage_succeeded' AND data ? 'usage' ORDER BY id LIMIT 1`,
      [runs[0]],
    );
    expect(ev!.data.usage).toEqual({ inputTokens: 100, outputTokens: 20 });
  });

  it('a call whose stage then fails still counts: its usage rides on stage_failed, is in the run totals and in the budget', async () => {
    const client = createClient({ baseUrl: server.url, token: TOKEN });
    const { id } = await client.submit('usage_stuck', { ask: 'z' });
    for await (const _e of client.watch(id)) {
      /* to the end */
    }
    const run = await client.get(id);
    expect(run.state).toBe('failed');
    expect(run.error).toMatchObject({ code: 'max_steps_exceeded' });
    expect(run.usage).toEqual({ inputTokens: 100, outputTokens: 20, modelCalls: 1 });
    const [ev] = await db.query(`SELECT data FROM ratchet.events WHERE run_id = $1 AND type = 'stage_failed' AND data ? 'usage'`, [id]);
    expect(ev!.data.usage).toEqual({ inputTokens: 100, outputTokens: 20 });

    // The failed call's 120 tokens count against the budget (100): the retried run makes no further call.
    const calls = model.requests.length;
    await client.retry(id);
    for await (const _e of client.watch(id)) {
      /* to the end */
    }
    const again = await client.get(id);
    expect(again.state).toBe('failed');
    expect(again.error).toMatchObject({ code: 'budget_exceeded' });
    expect(again.usage).toEqual({ inputTokens: 100, outputTokens: 20, modelCalls: 1 });
    expect(model.requests.length).toBe(calls);
  });
});
