import { trace } from '@opentelemetry/api';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { startServices, type Services } from '../../examples/services.js';
import { startScriptedModel, type ScriptedModel } from '../../src/agent/scripted-model.js';
import { createServer, type ApiServer } from '../../src/api/server.js';
import { createClient } from '../../src/client/index.js';
import { defineAgent } from '../../src/definitions/agent.js';
import { defineTool, defineToolClass } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import { derivedRunSpanContext, parseTraceparent, runTraceId, traceparentOf } from '../../src/observability/tracing.js';
import reconcileInvoice from '../../workflows/reconcile-invoice.js';
import { SERVICES_URL_ENV } from '../../workflows/_lib/services-url.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * Spans of real runs on PostgreSQL, with the SDK's in-memory exporter registered (the library
 * itself depends on @opentelemetry/api only): the example workflow reconcile-invoice against the
 * example services, whose fenced receiver records the traceparent each request carried, and an
 * agent against the scripted model.
 */
const TOKEN = 'traces-token-0123456789';
const exporter = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
let db: TestDatabase;
let servicesDb: TestDatabase;
let services: Services;
let model: ScriptedModel;
let ratchet: Ratchet;
let server: ApiServer;

const llm = defineToolClass({ name: 'trace-llm', lease: '5s', heartbeat: '1s', jitter: '200ms', timeout: '4s', maxDuration: '30s' });
const io = defineToolClass({ name: 'trace-io', lease: '3s', heartbeat: '1s', jitter: '200ms', timeout: '5s', maxDuration: '30s' });
const lookup = defineTool({
  name: 'lookup',
  description: 'looks up',
  class: io,
  input: z.object({ q: z.string() }),
  output: z.object({ a: z.string() }),
  run: async (i) => ({ a: i.q }),
});

beforeAll(async () => {
  trace.setGlobalTracerProvider(provider);
  db = await createTestDatabase('traces');
  servicesDb = await createTestDatabase('traces_svc', { empty: true });
  services = await startServices({ databaseUrl: servicesDb.url });
  process.env[SERVICES_URL_ENV] = services.url;
  model = await startScriptedModel({
    script: (req) =>
      !req.messages.some((m) => m.role === 'tool')
        ? { toolCalls: [{ name: 'lookup', arguments: { q: 'x' } }], usage: { prompt_tokens: 10, completion_tokens: 2 } }
        : { content: 'done', usage: { prompt_tokens: 20, completion_tokens: 3 } },
  });
  const agent = defineAgent({
    name: 'traced_agent',
    input: z.object({ ask: z.string() }),
    model: { name: 'scripted-traces', class: llm, baseURL: model.baseURL, pricing: { inputPerMillion: 1, outputPerMillion: 1 } },
    instructions: 'look it up',
    tools: [lookup],
    maxActions: 1,
  });
  ratchet = await createRatchet({ databaseUrl: db.url, workflows: [reconcileInvoice, agent], logger: silentLogger() });
  await ratchet.worker({ pollIntervalMs: 50 }).start();
  server = await createServer({ ratchet, tokens: [TOKEN], port: 0 });
});
afterAll(async () => {
  await server?.close();
  await ratchet?.close();
  await model?.close();
  await services?.close();
  await servicesDb?.drop();
  await db?.drop();
  trace.disable();
  await provider.shutdown();
});

async function runToEnd(workflow: string, input: unknown) {
  const client = createClient({ baseUrl: server.url, token: TOKEN });
  const { id } = await client.submit(workflow, input);
  for await (const _e of client.watch(id)) {
    /* to the end */
  }
  return { id, run: await client.get(id) };
}

const spansOf = (runId: string) => exporter.getFinishedSpans().filter((s) => s.attributes['ratchet.run_id'] === runId);
const parentOf = (s: ReadableSpan) => s.parentSpanContext?.spanId;

