import { trace } from '@opentelemetry/api';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import type { Ratchet } from '../../src/engine.js';
import { derivedRunSpanContext, parseTraceparent, traceModelCall, traceToolCall, traceparentOf } from '../../src/observability/tracing.js';
import type { ClaimedStage } from '../../src/store/lease.js';
import { TERMINAL_RUN_STATES } from '../../src/planner/states.js';

/**
 * Without an OpenTelemetry SDK (no provider registered in this file's process) the worker makes no
 * spans at all, but each tool still gets the run's trace context as ctx.traceparent (the derived
 * one: trace id = the run id), so the services it calls join the run's trace — what the API's
 * no-op spans handed on before the worker skipped them.
 */
const cls = defineToolClass({ name: 'untraced', lease: '5s', heartbeat: '1s', timeout: '5s', maxDuration: '30s' });
const seen = defineTool({
  name: 'seen',
  description: 'returns the traceparent it was given',
  class: cls,
  input: z.object({}).passthrough(),
  output: z.object({ traceparent: z.string().nullable() }),
  run: async (_input, ctx) => ({ traceparent: ctx.traceparent ?? null }),
});
const twice = defineWorkflow({
  name: 'untraced-twice',
  input: z.object({}),
  steps: [
    { tool: seen, name: 'first' },
    { tool: seen, name: 'second' },
  ],
});

/**
 * One SDK provider for every test of this file that registers one: tracing.ts's tracer binds to
 * the first provider ever registered in the process (the API's proxy tracer keeps its delegate),
 * so a second provider would never see its spans.
 */
const exporter = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });

async function untilSucceeded(r: Ratchet, id: string) {
  const end = Date.now() + 30_000;
  let run = await r.store.getRun(id);
  while (run && !TERMINAL_RUN_STATES.includes(run.state) && Date.now() < end) {
    await new Promise((res) => setTimeout(res, 20));
    run = await r.store.getRun(id);
  }
  expect(run?.state).toBe('succeeded');
  return run!;
}

/** A run submitted with the SDK registered (its traceparent stored, as engine.ts does), the SDK then gone. */
async function submitTraced(r: Ratchet, workflow: string): Promise<{ id: string; stored: string }> {
  expect(trace.setGlobalTracerProvider(provider)).toBe(true);
  try {
    const { id } = await r.submit(workflow, {});
    const stored = (await r.store.getRun(id))!.traceparent;
    expect(stored, 'the run span was recorded at submit').toMatch(/^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/);
    expect(parseTraceparent(stored)!.traceId).not.toBe(derivedRunSpanContext(id).traceId); // not the derived trace
    return { id, stored: stored! };
  } finally {
    trace.disable();
  }
}

