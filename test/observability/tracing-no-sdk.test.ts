import { trace } from '@opentelemetry/api';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import { derivedRunSpanContext, traceparentOf } from '../../src/observability/tracing.js';

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

describe('tracing without an SDK', () => {
  it('each tool call gets the run’s derived traceparent; stages of several runs each get their own', async () => {
    expect(trace.getTracerProvider().getTracer('x').startSpan('probe').isRecording()).toBe(false); // no SDK here
    const r = await createRatchet({ dataDir: ':memory:', workflows: [twice], logger: silentLogger() });
    try {
      await r.worker({ pollIntervalMs: 20 }).start();
      const ids = await Promise.all([r.submit('untraced-twice', {}), r.submit('untraced-twice', {})]);
      for (const { id } of ids) {
        const end = Date.now() + 30_000;
        let run = await r.store.getRun(id);
        while (run?.state !== 'succeeded' && Date.now() < end) {
          await new Promise((res) => setTimeout(res, 20));
          run = await r.store.getRun(id);
        }
        expect(run?.state).toBe('succeeded');
        const want = traceparentOf(derivedRunSpanContext(id));
        expect(run!.stages.map((s) => (s.result as { traceparent: string | null }).traceparent)).toEqual([want, want]);
      }
    } finally {
      await r.close();
    }
  });

  it('an SDK registered after the worker started: the next stages get attempt and tool spans, with fence and attempt', async () => {
    const r = await createRatchet({ dataDir: ':memory:', workflows: [twice], logger: silentLogger() });
    const exporter = new InMemorySpanExporter();
    try {
      await r.worker({ pollIntervalMs: 20 }).start();
      trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
      const { id } = await r.submit('untraced-twice', {});
      const end = Date.now() + 30_000;
      let run = await r.store.getRun(id);
      while (run?.state !== 'succeeded' && Date.now() < end) {
        await new Promise((res) => setTimeout(res, 20));
        run = await r.store.getRun(id);
      }
      expect(run?.state).toBe('succeeded');
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
});