describe('OpenTelemetry spans', () => {
  it('a workflow run: run → attempt per stage (fence, attempt, ids, class) → tool call; the receiver got the tool span as traceparent', async () => {
    const { id, run } = await runToEnd('reconcile-invoice', { invoiceId: 'inv-7' });
    expect(run.state).toBe('succeeded');
    const spans = spansOf(id);
    const runSpans = spans.filter((s) => s.name === 'ratchet.run');
    expect(runSpans).toHaveLength(1);
    const root = runSpans[0]!;
    expect(root.attributes['ratchet.workflow']).toBe('reconcile-invoice');
    // The run's traceparent is stored on the run, and GET /v1/runs/:id names its trace.
    const [row] = await db.query('SELECT traceparent FROM ratchet.runs WHERE id = $1', [id]);
    expect(row!.traceparent).toBe(traceparentOf(root.spanContext()));
    expect(run.traceId).toBe(root.spanContext().traceId);

    const attempts = spans.filter((s) => s.name === 'ratchet.attempt');
    expect(attempts.map((s) => s.attributes['ratchet.tool'])).toEqual(['fetch_statement', 'extract_fields', 'file_case']);
    for (const a of attempts) {
      const stage = run.stages.find((st) => st.id === a.attributes['ratchet.stage_id'])!;
      expect(a.spanContext().traceId).toBe(root.spanContext().traceId);
      expect(parentOf(a)).toBe(root.spanContext().spanId);
      expect(a.attributes).toMatchObject({
        'ratchet.fence': stage.fence,
        'ratchet.attempt': 1,
        'ratchet.stage_seq': stage.seq,
        'ratchet.workflow': 'reconcile-invoice',
        'ratchet.tool_class': stage.toolClass,
        'ratchet.outcome': 'succeeded',
      });
    }
    const tools = spans.filter((s) => s.name.startsWith('ratchet.tool '));
    expect(tools).toHaveLength(3);
    for (const t of tools) {
      const a = attempts.find((x) => x.attributes['ratchet.stage_id'] === t.attributes['ratchet.stage_id'])!;
      expect(parentOf(t)).toBe(a.spanContext().spanId);
      expect(t.attributes['ratchet.fence']).toBe(a.attributes['ratchet.fence']);
      expect(t.attributes['ratchet.tool_class']).toBe(a.attributes['ratchet.tool_class']);
    }
    // Downstream: the fenced receiver's request carried the file_case tool span's context.
    const fileCase = tools.find((t) => t.attributes['ratchet.tool'] === 'file_case')!;
    const effects = await services.effects();
    const post = effects.requests.filter((r) => r.path === '/cases' && r.key === run.stages[2]!.effectKey);
    expect(post.length).toBeGreaterThan(0);
    for (const r of post) expect(r.traceparent).toBe(traceparentOf(fileCase.spanContext()));
  });

  it('an agent run: model call spans (model, tokens, cost) and tool spans under their attempts', async () => {
    const { id, run } = await runToEnd('traced_agent', { ask: 'a' });
    expect(run.state).toBe('succeeded');
    const spans = spansOf(id);
    const root = spans.find((s) => s.name === 'ratchet.run')!;
    const attempts = spans.filter((s) => s.name === 'ratchet.attempt');
    expect(attempts.map((s) => s.attributes['ratchet.tool'])).toEqual(['$model', 'lookup', '$model']);
    for (const a of attempts) expect(parentOf(a)).toBe(root.spanContext().spanId);
    const models = spans.filter((s) => s.name === 'ratchet.model scripted-traces');
    expect(models).toHaveLength(2);
    expect(models.map((m) => [m.attributes['gen_ai.usage.input_tokens'], m.attributes['gen_ai.usage.output_tokens']])).toEqual([
      [10, 2],
      [20, 3],
    ]);
    expect(models[0]!.attributes['ratchet.cost']).toBeCloseTo(0.000012, 12);
    for (const m of models) {
      const a = attempts.find((x) => x.attributes['ratchet.stage_id'] === m.attributes['ratchet.stage_id'])!;
      expect(parentOf(m)).toBe(a.spanContext().spanId);
      expect(m.attributes['ratchet.fence']).toBe(a.attributes['ratchet.fence']);
    }
    expect(spans.filter((s) => s.name === 'ratchet.tool lookup')).toHaveLength(1);
  });
});

describe('the derived trace context (a run submitted where no tracer recorded its span)', () => {
  it('trace id = the run id hex, a fixed parent span id; a stored traceparent wins; malformed ones are ignored', () => {
    const runId = '0190a8b2-7c3d-7e4f-8a5b-6c7d8e9f0a1b';
    const d = derivedRunSpanContext(runId);
    expect(d.traceId).toBe('0190a8b27c3d7e4f8a5b6c7d8e9f0a1b');
    expect(d.spanId).toMatch(/^[0-9a-f]{16}$/);
    expect(derivedRunSpanContext(runId)).toEqual(d);
    expect(runTraceId(runId, null)).toBe(d.traceId);
    const stored = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
    expect(runTraceId(runId, stored)).toBe('4bf92f3577b34da6a3ce929d0e0e4736');
    expect(parseTraceparent('00-00000000000000000000000000000000-00f067aa0ba902b7-01')).toBeNull();
    expect(parseTraceparent('garbage')).toBeNull();
    expect(traceparentOf(parseTraceparent(stored)!)).toBe(stored);
  });
});
