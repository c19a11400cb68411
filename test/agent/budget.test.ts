import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { startScriptedModel, type ScriptedModel } from '../../src/agent/scripted-model.js';
import { createServer, type ApiServer } from '../../src/api/server.js';
import { formatRun } from '../../src/cli/api/format.js';
import { createClient } from '../../src/client/index.js';
import { defineAgent } from '../../src/definitions/agent.js';
import { defineTool, defineToolClass } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import { processMetrics } from '../../src/observability/metrics.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * Cost and budget on real PostgreSQL: every model call uses 100 tokens in and 20 out and always
 * proposes one more tool call, so only the budget ends the run. The price (2 in, 10 out per
 * million) makes each call cost 0.0004.
 */
const TOKEN = 'budget-token-0123456789';
let db: TestDatabase;
let model: ScriptedModel;
let ratchet: Ratchet;
let server: ApiServer;

const llm = defineToolClass({ name: 'budget-llm', lease: '5s', heartbeat: '1s', jitter: '200ms', timeout: '4s', maxDuration: '30s' });
const io = defineToolClass({ name: 'budget-io', lease: '3s', heartbeat: '1s', jitter: '200ms', timeout: '5s', maxDuration: '30s' });
const lookup = defineTool({
  name: 'lookup',
  description: 'looks up',
  class: io,
  input: z.object({ q: z.string() }),
  output: z.object({ a: z.string() }),
  run: async (i) => ({ a: i.q }),
});
const pricing = { inputPerMillion: 2, outputPerMillion: 10 };
const agent = (name: string, modelName: string, budget: { maxTokens?: number; maxCost?: number } | undefined) =>
  defineAgent({
    name,
    input: z.object({ ask: z.string() }),
    model: { name: modelName, class: llm, baseURL: model.baseURL, pricing },
    instructions: 'look it up, forever',
    tools: [lookup],
    maxActions: 1,
    maxSteps: 50,
    ...(budget ? { budget } : {}),
  });

beforeAll(async () => {
  db = await createTestDatabase('budget');
  model = await startScriptedModel({
    script: (req) =>
      req.model === 'priced-final'
        ? { content: 'done', usage: { prompt_tokens: 1000, completion_tokens: 100 } }
        : { toolCalls: [{ name: 'lookup', arguments: { q: 'x' } }], usage: { prompt_tokens: 100, completion_tokens: 20 } },
  });
  ratchet = await createRatchet({
    databaseUrl: db.url,
    workflows: [
      agent('by_tokens', 'priced-tokens', { maxTokens: 200 }),
      agent('by_cost', 'priced-cost', { maxCost: 0.001 }),
      agent('no_budget', 'priced-final', undefined),
    ],
    logger: silentLogger(),
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

const costCounter = async (modelName: string) => {
  const m = await processMetrics().registry.getSingleMetric('ratchet_model_cost_total')?.get();
  return m?.values.filter((v) => v.labels.model === modelName).reduce((s, v) => s + v.value, 0) ?? 0;
};
const requestsFor = (name: string) => model.requests.filter((r) => r.model === name).length;

async function runToEnd(workflow: string) {
  const client = createClient({ baseUrl: server.url, token: TOKEN });
  const { id } = await client.submit(workflow, { ask: 'a' });
  for await (const _e of client.watch(id)) {
    /* to the end */
  }
  return { id, run: await client.get(id) };
}

describe('model cost and budget', () => {
  it('a priced run: cost per model stage in its event, summed in GET /v1/runs/:id, ratchet status and the counter', async () => {
    const { id, run } = await runToEnd('no_budget');
    expect(run.state).toBe('succeeded');
    // 1000 × 2 / 1e6 + 100 × 10 / 1e6 = 0.003
    expect(run.usage).toEqual({ inputTokens: 1000, outputTokens: 100, modelCalls: 1, cost: 0.003 });
    const [ev] = await db.query(`SELECT data FROM ratchet.events WHERE run_id = $1 AND type = 'stage_succeeded' AND data ? 'usage'`, [id]);
    expect(ev!.data.usage).toEqual({ inputTokens: 1000, outputTokens: 100, cost: 0.003 });
    expect(formatRun(run)).toContain('model usage: 1000 tokens in, 100 out, 1 calls, cost 0.003');
    expect(await costCounter('priced-final')).toBeCloseTo(0.003, 9);
    const text = await (await fetch(`${server.url}/v1/metrics`, { headers: { authorization: `Bearer ${TOKEN}` } })).text();
    expect(text).toMatch(/ratchet_model_cost_total\{model="priced-final",workflow="no_budget"\} 0\.003/);
  });

  it('maxTokens: the run ends failed with budget_exceeded before the call after the one that reached it', async () => {
    const { id, run } = await runToEnd('by_tokens');
    expect(run.state).toBe('failed');
    expect(run.error).toMatchObject({ code: 'budget_exceeded' });
    // call 1: 120 tokens (< 200, so call 2); call 2: 240 (>= 200): no call 3.
    expect(requestsFor('priced-tokens')).toBe(2);
    expect(run.usage).toEqual({ inputTokens: 200, outputTokens: 40, modelCalls: 2, cost: 0.0008 });
    // The model stage that was refused failed for good, on its first attempt, with the reason and figures.
    const last = run.stages[run.stages.length - 1]!;
    expect(last.tool).toBe('$model');
    expect(last.state).toBe('failed');
    expect(last.attempt).toBe(1);
    const [failedEv] = await db.query(
      `SELECT data FROM ratchet.events WHERE run_id = $1 AND type = 'stage_failed' ORDER BY id DESC LIMIT 1`,
      [id],
    );
    expect(failedEv!.data.error).toMatchObject({ code: 'budget_exceeded', details: { reason: 'max_tokens', limit: 200, spent: 240 } });
    const explained = await createClient({ baseUrl: server.url, token: TOKEN }).explain(id);
    expect(JSON.stringify(explained)).toContain('budget_exceeded');
  });

  it('maxCost: the run stops once its priced calls reached the cost', async () => {
    const { run } = await runToEnd('by_cost');
    expect(run.state).toBe('failed');
    expect(run.error).toMatchObject({ code: 'budget_exceeded' });
    // 0.0004 per call: 0.0004, 0.0008 (< 0.001), 0.0012 (>= 0.001): three calls, no fourth.
    expect(requestsFor('priced-cost')).toBe(3);
    expect(run.usage?.cost).toBeCloseTo(0.0012, 9);
  });
});