describe('tracing without an SDK', () => {
  it('each tool call gets the run’s derived traceparent; stages of several runs each get their own', async () => {
    expect(trace.getTracerProvider().getTracer('x').startSpan('probe').isRecording()).toBe(false); // no SDK here
    const r = await createRatchet({ dataDir: ':memory:', workflows: [twice], logger: silentLogger() });
    try {
      await r.worker({ pollIntervalMs: 20 }).start();
      const ids = await Promise.all([r.submit('untraced-twice', {}), r.submit('untraced-twice', {})]);
      for (const { id } of ids) {
        const run = await untilSucceeded(r, id);
        const want = traceparentOf(derivedRunSpanContext(id));
        expect(run!.stages.map((s) => (s.result as { traceparent: string | null }).traceparent)).toEqual([want, want]);
      }
    } finally {
      await r.close();
    }
  });

  it('an SDK registered after the worker started: the next stages get attempt and tool spans, with fence and attempt', async () => {
    const r = await createRatchet({ dataDir: ':memory:', workflows: [twice], logger: silentLogger() });
    exporter.reset();
    try {
      await r.worker({ pollIntervalMs: 20 }).start();
      trace.setGlobalTracerProvider(provider);
      const { id } = await r.submit('untraced-twice', {});
      const run = await untilSucceeded(r, id);
      const spans = exporter
        .getFinishedSpans()
        .filter((s) => s.attributes['ratchet.run_id'] === id || s.attributes['ratchet.stage_id'] !== undefined);
      const attemptSpans = spans.filter((s) => s.name === 'ratchet.attempt');
      expect(attemptSpans).toHaveLength(2);
      for (const [i, stage] of run!.stages.entries()) {
        const a = attemptSpans.find((s) => s.attributes['ratchet.stage_id'] === stage.id)!;
        expect(a.attributes).toMatchObject({ 'ratchet.fence': stage.fence, 'ratchet.attempt': 1 });
        // The tool's span is the attempt span's child, and the tool got the tool span's own context as traceparent.
        const tool = exporter.getFinishedSpans().find((s) => s.parentSpanContext?.spanId === a.spanContext().spanId);
        expect(tool, `tool span of stage ${i + 1}`).toBeDefined();
        expect((stage.result as { traceparent: string }).traceparent).toContain(tool!.spanContext().spanId);
      }
    } finally {
      trace.disable();
      await r.close();
    }
  });

  it('a run with a stored traceparent: its tools get that run context, not the derived one; each run its own, a restamped run its new one', async () => {
    // A run whose first stage stores a traceparent on its run row (its second stage is claimed after):
    // the worker's per-run cache must notice the stored value changed, not keep the derived context.
    let r!: Ratchet;
    const restampTo = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
    const restamp = defineTool({
      name: 'restamp',
      description: 'stores a traceparent on its own run, returns the traceparent it was given',
      class: cls,
      input: z.object({}).passthrough(),
      output: z.object({ traceparent: z.string().nullable() }),
      run: async (_input, ctx) => {
        await r.store.db.query('UPDATE ratchet.runs SET traceparent = $1 WHERE id = $2', [restampTo, ctx.runId]);
        return { traceparent: ctx.traceparent ?? null };
      },
    });
    const restamped = defineWorkflow({
      name: 'untraced-restamped',
      input: z.object({}),
      steps: [
        { tool: restamp, name: 'first' },
        { tool: seen, name: 'second' },
      ],
    });
    r = await createRatchet({ dataDir: ':memory:', workflows: [twice, restamped], logger: silentLogger() });
    try {
      const a = await submitTraced(r, 'untraced-twice');
      const b = await submitTraced(r, 'untraced-twice');
      expect(b.stored).not.toBe(a.stored);
      // No stored traceparent (yet). Nulled here: once an SDK was registered in this process, tracing.ts's tracer
      // keeps recording through it even after trace.disable(), so a submit would still store one.
      const c = await r.submit('untraced-restamped', {});
      await r.store.db.query('UPDATE ratchet.runs SET traceparent = NULL WHERE id = $1', [c.id]);
      expect((await r.store.getRun(c.id))!.traceparent).toBeNull();
      expect(trace.getTracerProvider().getTracer('x').startSpan('probe').isRecording()).toBe(false); // the worker runs without an SDK
      await r.worker({ pollIntervalMs: 20 }).start();
      const traceparents = async (id: string) =>
        (await untilSucceeded(r, id)).stages.map((s) => (s.result as { traceparent: string | null }).traceparent);
      // Without an SDK the tool's ctx.traceparent is the run's span context itself (no span of its own): the stored value.
      expect(await traceparents(a.id)).toEqual([a.stored, a.stored]);
      expect(await traceparents(b.id)).toEqual([b.stored, b.stored]);
      expect(await traceparents(c.id)).toEqual([traceparentOf(derivedRunSpanContext(c.id)), restampTo]);
    } finally {
      await r.close();
    }
  });

  it('an SDK registered during an attempt begun without one: spans made later in that attempt are children of the run span', async () => {
    // The tool registers the SDK, then opens a model span and a tool span for its own stage (keyed by stage and fence,
    // as the executor does): no attempt span exists, so their parent is the run's stored span context.
    const registers = defineTool({
      name: 'registers',
      description: 'registers the SDK mid-attempt, then makes spans in its attempt',
      class: cls,
      input: z.object({}).passthrough(),
      output: z.object({ inner: z.string().nullable() }),
      run: async (_input, ctx) => {
        trace.setGlobalTracerProvider(provider);
        const stage = {
          id: ctx.stageId,
          fence: ctx.fence,
          runId: ctx.runId,
          attempt: ctx.attempt,
          workflow: 'untraced-registers',
          toolClass: cls.name,
        } as ClaimedStage;
        await traceModelCall({ name: 'probe-model', stream: false, pricing: null }, stage, async () => ({}));
        const inner = await traceToolCall({ tool: { name: 'inner', class: cls }, ctx }, 'run', async (c) => c.traceparent ?? null);
        return { inner };
      },
    });
    const wf = defineWorkflow({ name: 'untraced-registers', input: z.object({}), steps: [{ tool: registers, name: 'only' }] });
    const r = await createRatchet({ dataDir: ':memory:', workflows: [wf], logger: silentLogger() });
    exporter.reset();
    try {
      const { id, stored } = await submitTraced(r, 'untraced-registers');
      const runSc = parseTraceparent(stored)!;
      await r.worker({ pollIntervalMs: 20 }).start(); // no SDK: the attempt starts without a span
      const run = await untilSucceeded(r, id);
      const stageId = run.stages[0]!.id;
      const spans = exporter.getFinishedSpans().filter((s) => s.attributes['ratchet.stage_id'] === stageId);
      expect(spans.map((s) => s.name).sort()).toEqual(['ratchet.model probe-model', 'ratchet.tool inner']); // no attempt span
      for (const s of spans) {
        expect(s.spanContext().traceId, s.name).toBe(runSc.traceId);
        expect(s.parentSpanContext?.spanId, s.name).toBe(runSc.spanId);
        expect(s.attributes['ratchet.fence']).toBe(run.stages[0]!.fence);
      }
      // The inner tool call got its own span's context as traceparent.
      const inner = spans.find((s) => s.name === 'ratchet.tool inner')!;
      expect((run.stages[0]!.result as { inner: string }).inner).toBe(traceparentOf(inner.spanContext()));
    } finally {
      trace.disable();
      await r.close();
    }
  });
});
